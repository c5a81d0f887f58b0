from __future__ import annotations

import re

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse


def test_the_overview_needs_a_login(client: Client, db: None) -> None:
    response = client.get(reverse("rw-overview"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_a_logged_in_user_sees_the_overview_and_its_empty_state(
    client: Client, teammate: User
) -> None:
    client.force_login(teammate)
    response = client.get(reverse("rw-overview"))
    assert response.status_code == 200
    assert b"No tasks configured" in response.content
    assert b"No probes yet" in response.content
    assert b"The scheduler has not ticked" in response.content
    assert b"vendor/htmx-2.0.11/htmx.min" in response.content
    assert b"vendor/chartjs-4.6.1/chart.umd.min" in response.content


def test_an_htmx_refresh_gets_only_the_fragment(client: Client, teammate: User) -> None:
    client.force_login(teammate)
    response = client.get(reverse("rw-overview"), headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert b"<html" not in response.content
    assert b"No tasks configured" in response.content


def test_pages_carry_a_strict_content_security_policy(client: Client, db: None) -> None:
    response = client.get(reverse("login"))
    csp = response["Content-Security-Policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-eval" not in csp


def test_healthz_answers_without_login(client: Client, db: None) -> None:
    response = client.get(reverse("rw-healthz"))
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_the_overview_shows_the_fastest_qualifying_route_per_region(
    client: Client, teammate: User
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from monitor.pipeline.ingest import results as ingest
    from tests.monitor import factories as f

    p = f.provider()
    fast, slow = f.route(p, "fast-model"), f.route(p, "slow-model")
    eu, us = f.region("eu-west"), f.region("us-east")
    t = f.task("qa", [fast, slow], [eu, us], ttft_p95_budget_ms=600, e2e_p95_budget_ms=10_000)
    now = timezone.now()
    payloads = []
    for i in range(20):
        at = now - timedelta(seconds=10 + i)
        payloads.append(f.payload(t, fast, eu, at, ttft_ms=400, e2e_ms=1500, tps=900))
        payloads.append(f.payload(t, slow, eu, at, ttft_ms=700, e2e_ms=6000, tps=60))
    ingest.ingest(payloads)
    client.force_login(teammate)
    body = client.get(reverse("rw-overview")).content.decode()
    eu_row = body[body.index('data-region="eu-west"') :].split("</tr>")[0]
    us_row = body[body.index('data-region="us-east"') :].split("</tr>")[0]
    assert "Acme / fast-model" in eu_row
    assert "within budget" in eu_row
    speed = int(re.search(r"([\d,]+) tok/s", eu_row).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert abs(speed - 900) <= 900 * 0.03  # read back from a log-bucket histogram
    assert "stale" in us_row  # nothing probed there: never shown as healthy
    assert "no route meets the bar" in us_row


def test_the_empty_overview_is_a_setup_checklist_with_live_status(
    client: Client, teammate: User
) -> None:
    from django.utils import timezone

    from monitor.models import Heartbeat, Provider, Region
    from monitor.pipeline.ingest.results import region_heartbeat

    client.force_login(teammate)
    body = client.get(reverse("rw-overview")).content.decode()
    for step in ("providers", "routes", "regions", "tasks", "eval-cases"):
        assert f'data-step="{step}"' in body
    assert body.count('class="todo"') == 5
    Provider.objects.create(name="P", slug="p", base_url="https://api.example.com/v1")
    running = Region.objects.create(name="Up", slug="up")
    Region.objects.create(name="Down", slug="down")
    Heartbeat.objects.create(name=region_heartbeat(running.pk), last_seen=timezone.now())
    body = client.get(reverse("rw-overview"), headers={"HX-Request": "true"}).content.decode()
    providers = body.split('data-step="providers"')[1].split("</li>")[0]
    assert "done" in providers
    assert "0 of 1 with an API key" in providers
    regions = body.split('data-step="regions"')[1].split("</li>")[0]
    assert "to do" in regions  # one of two regions has no running worker
    assert "1 of 2 regions delivered results" in regions
    assert 'href="/admin/monitor/region/"' in regions
