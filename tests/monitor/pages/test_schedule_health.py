"""Monitoring health in plain sight: the Status page's regions table, `/metrics` and the
overview's banner say how each region keeps its schedule, and their figures agree with the raw
results in the database. Results go in the way a region worker's do (signed, through ingest);
the worker's liveness beacon is written to the real Redis as a worker writes it."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from monitor.models import ProbeResult, Region, Task
from monitor.pipeline import queues, signing
from monitor.pipeline.beat import scheduling
from monitor.pipeline.beat.slots import Slot
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.region import liveness
from monitor.stats import health, hist
from monitor.templatetags.rw import ms
from tests.monitor import factories as f

SLUG = "health-a"


@pytest.fixture
def beacons() -> Any:
    client = queues.client()
    client.delete(*client.keys(f"{liveness.PREFIX}{SLUG}:*") or ["-"])
    yield client
    client.delete(*client.keys(f"{liveness.PREFIX}{SLUG}:*") or ["-"])


def _signed(g: Region, results: list[dict[str, Any]]) -> dict[str, Any]:
    return signing.seal(signing.signing_key(g.slug), g.slug, signing.KIND_RESULTS, results, None)


def _world(db: None) -> tuple[Task, Region, dict[str, int]]:
    """20 slots of the last 20 minutes: 12 probed (ok, with start lags), 1 not started (too
    late), 2 still open, 4 missed at their deadlines, 1 left out; and generated history."""
    p = f.provider()
    r = f.route(p, "m1")
    g = f.region(SLUG)
    t = f.task("health", [r], [g], probe_timeout_s=900)
    now = timezone.now().replace(microsecond=0)
    slots = {k: Slot(t, r, g, now - timedelta(minutes=k)) for k in range(1, 21)}
    assert len(scheduling.claim([s for k, s in slots.items() if k != 16])) == 19
    ok = [{**f.payload(t, r, g, slots[k].slot_at), "start_lag_ms": 40.0 * k} for k in range(1, 13)]
    late = {
        **f.payload(t, r, g, slots[13].slot_at, outcome="missed", error_kind="missed"),
        "error_detail": "started late: 12.0 s after its planned start",
        "start_lag_ms": 12_000.0,
    }
    assert ingest.ingest_signed(_signed(g, [*ok, late])) == 13
    # Past their deadlines (slot + 900 s + 60 s of grace): the sweep records them missed.
    assert ingest.sweep_missed(now + timedelta(minutes=1)) == 4
    # Demo history is not the schedule's.
    generated = [
        {**f.payload(t, r, g, now - timedelta(minutes=30 + k), slot=False), "generated": True}
        for k in range(5)
    ]
    assert ingest.ingest(generated) == 5
    return t, g, {"probed": 12, "missed": 5, "late": 1, "open": 2}


def _cell(page: str, region: str, name: str) -> str:
    row = re.search(rf'<tr data-region="{region}".*?</tr>', page, re.S)
    assert row, page
    cell = re.search(rf"<td[^>]*data-{name}>(.*?)</td>", row.group(0), re.S)
    assert cell, (name, row.group(0))
    return re.sub(r"<[^>]+>", "", cell.group(1)).strip()


def test_the_status_page_shows_each_regions_schedule_as_the_database_holds_it(
    client: Client, db: None, staff: User, beacons: Any
) -> None:
    _, g, expected = _world(db)
    client.force_login(staff)
    page = client.get(reverse("rw-status")).content.decode()

    hour_ago = health.minute_of(timezone.now() - timedelta(hours=1))
    rows = ProbeResult.objects.filter(region=g, generated=False, slot_at__gte=hour_ago)
    probed = rows.exclude(outcome="missed").count()
    missed = rows.filter(outcome="missed").count()
    late = rows.filter(outcome="missed", start_lag_ms__isnull=False).count()
    assert (probed, missed, late) == (expected["probed"], expected["missed"], expected["late"])
    assert _cell(page, SLUG, "probed") == str(probed)
    assert _cell(page, SLUG, "due") == str(probed + missed)
    assert _cell(page, SLUG, "missed").startswith(f"{missed} (29.4%)")
    assert _cell(page, SLUG, "late") == str(late)
    assert _cell(page, SLUG, "open") == str(expected["open"])
    # Start lags of the 12 probes that ran: 40 ms to 480 ms; their p50 as the histogram
    # reads it back (within 2.5% of the exact 240 ms).
    lags = rows.filter(start_lag_ms__isnull=False).exclude(outcome="missed")
    pairs = hist.build(lags.values_list("start_lag_ms", flat=True), health.LAG_SCALE)
    p50 = hist.percentile(pairs, 50, health.LAG_SCALE)
    assert p50 is not None
    assert abs(p50 - 240) <= 240 * 0.025
    assert _cell(page, SLUG, "lag-p50") == ms(p50)
    assert _cell(page, SLUG, "lag-p99") == "too few"  # 12 samples: a p99 needs 100
    assert "none live" in _cell(page, SLUG, "workers")
    assert f"{SLUG}: 29% of slots missed in the last hour; it has no live worker" in page


def test_the_overview_names_a_region_missing_slots_and_why_until_it_keeps_its_schedule(
    client: Client, db: None, staff: User, beacons: Any
) -> None:
    _world(db)
    client.force_login(staff)
    page = client.get(reverse("rw-overview")).content.decode()
    assert "data-schedule-health" in page
    assert f"{SLUG}: 29% of slots missed in the last hour; it has no live worker" in page
    assert f"{SLUG}: down, no live worker; results last arrived" in page

    # A worker that is alive and full: the cause is named as saturation.
    liveness.publish(
        {
            "region": SLUG,
            "worker": "host:1",
            "seen_at": time.time(),
            "in_flight": 2000,
            "holding": 40,
            "capacity": 2000,
            "threads": 500,
            "started": 9000,
            "late": 1,
            "peak": 2000,
        }
    )
    page = client.get(reverse("rw-overview")).content.decode()
    assert f"{SLUG}: 29% of slots missed in the last hour; its workers are saturated" in page
    assert "no live worker" not in page
    status = client.get(reverse("rw-status")).content.decode()
    assert _cell(status, SLUG, "in-flight") == "2,000 of 2,000"
    assert _cell(status, SLUG, "workers").startswith("1 live, seen")

    metrics = client.get(reverse("rw-metrics")).content.decode()
    assert f'routewatch_region_slots{{region="{SLUG}",state="missed",window="1h"}} 5.0' in metrics
    assert f'routewatch_region_slots{{region="{SLUG}",state="probed",window="1h"}} 12.0' in metrics
    assert f'routewatch_region_workers_live{{region="{SLUG}"}} 1.0' in metrics
    assert f'routewatch_region_probes_in_flight{{region="{SLUG}"}} 2000.0' in metrics


def test_late_starts_with_workers_that_have_room_are_blamed_on_the_queue_not_on_capacity(
    client: Client, db: None, staff: User, beacons: Any
) -> None:
    """A region's first worker started after its batches had waited in the queue (tried as a
    new user, docs/remote-regions.md): its first probes started too late, but its worker is
    nowhere near full, so the page does not call it saturated."""
    p = f.provider()
    r = f.route(p, "m1")
    g = f.region(SLUG)
    t = f.task("health", [r], [g], probe_timeout_s=900)
    now = timezone.now().replace(microsecond=0)
    slots = [Slot(t, r, g, now - timedelta(minutes=k)) for k in range(1, 5)]
    assert len(scheduling.claim(slots)) == 4
    late = [
        {
            **f.payload(t, r, g, s.slot_at, outcome="missed", error_kind="missed"),
            "error_detail": "started late: 30.0 s after its planned start",
            "start_lag_ms": 30_000.0,
        }
        for s in slots[2:]
    ]
    ok = [f.payload(t, r, g, s.slot_at) for s in slots[:2]]
    assert ingest.ingest_signed(_signed(g, [*ok, *late])) == 4
    liveness.publish(
        {
            "region": SLUG,
            "worker": "host:1",
            "seen_at": time.time(),
            "in_flight": 3,
            "holding": 3,
            "capacity": 2000,
            "threads": 500,
            "started": 40,
            "late": 2,
            "peak": 20,
        }
    )
    client.force_login(staff)
    status = client.get(reverse("rw-status")).content.decode()
    assert "its workers are saturated" not in status
    assert (
        f"{SLUG}: 50% of slots missed in the last hour; probes started too late to count: "
        "its queue backed up" in status
    )


def test_a_live_worker_of_a_region_no_task_probes_from_is_listed_and_told_why_it_idles(
    client: Client, db: None, staff: User, beacons: Any
) -> None:
    """Enrolled and started before any task probes from its region (tried as a new user,
    docs/remote-regions.md; and `make run` again resets the demo tasks' regions): its worker
    was live and invisible on the Status page."""
    g = f.region(SLUG)
    liveness.publish(
        {
            "region": SLUG,
            "worker": "host:7",
            "seen_at": time.time(),
            "in_flight": 0,
            "holding": 0,
            "capacity": 2000,
            "threads": 500,
            "started": 0,
            "late": 0,
            "peak": 0,
            "version": "9.9.9",
            "clock_offset_s": 0.0,
            "clock_ok": True,
            "consuming": True,
        }
    )
    client.force_login(staff)
    status = client.get(reverse("rw-status")).content.decode()
    row = re.search(
        rf'<tr data-worker="host:7" data-worker-region="{g.slug}".*?</tr>', status, re.S
    )
    assert row, status
    assert "9.9.9" in row.group(0)
    assert f"{SLUG}: 1 live worker(s), but no active task probes from this region" in status
    assert f"{SLUG}: down" not in status


def test_a_region_keeping_its_schedule_raises_no_banner(
    client: Client, db: None, staff: User, beacons: Any
) -> None:
    p = f.provider()
    r = f.route(p, "m1")
    g = f.region(SLUG)
    t = f.task("health", [r], [g], probe_timeout_s=900)
    now = timezone.now().replace(microsecond=0)
    slots = [Slot(t, r, g, now - timedelta(minutes=k)) for k in range(1, 11)]
    scheduling.claim(slots)
    ingest.ingest_signed(_signed(g, [f.payload(t, r, g, s.slot_at) for s in slots]))
    liveness.publish(
        {
            "region": SLUG,
            "worker": "host:1",
            "seen_at": time.time(),
            "in_flight": 3,
            "holding": 2,
            "capacity": 2000,
            "threads": 500,
            "started": 10,
            "late": 0,
            "peak": 5,
        }
    )
    client.force_login(staff)
    assert "data-schedule-health" not in client.get(reverse("rw-overview")).content.decode()
    status = client.get(reverse("rw-status")).content.decode()
    assert _cell(status, SLUG, "missed") == "0 (0.0%)"
    assert "data-region-problem" not in status
