from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from tests.monitor.conftest import World

PAGES = ["rw-overview", "rw-regions", "rw-log", "rw-races"]


def _urls(world: World) -> list[str]:
    route = world.routes["fast-small"]
    return [
        *(reverse(name) for name in PAGES),
        reverse("rw-task", args=[world.task.slug]),
        reverse("rw-route", args=[route.pk]),
        reverse("rw-export", args=["csv"]),
        reverse("rw-export", args=["json"]),
    ]


def test_it_sends_anonymous_readers_to_the_login_page(client: Client, empty_world: World) -> None:
    for url in _urls(empty_world):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login")), url


def test_it_lets_anonymous_readers_in_when_read_only_pages_are_public(
    client: Client, empty_world: World
) -> None:
    with override_settings(PUBLIC_READONLY_PAGES=True):
        for url in _urls(empty_world):
            assert client.get(url).status_code == 200, url
        assert client.get(reverse("rw-metrics")).status_code == 200
        # The admin is never public.
        assert client.get(reverse("admin:index")).status_code == 302


def test_it_refuses_a_deactivated_user(client: Client, empty_world: World, teammate: User) -> None:
    client.force_login(teammate)
    teammate.is_active = False
    teammate.save()
    for url in _urls(empty_world):
        assert client.get(url).status_code == 302, url


def test_it_shows_pages_to_a_teammate_but_the_admin_link_only_to_staff(
    client: Client, empty_world: World, teammate: User, staff: User
) -> None:
    client.force_login(teammate)
    for url in _urls(empty_world):
        assert client.get(url).status_code == 200, url
    admin_link = f'href="{reverse("admin:index")}"'.encode()
    assert admin_link not in client.get(reverse("rw-overview")).content
    assert client.get(reverse("admin:index")).status_code == 302
    client.force_login(staff)
    assert admin_link in client.get(reverse("rw-overview")).content


def test_it_answers_404_for_an_unknown_task_route_or_export_format(
    client: Client, empty_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    assert client.get(reverse("rw-task", args=["nope"])).status_code == 404
    assert client.get(reverse("rw-route", args=[999999])).status_code == 404
    assert client.get(reverse("rw-export", args=["xml"])).status_code == 404


def test_it_refuses_a_post_without_the_csrf_token(teammate: User) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(teammate)
    assert client.post(reverse("logout")).status_code == 403


def test_it_accepts_a_post_carrying_the_csrf_token_in_the_htmx_header(
    teammate: User, empty_world: World
) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(teammate)
    page = client.get(reverse("rw-overview")).content.decode()
    # base.html puts the token in hx-headers on <body>; htmx sends it on every request.
    token = page.split('"x-csrftoken": "', 1)[1].split('"', 1)[0]
    response = client.post(reverse("logout"), headers={"X-CSRFToken": token, "HX-Request": "true"})
    assert response.status_code == 302


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", "Basic c2NyYXBlcg=="])
def test_metrics_refuses_an_anonymous_scraper_without_the_token(
    client: Client, empty_world: World, header: str | None
) -> None:
    with override_settings(METRICS_BEARER_TOKEN="s3cret-scrape-token"):
        headers = {"Authorization": header} if header else {}
        response = client.get(reverse("rw-metrics"), headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_metrics_lets_a_scraper_in_with_the_bearer_token(
    client: Client, empty_world: World
) -> None:
    with override_settings(METRICS_BEARER_TOKEN="s3cret-scrape-token"):
        response = client.get(
            reverse("rw-metrics"), headers={"Authorization": "Bearer s3cret-scrape-token"}
        )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")


def test_metrics_without_a_configured_token_refuses_any_bearer(
    client: Client, empty_world: World
) -> None:
    with override_settings(METRICS_BEARER_TOKEN=""):
        response = client.get(reverse("rw-metrics"), headers={"Authorization": "Bearer "})
    assert response.status_code == 401


def test_no_page_renders_a_provider_api_key(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    keys = [b"sk-test-fastchip", b"sk-test-claudish", b"sk-test-limited"]
    for url in [*_urls(probed_world), reverse("rw-metrics")]:
        body = (
            b"".join(client.get(url).streaming_content)  # type: ignore[attr-defined]
            if "export" in url
            else client.get(url).content
        )
        assert not any(k in body for k in keys), url
