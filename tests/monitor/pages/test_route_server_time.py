"""The route page splits e2e into the provider's own time and the path's, per region, where
the provider reports its own (Bedrock's metrics.latencyMs, openai-processing-ms)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f


def test_each_region_shows_how_much_of_e2e_was_the_providers_own_time(
    client: Client, teammate: User, db: None
) -> None:
    p = f.provider("bedrock-ish", wire_format="bedrock")
    r = f.route(p, "anthropic.claude-sonnet-v1:0")
    near, far = f.region("us-east"), f.region("ap-south")
    t = f.task("qa", [r], [near, far])
    now = timezone.now()
    payloads: list[dict[str, Any]] = []
    for i in range(6):
        at = now - timedelta(seconds=10 * i + 5)
        # The same provider time from both regions; the far region's path is 300 ms longer.
        payloads.append({**f.payload(t, r, near, at), "e2e_ms": 1100.0, "server_ms": 1000.0})
        payloads.append({**f.payload(t, r, far, at), "e2e_ms": 1400.0, "server_ms": 1000.0})
    assert ingest.ingest(payloads) == 12
    client.force_login(teammate)
    body = client.get(reverse("rw-route", args=[r.pk]), {"task": "qa"}).content.decode()
    table = body[body.index('id="server-time"') :].split("</table>")[0]
    rows = {
        g.pk: next(row for row in table.split("<tr>") if f">{g.name}<" in row) for g in (near, far)
    }
    assert "1.00 s" in rows[near.pk]
    assert "100 ms" in rows[near.pk]
    assert "91%" in rows[near.pk]
    assert "400 ms" in rows[far.pk]
    assert "71%" in rows[far.pk]


def test_no_server_time_section_where_the_provider_reports_none(
    client: Client, teammate: User, db: None
) -> None:
    p = f.provider("plain")
    r = f.route(p, "chat")
    g = f.region("eu-west")
    t = f.task("qa", [r], [g])
    assert ingest.ingest([f.payload(t, r, g, timezone.now() - timedelta(seconds=5))]) == 1
    client.force_login(teammate)
    body = client.get(reverse("rw-route", args=[r.pk]), {"task": "qa"}).content.decode()
    assert 'id="server-time"' not in body
