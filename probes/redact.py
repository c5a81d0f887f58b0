"""The one redactor for secrets: probe error details and every log line (monitor.logfilters).

Two nets: the exact values of secrets we know (keys and secret headers passed in, and values
registered by the process that decrypted them), and patterns that look like credentials
wherever they come from (Bearer/Basic tokens, sk-... keys, api-key / x-api-key /
authorization headers, key= query parameters).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

REDACTED = "[redacted]"
# A registered secret shorter than this would redact ordinary words.
MIN_SECRET_LENGTH = 6

_known: set[str] = set()
_lock = threading.Lock()
_PATTERNS = [
    re.compile(r"(?i)(\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(
        r"(?i)((?:x-api-key|x-goog-api-key|api[_-]?key|authorization|ocp-apim-subscription-key)"
        r"[\"']?\s*[:=]\s*[\"']?)(?!(?:bearer|basic)\s|\[redacted\])[^\s\"',}]{6,}"
    ),
    re.compile(r"(?i)([?&](?:key|api[_-]?key|access_token|token|sig)=)[^&\s\"'#]{6,}"),
    re.compile(r"()\bsk-[A-Za-z0-9_-]{8,}"),
    # Routewatch's own API tokens (monitor.api.tokens).
    re.compile(r"()\brw_[A-Za-z0-9_-]{40,}"),
]


def register_secret(value: str) -> None:
    """Redact this exact value from everything redacted in this process from now on."""
    if len(value) >= MIN_SECRET_LENGTH:
        with _lock:
            _known.add(value)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without the given secrets, the registered ones, or anything credential-shaped."""
    for secret in (*secrets, *tuple(_known)):
        # Longer than 3 characters: replacing "a" everywhere would hide the text, not a key.
        if len(secret) > 3 and secret in text:
            text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text
