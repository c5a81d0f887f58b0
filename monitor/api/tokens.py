"""API tokens: issued once, kept as a SHA-256 digest, checked in constant time.

A token is `rw_` and 43 URL-safe characters (256 random bits). The database keeps its first
PREFIX_LENGTH characters (to recognise it in the admin and to find its row) and the SHA-256
hex of the whole token; the token itself is shown once, when an admin creates it, and is
never stored, logged or shown again. A plain hash is enough: the token is random, not a
password, so there is nothing to guess slowly.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from monitor.models import ApiToken

TOKEN_PREFIX = "rw_"  # noqa: S105 (a marker, not a secret: it makes leaked tokens findable)
PREFIX_LENGTH = 10  # "rw_" and 7 random characters: shown in the admin, used to find the row
# last_used_at is for people ("is this token still used?"): a minute is precise enough, and
# a busy poller then costs one write a minute, not one per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class Issued:
    token: str  # shown once, never stored
    prefix: str
    digest: str


def digest_of(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue() -> Issued:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return Issued(token=token, prefix=token[:PREFIX_LENGTH], digest=digest_of(token))


def bearer(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (None: no bearer token)."""
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def authenticate(token: str, now: datetime) -> ApiToken | None:
    """The active ApiToken this token is, or None. Rows are found by the shown prefix; the
    digests are compared in constant time, so response times say nothing about how much of a
    guessed token was right."""
    if not token.startswith(TOKEN_PREFIX) or len(token) < PREFIX_LENGTH:
        return None
    digest = digest_of(token)
    found = None
    for candidate in ApiToken.objects.filter(prefix=token[:PREFIX_LENGTH], is_active=True):
        if hmac.compare_digest(candidate.digest, digest):
            found = candidate
    if found is not None:
        _touch(found, now)
    return found


def _touch(token: ApiToken, now: datetime) -> None:
    """Record the use, at most once per LAST_USED_RESOLUTION. The filter on the value read is
    an optimistic lock: of two requests arriving together, one writes."""
    seen = token.last_used_at
    if seen is not None and now - seen < LAST_USED_RESOLUTION:
        return
    ApiToken.objects.filter(pk=token.pk, last_used_at=seen).update(last_used_at=now)
    token.last_used_at = now
