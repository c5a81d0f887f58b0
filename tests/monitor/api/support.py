"""Helpers for the read API's tests: issue a token the way the admin does, and call the API."""

from __future__ import annotations

from typing import Any

from django.test import Client

from monitor.api import tokens
from monitor.models import ApiToken


def make_token(name: str = "gateway", *, active: bool = True) -> str:
    issued = tokens.issue()
    ApiToken.objects.create(name=name, prefix=issued.prefix, digest=issued.digest, is_active=active)
    return issued.token


def get(client: Client, url: str, token: str | None, **headers: str) -> Any:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.get(url, headers=headers)
