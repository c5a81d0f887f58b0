"""Issue 30, item 4: the same figure reads the same on every page. A route's errors are its
provider's failures out of its attempts, with the interval the availability bar judges; slots
our own workers missed are ours, shown apart ("N missed by us"), never counted as its errors.
Results go through the real ingest and the sweep's own missed path into real rollups."""

from __future__ import annotations

import re
from datetime import timedelta

from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from monitor.answer import board
from monitor.models import SLOT_DISPATCHED, ProbeSlot
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f


def _errors_cell(html: str, start: int) -> str:
    at = html.index('data-metric="errors"', start)
    return html[at : html.index("</td>", at)]


def test_errors_and_missed_slots_read_the_same_on_the_overview_route_and_task_pages(
    client: Client, teammate: User, db: None
) -> None:
    p = f.provider()
    r = f.route(p, "steady")
    g = f.region("ap-south")
    t = f.task("qa", [r], [g], max_error_rate=0.02)
    now = timezone.now()
    at = [now - timedelta(seconds=20 * (80 - i)) for i in range(80)]
    # 5 slots our workers missed, 3 of the provider's failures, 72 successes (3 of 75: 4.0%).
    missed = at[:5]
    payloads = [f.payload(t, r, g, a, outcome="error", error_kind="http_5xx") for a in at[5:8]]
    payloads += [f.payload(t, r, g, a) for a in at[8:]]
    assert ingest.ingest(payloads) == 75
    for a in missed:
        ProbeSlot.objects.create(
            task=t,
            route=r,
            region=g,
            slot_at=a,
            deadline_at=a + timedelta(seconds=t.probe_timeout_s),
            status=SLOT_DISPATCHED,
        )
    with transaction.atomic():
        ingest.record_missed([(t.pk, r.pk, g.pk, a) for a in missed], now, "no worker took it")
    board.refresh(now)
    client.force_login(teammate)

    overview = client.get(reverse("rw-overview")).content.decode()
    route = client.get(reverse("rw-route", args=[r.pk]), {"task": "qa"}).content.decode()
    task = client.get(reverse("rw-task", args=["qa"])).content.decode()

    region_row = route.index('data-region="ap-south"')
    cells = {
        "overview": _errors_cell(overview, 0),
        "route": _errors_cell(route, region_row),
        "task": _errors_cell(task, task.index('id="ranked"')),
    }
    for page, cell in cells.items():
        assert "4.0% (3 of 75)" in cell, (page, cell)
        assert "5 missed by us" in cell, (page, cell)
        # The interval the bar judges, next to it: 3 of 75 is 1.4% to 11.2%.
        interval = re.search(r"data-errors-interval[^>]*>([^<]*)<", cell)
        assert interval is not None, (page, cell)
        assert (
            interval.group(1)
            == cells["overview"].split("data-errors-interval")[1].split(">")[1].split("<")[0]
        ), page
        assert "2% ceiling" in cell, (page, cell)
    # The route page's errors by kind are the route's; our missed slots stand apart.
    errors = route[route.index('id="errors"') :].split("</table>")[0]
    assert "<code>http_5xx</code>" in errors
    assert "missed" not in errors
    assert "<code>missed</code> 5" in route[route.index('id="ours"') :]
