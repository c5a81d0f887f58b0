"""The digest settings page: login required, one's own subscription only, CSRF enforced."""

from __future__ import annotations

from datetime import UTC, datetime

import time_machine
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from monitor.models import FRIDAY, MONDAY, Subscription, Task
from tests.monitor.digest.conftest import NOW, subscribe

URL = "/digest/"


def _form(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "is_active": "on",
        "weekday": str(FRIDAY),
        "hour": "9",
        "time_zone": "Europe/Paris",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def test_the_url_name_is_rw_digest_settings() -> None:
    assert reverse("rw-digest-settings") == URL


def test_anonymous_visitors_are_sent_to_the_login_page(client: Client, db: None) -> None:
    for response in (client.get(URL), client.post(URL, _form())):
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))
    assert not Subscription.objects.exists()


def test_a_user_without_a_subscription_sees_the_defaults_and_nothing_is_saved(
    client: Client, owner: User
) -> None:
    Task.objects.create(name="Summarise", slug="summarise", user_template="x")
    client.force_login(owner)
    response = client.get(URL)
    assert response.status_code == 200
    body = response.content.decode()
    assert "Digests go to <strong>owner@example.com</strong>" in body
    assert "Summarise" in body
    assert 'name="csrfmiddlewaretoken"' in body
    assert not Subscription.objects.exists()


def test_saving_creates_the_users_subscription_with_its_next_send_time(
    client: Client, owner: User
) -> None:
    task = Task.objects.create(name="Summarise", slug="summarise", user_template="x")
    client.force_login(owner)
    with time_machine.travel(NOW, tick=False):  # Monday 16 Nov 2026, 08:30 UTC
        response = client.post(URL, _form(tasks=[str(task.pk)]))
    assert response.status_code == 302
    sub = Subscription.objects.get(user=owner)
    assert (sub.weekday, sub.hour, sub.time_zone, sub.is_active) == (
        FRIDAY,
        9,
        "Europe/Paris",
        True,
    )
    assert list(sub.tasks.all()) == [task]
    # Friday 20 Nov, 09:00 in Paris (UTC+1 in November) is 08:00 UTC.
    assert sub.next_send_at == datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
    with time_machine.travel(NOW, tick=False):
        page = client.get(URL).content.decode()
    assert (
        'Next digest: <time datetime="2026-11-20T08:00:00+00:00">Fri 20 Nov 2026, 09:00 (Europe/Paris)'
        in page
    )


def test_turning_the_digest_off_clears_the_next_send_time(client: Client, owner: User) -> None:
    sub = subscribe(owner)
    client.force_login(owner)
    response = client.post(URL, _form(is_active=None))
    assert response.status_code == 302
    sub.refresh_from_db()
    assert sub.is_active is False
    assert sub.next_send_at is None


def test_a_time_zone_that_does_not_exist_is_refused(client: Client, owner: User) -> None:
    client.force_login(owner)
    response = client.post(URL, _form(time_zone="Mars/Olympus_Mons"))
    assert response.status_code == 200
    assert "is not an IANA time zone" in response.content.decode()
    assert not Subscription.objects.exists()


def test_an_hour_out_of_range_is_refused(client: Client, owner: User) -> None:
    client.force_login(owner)
    response = client.post(URL, _form(hour="24"))
    assert response.status_code == 200
    assert not Subscription.objects.exists()


def test_a_post_without_the_csrf_token_is_refused(owner: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post(URL, _form())
    assert response.status_code == 403
    assert not Subscription.objects.exists()


def test_an_outsider_sees_and_changes_only_their_own_subscription(
    client: Client, owner: User, outsider: User
) -> None:
    owners = subscribe(owner)
    client.force_login(outsider)
    body = client.get(URL).content.decode()
    assert "owner@example.com" not in body
    assert "Next digest" not in body  # the outsider has none yet
    client.post(URL, _form(weekday=str(MONDAY), hour="23", user=str(owner.pk)))
    owners.refresh_from_db()
    assert (owners.weekday, owners.hour, owners.time_zone) == (MONDAY, 8, "UTC")
    assert Subscription.objects.get(user=outsider).hour == 23


def test_saving_an_unchanged_schedule_keeps_a_pending_retry(client: Client, owner: User) -> None:
    sub = subscribe(owner)
    retry_at = datetime(2026, 11, 16, 8, 35, tzinfo=UTC)
    Subscription.objects.filter(pk=sub.pk).update(next_send_at=retry_at, send_attempts=1)
    client.force_login(owner)
    client.post(URL, _form(weekday=str(MONDAY), hour="8", time_zone="UTC"))
    sub.refresh_from_db()
    assert sub.next_send_at == retry_at
    assert sub.send_attempts == 1


def test_the_page_warns_a_user_without_an_email_address(client: Client, owner: User) -> None:
    owner.email = ""
    owner.save()
    client.force_login(owner)
    assert b"no digest can reach you" in client.get(URL).content


def test_the_navigation_links_to_the_digest_settings(client: Client, owner: User) -> None:
    client.force_login(owner)
    assert f'href="{URL}"'.encode() in client.get(URL).content
