"""A logging filter that keeps secrets out of every log line.

The redaction itself is the probe engine's (probes.redact), so log lines and stored probe
error details are cleaned by the same rules: the exact values of secrets this process has
decrypted (registered by monitor.crypto), and patterns that look like credentials.

settings.LOGGING puts the filter on our console handler, but the handlers Django configures
itself keep theirs: the `django` logger's console handler (which prints when DEBUG is on,
before the record reaches ours), its mail to ADMINS, and `django.server`'s request lines.
`redact_every_handler` (run when the app is ready) puts the filter on every one of them.
"""

from __future__ import annotations

import logging

from probes.redact import REDACTED, redact, register_secret

__all__ = ["REDACTED", "RedactSecrets", "redact", "redact_every_handler", "register_secret"]


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


def redact_every_handler() -> int:
    """Put RedactSecrets on every handler of every logger configured so far (the root's and
    Django's own); returns how many handlers had to get it."""
    loggers = [logging.getLogger()] + [
        logger
        for logger in list(logging.Logger.manager.loggerDict.values())
        if isinstance(logger, logging.Logger)
    ]
    added = 0
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, RedactSecrets) for f in handler.filters):
                handler.addFilter(RedactSecrets())
                added += 1
    return added
