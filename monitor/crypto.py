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
