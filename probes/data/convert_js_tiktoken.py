"""Convert js-tiktoken's compressed o200k_base ranks to the standard .tiktoken file."""

import gzip
import hashlib
import json
import sys

with open(sys.argv[1]) as fh:
    src = fh.read()
body = src[src.index("{") : src.rindex("}") + 1]
data = json.loads(body)
lines = []
for line in data["bpe_ranks"].split("\n"):
    parts = line.split(" ")
    offset = int(parts[1])
    for i, tok in enumerate(parts[2:]):
        lines.append(f"{tok} {offset + i}\n")
out = "".join(lines).encode()
print("sha256", hashlib.sha256(out).hexdigest(), "tokens", len(lines), file=sys.stderr)
with gzip.open(sys.argv[2], "wb", compresslevel=9) as fh:
    fh.write(out)
