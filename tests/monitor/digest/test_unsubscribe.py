"""The signed unsubscribe link: a confirm form on GET, unsubscribe on POST, refused when
tampered or expired."""

from __future__ import annotations

from datetime import timedelta

import time_machine
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from monitor.digest import sending
from monitor.models import Subscription
from tests.monitor.digest.conftest import NOW, subscribe


def _url(sub: Subscription) -> str:
    return reverse("rw-digest-unsubscribe", args=[sending.unsubscribe_token(sub)])


def test_following_the_link_shows_a_confirm_form_and_changes_nothing(
    client: Client, owner: User
) -> None:
    sub = subscribe(owner)
    response = client.get(_url(sub))
    assert response.status_code == 200
    assert b"Unsubscribe from the weekly digest?" in response.content
    assert b'method="post"' in response.content
    sub.refresh_from_db()
    assert sub.is_active is True
    assert sub.next_send_at is not None


def test_posting_the_confirm_form_unsubscribes_without_a_login(owner: User) -> None:
    sub = subscribe(owner)
    client = Client(enforce_csrf_checks=True)
    response = client.post(_url(sub))
    assert response.status_code == 200
    assert b"You are unsubscribed" in response.content
    sub.refresh_from_db()
    assert sub.is_active is False
    assert sub.next_send_at is None


def test_a_tampered_link_is_refused(client: Client, owner: User, teammate: User) -> None:
    sub = subscribe(owner)
    other = subscribe(teammate)
    token = sending.unsubscribe_token(sub)
    # Someone swaps in another subscription's id but keeps the signature.
    forged = f"{other.pk}:{token.split(':', 1)[1]}"
    for bad in (forged, token[:-2] + "xx", "garbage"):
        url = reverse("rw-digest-unsubscribe", args=[bad])
        assert client.get(url).status_code == 400
        response = client.post(url)
        assert response.status_code == 400
        assert b"not valid" in response.content
    sub.refresh_from_db()
    other.refresh_from_db()
    assert sub.is_active
    assert other.is_active


def test_an_expired_link_is_refused(client: Client, owner: User, settings: object) -> None:
    with time_machine.travel(NOW, tick=False):
        sub = subscribe(owner)
        url = _url(sub)
    max_age = timedelta(days=settings.DIGEST_UNSUBSCRIBE_MAX_AGE_DAYS)  # type: ignore[attr-defined]
    with time_machine.travel(NOW + max_age - timedelta(minutes=1), tick=False):
        assert client.get(url).status_code == 200
    with time_machine.travel(NOW + max_age + timedelta(minutes=1), tick=False):
        assert client.get(url).status_code == 400
        response = client.post(url)
    assert response.status_code == 400
    assert b"expired" in response.content
    sub.refresh_from_db()
    assert sub.is_active is True


def test_the_one_click_post_unsubscribes_without_a_session_or_csrf_token(owner: User) -> None:
    sub = subscribe(owner)
    client = Client(enforce_csrf_checks=True)
    response = client.post(
        _url(sub),
        "List-Unsubscribe=One-Click",
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 200
    sub.refresh_from_db()
    assert sub.is_active is False


def test_unsubscribing_twice_is_harmless(owner: User) -> None:
    sub = subscribe(owner)
    client = Client()
    assert client.post(_url(sub)).status_code == 200
    assert client.post(_url(sub)).status_code == 200
    sub.refresh_from_db()
    assert sub.is_active is False
