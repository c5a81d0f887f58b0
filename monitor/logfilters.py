"""A logging filter that keeps secrets out of every log line.

The redaction itself is the probe engine's (probes.redact), so log lines and stored probe
error details are cleaned by the same rules: the exact values of secrets this process has
decrypted (registered by monitor.crypto), and patterns that look like credentials.
"""

from __future__ import annotations

import logging

from probes.redact import REDACTED, redact, register_secret

__all__ = ["REDACTED", "RedactSecrets", "redact", "register_secret"]


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
