"""Every call of the read API needs an active API token; nothing else opens it (not a session,
not PUBLIC_READONLY_PAGES); it only reads. Its description (openapi.json, and the docs page
that renders it) also opens to a logged-in user's session."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from monitor.api import tokens
from monitor.models import ApiToken
from probes.redact import REDACTED, redact
from tests.monitor import factories as f
from tests.monitor.api.support import get, make_token


@pytest.fixture
def urls(db: None) -> list[str]:
    p = f.provider()
    r = f.route(p, "m1")
    t = f.task("qa", [r], [f.region("eu-west")])
    return [
        reverse("rw-api-tasks"),
        reverse("rw-api-routes"),
        reverse("rw-api-task-route", args=[t.slug]),
        reverse("rw-api-task-route", args=[t.slug]) + "?region=eu-west",
        reverse("rw-api-openapi"),
    ]


def _assert_refused(response, code: str) -> None:
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer ")
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"] == code
    assert "ETag" not in response


def test_it_refuses_a_request_without_a_token(client: Client, urls: list[str]) -> None:
    for url in urls:
        _assert_refused(get(client, url, None), "token_required")


def test_it_refuses_a_wrong_token(client: Client, urls: list[str]) -> None:
    real = make_token()
    wrong = [
        real[:-1] + ("A" if real[-1] != "A" else "B"),  # the right prefix, one character off
        real + "x",
        "rw_" + "x" * 43,
        "sk-not-ours-0123456789",
        real[: tokens.PREFIX_LENGTH],
    ]
    for url in urls:
        for token in wrong:
            response = get(client, url, token)
            _assert_refused(response, "invalid_token")
            assert 'error="invalid_token"' in response["WWW-Authenticate"]
    # The same header with the real token passes, so the refusals are about the token.
    assert all(get(client, url, real).status_code == 200 for url in urls)


def test_it_refuses_other_schemes_and_a_token_in_the_query(client: Client, urls: list[str]) -> None:
    token = make_token()
    url = urls[0]
    _assert_refused(client.get(url, headers={"Authorization": f"Token {token}"}), "token_required")
    _assert_refused(client.get(url, headers={"Authorization": token}), "token_required")
    _assert_refused(client.get(f"{url}?token={token}"), "token_required")


def test_it_refuses_a_revoked_token(client: Client, urls: list[str]) -> None:
    token = make_token()
    assert get(client, urls[0], token).status_code == 200
    ApiToken.objects.update(is_active=False)
    for url in urls:
        _assert_refused(get(client, url, token), "invalid_token")


def test_a_session_or_public_pages_never_open_the_api_calls(
    client: Client, urls: list[str], teammate: User, django_user_model: type[User]
) -> None:
    description = reverse("rw-api-openapi")
    calls = [url for url in urls if url != description]
    with override_settings(PUBLIC_READONLY_PAGES=True):
        for url in urls:
            _assert_refused(get(client, url, None), "token_required")
        assert client.get(reverse("rw-api-docs")).status_code == 302  # to the login
        admin = django_user_model.objects.create_superuser("root", "r@example.com", "pw-root-1")
        for user in (teammate, admin):
            client.force_login(user)
            for url in calls:
                _assert_refused(get(client, url, None), "token_required")
            # The description, and the page that renders it, open to a logged-in reader.
            response = get(client, description, None)
            assert response.status_code == 200
            assert response.json()["openapi"] == "3.1.0"
            assert "Cookie" in response["Vary"]
            docs = client.get(reverse("rw-api-docs"))
            assert docs.status_code == 200
            assert "swagger-ui-bundle" in docs.content.decode()


def test_it_only_reads(client: Client, urls: list[str]) -> None:
    token = make_token()
    headers = {"Authorization": f"Bearer {token}"}
    for url in urls:
        for method in ("post", "put", "patch", "delete"):
            response = getattr(client, method)(url, headers=headers)
            assert response.status_code == 405, (method, url)
            assert response["Allow"] == "GET, HEAD"
            assert response.json()["error"] == "method_not_allowed"
        # Even without a token, and without a CSRF token: 405, not 403.
        assert Client(enforce_csrf_checks=True).post(url).status_code == 405
        assert client.head(url, headers=headers).status_code == 200


def test_only_the_digest_and_prefix_of_a_token_are_stored(db: None) -> None:
    token = make_token()
    row = ApiToken.objects.get()
    assert token.startswith("rw_")
    assert len(token) >= 40
    assert row.digest == hashlib.sha256(token.encode()).hexdigest()
    assert row.prefix == token[: tokens.PREFIX_LENGTH]
    stored = " ".join(str(v) for v in ApiToken.objects.values().get().values())
    assert token not in stored
    assert token[tokens.PREFIX_LENGTH :] not in stored


def test_last_used_is_written_at_most_once_a_minute(client: Client, urls: list[str]) -> None:
    token = make_token()
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        get(client, urls[0], token)
    assert ApiToken.objects.get().last_used_at == start
    # The token's row, then the tasks with their regions and routes: reads only, no write.
    with (
        time_machine.travel(start + timedelta(seconds=59), tick=False),
        CaptureQueriesContext(connection) as queries,
    ):
        assert get(client, urls[0], token).status_code == 200
    statements = [q["sql"].lstrip().split()[0].upper() for q in queries.captured_queries]
    assert statements
    assert set(statements) == {"SELECT"}, statements
    assert ApiToken.objects.get().last_used_at == start
    with time_machine.travel(start + timedelta(seconds=61), tick=False):
        get(client, urls[0], token)
    assert ApiToken.objects.get().last_used_at == start + timedelta(seconds=61)


def test_a_token_in_a_log_line_is_redacted() -> None:
    token = tokens.issue().token
    line = redact(f"client sent {token} in the query")
    assert token not in line
    assert line == f"client sent {REDACTED} in the query"
    # Only token-shaped words: ordinary identifiers stay.
    assert redact("rw_hour_strip_write") == "rw_hour_strip_write"
