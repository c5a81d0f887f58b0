"""Which request headers a provider may keep in plain text.

A provider's extra headers are stored, shown in the admin and sent to region workers as they
are, and kept when its base URL moves to another origin. A credential belongs in a route's
secret headers instead: encrypted at rest, re-encrypted for each region, opened only for the
origin it was entered for, and dropped when the provider's origin changes
(monitor.pipeline.signing)."""

from __future__ import annotations

import re

# Authorization, Proxy-Authorization, x-api-key, api-key, X-Goog-Api-Key, Cookie, X-Auth-Token...
CREDENTIAL_NAME = re.compile(r"key|token|secret|auth|cookie|password|passwd", re.IGNORECASE)


def credential_names(headers: object) -> list[str]:
    """The header names in `headers` (a JSON object) that look like credentials."""
    if not isinstance(headers, dict):
        return []
    return [name for name in headers if isinstance(name, str) and CREDENTIAL_NAME.search(name)]


def extra_headers_error(headers: object) -> str | None:
    """Why these cannot be a provider's plain-text extra headers, or None. Names only: a
    value is never quoted back."""
    names = credential_names(headers)
    if not names:
        return None
    return (
        f"{', '.join(sorted(names))} looks like a credential: extra headers are stored and sent "
        "in plain text. Put it in the secret headers of this provider's routes (Routes, "
        "secret headers), which are encrypted and bound to the provider's origin."
    )
