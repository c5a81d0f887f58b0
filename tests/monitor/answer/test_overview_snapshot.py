"""The overview is computed once per refresh interval and read ready-made; a configuration
change shows at once; no reader sees figures older than the refresh interval."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from monitor.answer import board
from monitor.models import STATUS_OK, STATUS_UNKNOWN, Heartbeat, OverviewSnapshot
from monitor.pipeline.ingest import results as ingest
from monitor.tasks import refresh_overview
from tests.monitor import factories as f


@pytest.fixture
def world(db: None):
    p = f.provider()
    fast, slow = f.route(p, "fast-model"), f.route(p, "slow-model")
    eu = f.region("eu-west")
    t = f.task("qa", [fast, slow], [eu], ttft_p95_budget_ms=600)
    return t, fast, slow, eu


def _probe(t, route, region, now, ttft_ms: float, n: int = 20) -> None:
    ingest.ingest(
        [
            f.payload(
                t,
                route,
                region,
                now - timedelta(seconds=5 + i),
                ttft_ms=ttft_ms,
                e2e_ms=3 * ttft_ms,
            )
            for i in range(n)
        ]
    )


def test_a_read_gets_the_snapshot_until_beat_is_clearly_behind_then_a_rebuild(world) -> None:
    t, fast, slow, eu = world
    now = timezone.now()
    _probe(t, slow, eu, now, ttft_ms=700)
    first = board.current(now)
    assert first.rows[0].cells[0].route_label == "Acme / slow-model"
    _probe(t, fast, eu, now, ttft_ms=200)  # arrives after the snapshot was built
    soon = now + board.max_age() / 2
    assert board.current(soon).rows[0].cells[0].route_label == "Acme / slow-model"
    assert board.current(soon).built_at == now
    # Beat ticking but its rebuild running late (a loaded machine): readers still get the
    # snapshot, up to LATE_REFRESHES intervals.
    late = now + board.max_age() * 2
    Heartbeat.objects.create(name="tick", last_seen=late)
    assert board.current(late).built_at == now
    # Beat down (no tick for two intervals): a reader rebuilds it past one interval.
    later = now + board.max_age() * board.LATE_REFRESHES + timedelta(seconds=1)
    rebuilt = board.current(later)
    assert rebuilt.built_at == later
    assert rebuilt.rows[0].cells[0].route_label == "Acme / fast-model"


def test_the_snapshot_reads_back_exactly_what_was_built(world) -> None:
    t, fast, _slow, eu = world
    now = timezone.now()
    _probe(t, fast, eu, now, ttft_ms=200)
    built = board.refresh(now)
    read = board.current(now)
    assert read == built
    cell = read.rows[0].cells[0]
    assert cell.route_id == fast.pk
    assert cell.last_probe_at is not None
    assert cell.ttft_p50_ms == pytest.approx(200, rel=0.03)
    assert cell.stale is False
    assert cell.overall_status == STATUS_OK


def test_staleness_is_judged_at_the_time_of_the_read(world) -> None:
    t, fast, _, eu = world
    now = timezone.now()
    _probe(t, fast, eu, now, ttft_ms=200)
    board.refresh(now)
    # The snapshot is rebuilt when a read comes after the refresh interval, so read it as
    # beat left it, a moment before the cell's stale bound.
    snapshot = OverviewSnapshot.objects.get()
    read = board.Overview.from_json(snapshot.data).at(now + t.stale_after())
    assert read.rows[0].cells[0].stale is True
    assert read.rows[0].cells[0].overall_status == STATUS_UNKNOWN


@pytest.mark.parametrize("change", ["rename task", "drop route", "add region"])
def test_a_configuration_change_shows_at_once(world, change: str) -> None:
    t, fast, _slow, eu = world
    now = timezone.now()
    _probe(t, fast, eu, now, ttft_ms=200)
    board.refresh(now)
    if change == "rename task":
        t.name = "Questions and answers"
        t.save()
        assert board.current(now).rows[0].task.name == "Questions and answers"
    elif change == "drop route":
        t.routes.remove(fast)
        assert board.current(now).rows[0].cells[0].route_id is None
    else:
        t.regions.add(f.region("us-east"))
        assert [c.region_slug for c in board.current(now).rows[0].cells] == [
            "eu-west",
            "us-east",
        ]


def test_beat_rebuilds_the_snapshot_twice_per_refresh_interval(world) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["overview"]
    assert entry["task"] == "monitor.tasks.refresh_overview"
    assert float(entry["schedule"]) <= settings.DASHBOARD_REFRESH_SECONDS / 2
    assert refresh_overview.apply().get() == 1  # one task row
    assert OverviewSnapshot.objects.get().built_at > timezone.now() - timedelta(seconds=5)


def test_beat_paces_a_slow_rebuild_so_it_never_takes_the_whole_worker(world) -> None:
    """A rebuild that takes D seconds is not started again within 2D of its start (ticks in
    the same worker are not starved), a cheap one every time beat asks, and none is put off
    past what readers take (LATE_REFRESHES - 1 refresh intervals)."""
    assert refresh_overview.apply().get() == 1
    assert OverviewSnapshot.objects.get().build_s > 0
    now = timezone.now()
    cheap = now - timedelta(seconds=1)
    OverviewSnapshot.objects.update(built_at=cheap, build_s=0.2)
    assert refresh_overview.apply().get() == 1  # 1 s after a 0.2 s build: due
    began = now - timedelta(seconds=6)
    OverviewSnapshot.objects.update(built_at=began, build_s=5.0)
    assert refresh_overview.apply().get() is None  # 6 s after a 5 s build: not yet
    assert OverviewSnapshot.objects.get().built_at == began  # untouched
    OverviewSnapshot.objects.update(built_at=now - timedelta(seconds=11))
    assert refresh_overview.apply().get() == 1  # 11 s after: due
    latest_s = settings.DASHBOARD_REFRESH_SECONDS * (board.LATE_REFRESHES - 1)
    OverviewSnapshot.objects.update(
        built_at=timezone.now() - timedelta(seconds=latest_s + 1), build_s=latest_s
    )
    assert refresh_overview.apply().get() == 1  # however slow, never older than readers take
    assert OverviewSnapshot.objects.get().built_at > timezone.now() - timedelta(seconds=5)


def test_one_rebuild_at_a_time_however_many_workers_beat_asks(world) -> None:
    """While one worker rebuilds, the snapshot is old and every ask is due: the others must
    not start rebuilds of their own (four at once took the ingest workers for minutes)."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [board.REBUILD_LOCK])
        assert refresh_overview.apply().get() is None
        assert not OverviewSnapshot.objects.exists()
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [board.REBUILD_LOCK])
        assert refresh_overview.apply().get() == 1
        with other.cursor() as cursor:  # and the rebuild gave the lock back
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [board.REBUILD_LOCK])
            assert cursor.fetchone()[0]
    finally:
        other.close()


def test_while_a_rebuild_runs_readers_get_the_old_snapshot_not_one_each(world) -> None:
    """Past LATE_REFRESHES a reader rebuilds the snapshot itself; while another rebuild is
    running (at the realistic mix's 1x one took 75-107 s) every reader did, for seconds each.
    They get the old snapshot, which says when it was built, until REBUILDING_MAX."""
    t, fast, _, eu = world
    _probe(t, fast, eu, timezone.now(), ttft_ms=200)
    assert refresh_overview.apply().get() == 1
    old = timezone.now() - board.max_age() * (board.LATE_REFRESHES + 1)
    OverviewSnapshot.objects.update(built_at=old)
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [board.REBUILD_LOCK])
        assert board.current().rows  # the old snapshot, at once
        assert OverviewSnapshot.objects.get().built_at == old  # nobody rebuilt it
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [board.REBUILD_LOCK])
        board.current()
        assert OverviewSnapshot.objects.get().built_at > old  # none running: the reader makes one
    finally:
        other.close()


def test_the_page_says_when_its_figures_were_computed(
    client: Client, teammate: User, world
) -> None:
    t, fast, _, eu = world
    _probe(t, fast, eu, timezone.now(), ttft_ms=200)
    client.force_login(teammate)
    body = client.get(reverse("rw-overview")).content.decode()
    assert "Figures as of" in body
    assert "Acme / fast-model" in body


def test_beat_renders_the_rows_once_and_every_reader_gets_them_as_rendered(
    client: Client, teammate: User, world
) -> None:
    t, fast, _, eu = world
    _probe(t, fast, eu, timezone.now(), ttft_ms=200)
    assert refresh_overview.apply().get() == 1
    rows_html = OverviewSnapshot.objects.get().data["rows_html"]
    assert f'data-task="{t.slug}"' in rows_html
    assert "Acme / fast-model" in rows_html
    client.force_login(teammate)
    page = client.get(reverse("rw-overview")).content.decode()
    body = client.get(reverse("rw-overview"), headers={"HX-Request": "true"}).content.decode()
    assert rows_html in page
    assert rows_html in body  # the htmx refresh of the body too
    assert page.count(f'data-task="{t.slug}"') == 1  # not rendered a second time
