"""The one fixed tokenizer: tiktoken's o200k_base, loaded from the file shipped in probes/data.

tiktoken downloads its encodings from the internet on first use; this machine and many
deployments cannot. `data/o200k_base.tiktoken.gz` is the official file (its sha256 is checked
against the hash tiktoken itself expects), converted from the npm package js-tiktoken by
`data/convert_js_tiktoken.py`. Loading takes about a second: call it outside timed paths.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import threading
from functools import cache
from pathlib import Path

import tiktoken

from probes.errors import EngineError

DATA = Path(__file__).resolve().parent / "data" / "o200k_base.tiktoken.gz"
EXPECTED_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
_lock = threading.Lock()


class TokenizerError(EngineError):
    """The shipped o200k_base file is missing or not the official one."""


def _ranks() -> dict[bytes, int]:
    try:
        raw = gzip.decompress(DATA.read_bytes())
    except OSError as exc:
        raise TokenizerError(f"cannot read {DATA}: {exc}") from None
    if hashlib.sha256(raw).hexdigest() != EXPECTED_SHA256:
        raise TokenizerError(f"{DATA} is not the official o200k_base file (hash mismatch)")
    ranks = {}
    for line in raw.splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


@cache
def encoding() -> tiktoken.Encoding:
    import tiktoken_ext.openai_public as public

    with _lock:
        ranks = _ranks()
        original = public.load_tiktoken_bpe
        # Reuse tiktoken's own definition of o200k_base (pattern, special tokens) with our file.
        public.load_tiktoken_bpe = lambda *args, **kwargs: ranks
        try:
            spec = public.o200k_base()
        finally:
            public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**spec)


def count_tokens(text: str) -> int:
    return len(encoding().encode(text, disallowed_special=()))
