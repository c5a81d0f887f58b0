"""Tiny helpers that read settings from environment variables.

Every helper names the variable in its error, so a malformed value stops start-up with a
message that says what to fix. `NAME_FILE` (a path) is accepted wherever a secret is read,
for Docker/Kubernetes secrets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class SettingsError(Exception):
    """A setting from the environment is missing or malformed."""


def _raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    return (os.environ if env is None else env).get(name)


def envstr(name: str, default: str = "", env: Mapping[str, str] | None = None) -> str:
    value = _raw(name, env)
    return default if value is None else value


def envbool(name: str, default: bool = False, env: Mapping[str, str] | None = None) -> bool:
    value = _raw(name, env)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise SettingsError(
        f"{name} must be a boolean (true/false, 1/0, yes/no, on/off), got {value!r}"
    )


def envint(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    value = _raw(name, env)
    if value is None or value.strip() == "":
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {value!r}") from None
    if minimum is not None and number < minimum:
        raise SettingsError(f"{name} must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise SettingsError(f"{name} must be at most {maximum}, got {number}")
    return number


def envlist(name: str, default: list[str], env: Mapping[str, str] | None = None) -> list[str]:
    value = _raw(name, env)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def envsecret(name: str, default: str = "", env: Mapping[str, str] | None = None) -> str:
    """A secret from NAME, or from the file that NAME_FILE points to."""
    path = _raw(f"{name}_FILE", env)
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise SettingsError(
                f"{name}_FILE points to {path!r}, which cannot be read: {exc.strerror}"
            ) from None
    return envstr(name, default, env)
