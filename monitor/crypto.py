"""Encryption at rest for provider API keys (Fernet, with rotation through MultiFernet).

FIELD_ENCRYPTION_KEYS is a comma-separated list: the first key encrypts, every key decrypts.
To rotate: put a new key first, keep the old ones, run `manage.py rotate_api_keys`, then drop
the old keys. A token that no configured key opens raises ApiKeyDecryptionError: we never
hand ciphertext back as if it were a key.
"""

from __future__ import annotations

import base64
import binascii
from functools import cache
from urllib.parse import urlsplit

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from monitor.logfilters import register_secret


class ApiKeyDecryptionError(Exception):
    """The stored API key cannot be decrypted with any configured FIELD_ENCRYPTION_KEYS."""


def fernet_key_is_valid(key: str) -> bool:
    try:
        return len(base64.urlsafe_b64decode(key.encode())) == 32
    except (binascii.Error, ValueError):
        return False


@cache
def _multifernet(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(k.encode()) for k in keys])


def _configured() -> MultiFernet:
    from django.conf import settings

    return _multifernet(tuple(settings.FIELD_ENCRYPTION_KEYS))


def encrypt_secret(plaintext: str) -> str:
    return _configured().encrypt(plaintext.encode()).decode()


def decrypt_secret(token: str) -> str:
    try:
        plaintext = _configured().decrypt(token.encode()).decode()
    except InvalidToken:
        raise ApiKeyDecryptionError(
            "stored API key cannot be decrypted with FIELD_ENCRYPTION_KEYS "
            "(was a key removed before `manage.py rotate_api_keys` ran?)"
        ) from None
    register_secret(plaintext)
    return plaintext


def rotate_secret(token: str) -> str:
    """Re-encrypt a token with the primary key (raises if no configured key opens it)."""
    try:
        return _configured().rotate(token.encode()).decode()
    except InvalidToken:
        raise ApiKeyDecryptionError("stored API key cannot be decrypted for rotation") from None


# --- secrets bound to the origin they may be sent to -----------------------------------------
#
# A provider's API key (and a route's secret headers) is encrypted together with the origin
# (scheme://host:port) of the provider it was entered for. Whoever opens it checks that origin
# against the URL it is about to send it to, so neither an admin who repoints a provider nor a
# message that names another base URL can send the key anywhere else.

_BOUND = "rw-bound:v1\n"


class KeyOriginMismatch(ApiKeyDecryptionError):
    """The secret was entered for another origin than the one it would be sent to."""


def origin_of(url: str) -> str:
    """scheme://host:port of a URL, the port always written, the host lower-cased."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        port = 0
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"


def bind(origin: str, secret: str) -> str:
    return f"{_BOUND}{origin}\n{secret}"


def unbind(plaintext: str) -> tuple[str | None, str]:
    """(origin, secret) of a bound plaintext; (None, plaintext) for a token made before
    secrets were bound (the beat treats those as bound to the provider's current origin)."""
    if not plaintext.startswith(_BOUND):
        return None, plaintext
    origin, _, secret = plaintext[len(_BOUND) :].partition("\n")
    return origin, secret


def encrypt_bound(origin: str, secret: str) -> str:
    return encrypt_secret(bind(origin, secret))


def decrypt_bound(token: str, url: str, *, accept_unbound: bool = False) -> str:
    """The secret in a stored token, if it may be sent to `url`'s origin; raises
    KeyOriginMismatch otherwise (and ApiKeyDecryptionError when no key opens it)."""
    try:
        plaintext = _configured().decrypt(token.encode()).decode()
    except InvalidToken:
        raise ApiKeyDecryptionError(
            "stored API key cannot be decrypted with FIELD_ENCRYPTION_KEYS "
            "(was a key removed before `manage.py rotate_api_keys` ran?)"
        ) from None
    origin, secret = unbind(plaintext)
    register_secret(secret)
    if origin is None and accept_unbound:
        return secret
    if origin != origin_of(url):
        raise KeyOriginMismatch(
            "the stored secret was entered for another origin than the provider's base URL; "
            "enter it again"
        )
    return secret
