"""Start-up refuses placeholder secrets; logins lock out; a login behind a TLS-terminating
proxy works; /metrics keeps its token; a provider's new origin drops its key."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from axes.models import AccessAttempt  # type: ignore[import-untyped]
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from monitor import logins
from monitor.crypto import KeyOriginMismatch
from monitor.models import Provider
from simulator.testing import free_port
from tests import support
from tests.monitor import factories as f

ROOT = support.ROOT
SETUP = "import django; django.setup(); print('started')"


def _start_with(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**env, "DJANGO_SETTINGS_MODULE": "monitor.settings"}
    return subprocess.run(
        [sys.executable, "-c", SETUP], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _example_value(name: str) -> str:
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.partition("=")[2]
    raise AssertionError(f"{name} is not in .env.example")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SECRET_KEY", _example_value("SECRET_KEY"), "SECRET_KEY is a placeholder"),
        ("SECRET_KEY", "x" * 49, "shorter than 50 characters"),
        ("FIELD_ENCRYPTION_KEYS", "change-me", "FIELD_ENCRYPTION_KEYS entry 1"),
    ],
)
def test_start_up_refuses_placeholder_or_short_secrets(name: str, value: str, message: str) -> None:
    result = _start_with({**os.environ, name: value})
    assert result.returncode != 0
    assert message in result.stderr
    assert value not in result.stderr or len(value) < 10  # the secret is not echoed back


def test_a_region_worker_starts_without_server_secrets_but_not_without_its_key() -> None:
    bare = {
        "PATH": os.environ["PATH"],
        "REDIS_URL": os.environ["REDIS_URL"],
        "RW_WORKER_ONLY": "true",
        "RW_REGION": "eu-west",
    }
    refused = _start_with(bare)
    assert refused.returncode != 0
    assert "needs RW_REGION (its region's slug) and RW_REGION_KEYS" in refused.stderr
    started = _start_with({**bare, "RW_REGION_KEYS": "k1:" + "s" * 43})
    assert started.returncode == 0, started.stderr


@pytest.mark.django_db
def test_repeated_wrong_passwords_lock_the_user_out_even_with_the_right_one(
    client: Client, owner: User, settings
) -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT):
        wrong = client.post("/accounts/login/", {"username": "owner", "password": "nope"})
        assert wrong.status_code in (200, 429)
    right = client.post("/accounts/login/", {"username": "owner", "password": "pw-owner-1"})
    assert right.status_code == 429
    assert "_auth_user_id" not in client.session
    page = right.content.decode()
    assert "Too many failed logins" in page
    assert f"locked after {settings.AXES_FAILURE_LIMIT} wrong passwords" in page
    # The admin's login is the same door.
    admin = client.post("/admin/login/", {"username": "owner", "password": "pw-owner-1"})
    assert admin.status_code == 429


@pytest.mark.django_db
def test_a_right_password_before_the_limit_logs_in(client: Client, owner: User, settings) -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        client.post("/accounts/login/", {"username": "owner", "password": "nope"})
    right = client.post("/accounts/login/", {"username": "owner", "password": "pw-owner-1"})
    assert right.status_code == 302
    assert client.session["_auth_user_id"] == str(owner.pk)


ATTACKER = {"REMOTE_ADDR": "203.0.113.7"}
OWNER_ADDRESS = {"REMOTE_ADDR": "198.51.100.20"}


@pytest.mark.django_db
def test_one_address_trying_many_user_names_is_throttled_and_stops_adding_rows(
    client: Client, owner: User
) -> None:
    for i in range(logins.ADDRESS_FAILURE_LIMIT):
        wrong = client.post(
            "/admin/login/", {"username": f"guess-{i}", "password": "nope"}, **ATTACKER
        )
        assert wrong.status_code == 200
    rows = AccessAttempt.objects.count()
    assert rows == logins.ADDRESS_FAILURE_LIMIT
    # Past the limit, even the right password from that address is refused, unchecked...
    for door in ("/admin/login/", "/accounts/login/"):
        refused = client.post(door, {"username": "owner", "password": "pw-owner-1"}, **ATTACKER)
        assert refused.status_code == 429
        assert "logins from your address failed" in refused.content.decode()
        assert "_auth_user_id" not in client.session
    for i in range(30):
        client.post("/admin/login/", {"username": f"more-{i}", "password": "x"}, **ATTACKER)
    assert AccessAttempt.objects.count() == rows  # ...and adds no row
    # Another address is not affected.
    right = client.post(
        "/accounts/login/", {"username": "owner", "password": "pw-owner-1"}, **OWNER_ADDRESS
    )
    assert right.status_code == 302
    assert client.session["_auth_user_id"] == str(owner.pk)


@pytest.mark.django_db
def test_behind_a_proxy_with_no_trusted_hop_the_address_throttle_is_off(
    client: Client, owner: User, settings
) -> None:
    # Every login then comes from the proxy's address: throttling it would lock everyone out.
    settings.BEHIND_TLS_PROXY = True
    for i in range(logins.ADDRESS_FAILURE_LIMIT):
        client.post("/admin/login/", {"username": f"guess-{i}", "password": "nope"})
    right = client.post("/accounts/login/", {"username": "owner", "password": "pw-owner-1"})
    assert right.status_code == 302


@pytest.mark.django_db
def test_wrong_passwords_for_a_user_from_one_address_do_not_lock_it_out_elsewhere(
    client: Client, owner: User, settings
) -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT + 2):
        client.post("/accounts/login/", {"username": "owner", "password": "nope"}, **ATTACKER)
    right = client.post(
        "/accounts/login/", {"username": "owner", "password": "pw-owner-1"}, **OWNER_ADDRESS
    )
    assert right.status_code == 302


@pytest.mark.django_db
def test_metrics_keep_their_token_when_pages_are_public(client: Client, settings) -> None:
    settings.PUBLIC_READONLY_PAGES = True
    settings.METRICS_BEARER_TOKEN = "scrape-token-0123456789"
    assert client.get("/").status_code == 200  # pages are public...
    assert client.get("/metrics").status_code == 401  # ...the metrics are not
    auth = {"HTTP_AUTHORIZATION": "Bearer scrape-token-0123456789"}
    assert client.get("/metrics", **auth).status_code == 200
    settings.METRICS_BEARER_TOKEN = ""
    assert client.get("/metrics").status_code == 200  # no token: the pages' rule


@pytest.mark.django_db
def test_a_new_origin_drops_the_stored_key_and_route_secret_headers() -> None:
    p = f.provider("acme", base_url="https://api.acme.example/v1")
    route = f.route(p, "m")
    route.set_secret_headers({"X-Gateway-Key": "gw-secret-0123456789"})
    route.save()
    p.base_url = "https://api.acme.example/v2"  # same origin: kept
    p.save()
    assert p.get_api_key() == "sk-acme-secret-0123456789"
    p.base_url = "https://attacker.example.net/v1"
    p.save()
    p.refresh_from_db()
    route.refresh_from_db()
    assert p.api_key_encrypted == ""
    assert route.secret_headers_encrypted == ""
    # A key entered together with the new origin is kept, bound to it.
    p.base_url = "https://api.acme.example/v1"
    p.set_api_key("sk-new-0123456789")
    p.save()
    assert Provider.objects.get(pk=p.pk).get_api_key() == "sk-new-0123456789"
    # A stored key copied onto another origin behind the model's back does not open there.
    Provider.objects.filter(pk=p.pk).update(base_url="https://attacker.example.net/v1")
    with pytest.raises(KeyOriginMismatch):
        Provider.objects.get(pk=p.pk).get_api_key()


@pytest.mark.django_db
def test_the_admin_says_the_key_must_be_entered_again(client: Client, settings) -> None:
    admin = User.objects.create_superuser("root", "root@example.com", "pw-root-1")
    client.force_login(admin)
    p = f.provider("acme", base_url="https://api.acme.example/v1")
    form = {
        "name": p.name,
        "slug": p.slug,
        "base_url": "https://other.example.org/v1",
        "wire_format": "openai",
        "extra_headers": "{}",
        "is_active": "on",
    }
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = True  # these example hosts do not resolve
    response = client.post(f"/admin/monitor/provider/{p.pk}/change/", form, follow=True)
    assert response.status_code == 200
    assert "enter the key again" in response.content.decode()
    assert Provider.objects.get(pk=p.pk).api_key_encrypted == ""


@pytest.fixture
def web_behind_proxy(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    env = support.child_env(
        connection.settings_dict,
        ALLOWED_HOSTS="routewatch.example.com",
        SITE_URL="https://routewatch.example.com",
        BEHIND_TLS_PROXY="true",
        SECURE_HSTS_SECONDS="3600",
    )
    proc = support.start(
        [sys.executable, "-m", "gunicorn", "monitor.wsgi", "--bind", f"127.0.0.1:{port}"],
        env,
        tmp_path / "web.log",
    )
    try:
        assert support.wait_until(lambda: _get(port, "/healthz")[0] == 200, timeout_s=30)
        yield port
    finally:
        support.stop(proc)


PROXY_HEADERS = {"Host": "routewatch.example.com", "X-Forwarded-Proto": "https"}


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status, response.headers
    except OSError:
        return 0, None
    finally:
        conn.close()


@pytest.mark.django_db(transaction=True)
def test_a_login_behind_a_tls_terminating_proxy_works(web_behind_proxy: int, owner: User) -> None:
    status, headers = _get(web_behind_proxy, "/accounts/login/", PROXY_HEADERS)
    assert status == 200
    assert headers["Strict-Transport-Security"].startswith("max-age=3600")
    cookie = SimpleCookie()
    for value in headers.get_all("Set-Cookie") or []:
        cookie.load(value)
    assert cookie["csrftoken"]["secure"]
    token = cookie["csrftoken"].value
    conn = http.client.HTTPConnection("127.0.0.1", web_behind_proxy, timeout=10)
    conn.request(
        "POST",
        "/accounts/login/",
        body=urlencode(
            {"username": "owner", "password": "pw-owner-1", "csrfmiddlewaretoken": token}
        ),
        headers={
            **PROXY_HEADERS,
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"csrftoken={token}",
            "Origin": "https://routewatch.example.com",
            "Referer": "https://routewatch.example.com/accounts/login/",
        },
    )
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status == 302, response.status
    session = SimpleCookie()
    for value in response.headers.get_all("Set-Cookie") or []:
        session.load(value)
    assert session["sessionid"]["secure"]


@pytest.mark.django_db(transaction=True)
def test_every_database_connection_runs_without_the_jit_compiler() -> None:
    """JIT compiles a query whose cost estimate passes jit_above_cost before running it: tens
    to hundreds of ms on pages whose queries take a few (monitor.apps.without_jit). The
    server's own default stays on; each of our connections, new or reopened, turns it off."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT reset_val FROM pg_settings WHERE name = 'jit'")
        assert cursor.fetchone()[0] == "on", "the server default, which our sessions override"
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "off"
    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "off"
