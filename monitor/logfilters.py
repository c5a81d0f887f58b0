"""A logging filter that keeps secrets out of every log line.

Two nets: patterns that look like credentials (Bearer tokens, sk-... keys, x-api-key headers),
and the exact values of API keys this process has decrypted (registered by monitor.crypto).
"""

from __future__ import annotations

import logging
import re
import threading

_known: set[str] = set()
_lock = threading.Lock()
_PATTERNS = [
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(
        r"(?i)((?:x-api-key|api[_-]?key|authorization)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]{6,}"
    ),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
]
REDACTED = "[redacted]"


def register_secret(value: str) -> None:
    if len(value) >= 6:
        with _lock:
            _known.add(value)


def redact(text: str) -> str:
    for secret in tuple(_known):
        if secret in text:
            text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
    return text


class RedactSecrets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if record.exc_info and record.exc_info[1] is not None:
            # Render the traceback now, redacted, so the handler does not print the raw one.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        return True
