"""API tokens are created in the admin: generated there, shown once, stored as a digest."""

from __future__ import annotations

import hashlib
import re

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from monitor.models import ApiToken
from tests.dashboard.api_support import get

TOKEN = re.compile(r"rw_[A-Za-z0-9_-]{40,}")


def test_adding_a_token_shows_it_once_and_keeps_only_its_digest(
    admin_client: Client, client: Client
) -> None:
    response = admin_client.post(
        reverse("admin:monitor_apitoken_add"),
        {"name": "checkout gateway", "is_active": "on"},
        follow=True,
    )
    assert response.status_code == 200
    shown = TOKEN.findall(response.content.decode())
    assert len(set(shown)) == 1
    token = shown[0]
    row = ApiToken.objects.get()
    assert row.name == "checkout gateway"
    assert row.digest == hashlib.sha256(token.encode()).hexdigest()
    assert row.prefix == token[:10]
    # Never again: not on the list, not on the change page, not on a second visit.
    for url in (
        reverse("admin:monitor_apitoken_changelist"),
        reverse("admin:monitor_apitoken_change", args=[row.pk]),
        reverse("admin:monitor_apitoken_changelist"),
    ):
        page = admin_client.get(url).content.decode()
        assert token not in page
        assert row.prefix in page
        assert row.digest not in page
    # The token works, and saving the row again neither shows nor changes it.
    assert get(client, reverse("rw-api-tasks"), token).status_code == 200
    admin_client.post(
        reverse("admin:monitor_apitoken_change", args=[row.pk]), {"name": "renamed"}, follow=True
    )
    row.refresh_from_db()
    assert (row.name, row.is_active) == ("renamed", False)
    assert row.digest == hashlib.sha256(token.encode()).hexdigest()
    assert get(client, reverse("rw-api-tasks"), token).status_code == 401


def test_each_token_is_new(admin_client: Client) -> None:
    shown = set()
    for name in ("a", "b"):
        response = admin_client.post(
            reverse("admin:monitor_apitoken_add"), {"name": name, "is_active": "on"}, follow=True
        )
        shown.update(TOKEN.findall(response.content.decode()))
    assert len(shown) == 2
    assert ApiToken.objects.values("digest").distinct().count() == 2


def test_only_staff_reach_the_token_admin(client: Client, teammate: User) -> None:
    client.force_login(teammate)
    assert client.get(reverse("admin:monitor_apitoken_changelist")).status_code == 302
    assert client.post(reverse("admin:monitor_apitoken_add"), {"name": "x"}).status_code == 302
    assert not ApiToken.objects.exists()
