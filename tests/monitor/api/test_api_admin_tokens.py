"""API tokens are created in the admin: generated there, shown once, stored as a digest."""

from __future__ import annotations

import hashlib
import re

from django.contrib.auth.models import User
from django.contrib.messages.storage.cookie import CookieStorage
from django.test import Client, RequestFactory
from django.urls import reverse

from monitor.models import ApiToken
from tests.monitor.api.support import get

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


def test_the_token_is_kept_in_no_cookie_and_no_session(admin_client: Client) -> None:
    response = admin_client.post(
        reverse("admin:monitor_apitoken_add"), {"name": "gateway", "is_active": "on"}
    )
    row = ApiToken.objects.get()
    # Django's messages cookie is signed, not encrypted: anyone holding it can read it.
    kept = []
    for morsel in response.cookies.values():
        kept.append(morsel.value)
        if morsel.key == CookieStorage.cookie_name and morsel.value:
            request = RequestFactory().get("/")
            request.COOKIES[morsel.key] = morsel.value
            kept += [str(m) for m in CookieStorage(request)]
    kept.append(repr(dict(admin_client.session.items())))
    found = [t for value in kept for t in TOKEN.findall(value)]
    assert row.digest not in {hashlib.sha256(t.encode()).hexdigest() for t in found}
    # Shown on the answer to the POST itself, which no cache keeps.
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    token = TOKEN.findall(response.content.decode())[0]
    assert row.digest == hashlib.sha256(token.encode()).hexdigest()
    assert token not in admin_client.get(reverse("admin:index")).content.decode()


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
