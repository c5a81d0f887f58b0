"""Ingest writes each result once and prices it, records an overdue slot missed once, lets a
late result measured in time replace its missed row, closes slots, and retention drops old
rows but never rollups or open slots (real PostgreSQL).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from monitor.models import GRAIN_DAY, GRAIN_HOUR, ProbeResult, ProbeSlot, RaceRun, Rollup
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.ingest import retention as ingest_retention
from monitor.stats import hist
from tests.monitor import factories as f

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


@pytest.fixture
def setup(db: None):
    p = f.provider()
    r1, r2 = f.route(p, "m1"), f.route(p, "m2")
    eu, us = f.region("eu-west"), f.region("us-east")
    t = f.task("qa", [r1, r2], [eu, us], min_pass_rate=0.5)
    return t, r1, r2, eu, us


def test_a_result_is_written_once_even_when_delivered_twice(setup) -> None:
    t, r1, _, eu, _ = setup
    batch = [f.payload(t, r1, eu, T0)]
    assert ingest.ingest(batch) == 1
    assert ingest.ingest(batch) == 0
    assert ProbeResult.objects.count() == 1
    hour = Rollup.objects.get(grain=GRAIN_HOUR, region=eu)
    assert hour.count_ok == 1  # the duplicate did not count twice


def test_cost_comes_from_route_prices(setup) -> None:
    t, r1, _, eu, _ = setup
    ingest.ingest([f.payload(t, r1, eu, T0)])
    # 1000 input at $1/M + 200 output at $2/M
    assert ProbeResult.objects.get().cost_usd == Decimal("0.001400")


def test_an_overdue_slot_is_recorded_missed_once(setup) -> None:
    t, r1, _, eu, _ = setup
    ProbeSlot.objects.create(
        task=t, route=r1, region=eu, slot_at=T0, deadline_at=T0 + timedelta(minutes=4)
    )
    assert ingest.sweep_missed(now=T0 + timedelta(minutes=3)) == 0
    assert ingest.sweep_missed(now=T0 + timedelta(minutes=5)) == 1
    assert ingest.sweep_missed(now=T0 + timedelta(minutes=6)) == 0
    missed = ProbeResult.objects.get()
    assert (missed.outcome, missed.error_kind) == ("missed", "missed")
    assert ProbeSlot.objects.get().status == "missed"
    assert Rollup.objects.get(grain=GRAIN_HOUR, region=eu).count_missed == 1


def test_a_late_result_measured_in_time_replaces_missed_once(setup) -> None:
    t, r1, _, eu, _ = setup
    ProbeSlot.objects.create(
        task=t, route=r1, region=eu, slot_at=T0, deadline_at=T0 + timedelta(minutes=4)
    )
    assert ingest.sweep_missed(now=T0 + timedelta(minutes=5)) == 1
    hour = Rollup.objects.get(grain=GRAIN_HOUR, region=eu)
    assert (hour.count_ok, hour.count_missed, hour.error_kinds) == (0, 1, {"missed": 1})
    # Measured at T0 (ingest was down): it replaces the missed row, and the rollups follow.
    late = f.payload(t, r1, eu, T0 + timedelta(seconds=2))
    late["slot_at"] = T0.isoformat()
    assert ingest.ingest([late]) == 1
    assert ingest.ingest([late]) == 0  # redelivered: still one row
    row = ProbeResult.objects.get()
    assert (row.outcome, row.ttft_ms) == ("ok", 500.0)
    assert ProbeSlot.objects.get().status == "done"
    for grain in (GRAIN_HOUR, GRAIN_DAY):
        for region in (eu, None):
            rollup = Rollup.objects.get(grain=grain, region=region, route=r1)
            assert (rollup.count_ok, rollup.count_missed) == (1, 0), (grain, region)
            assert rollup.error_kinds == {}  # no "missed": 0 left behind
            assert hist.total(rollup.ttft_hist) == 1
    assert ingest.sweep_missed(now=T0 + timedelta(hours=1)) == 0


def test_a_result_measured_after_its_deadline_leaves_missed_alone(setup) -> None:
    t, r1, _, eu, _ = setup
    ProbeSlot.objects.create(
        task=t, route=r1, region=eu, slot_at=T0, deadline_at=T0 + timedelta(minutes=4)
    )
    ingest.sweep_missed(now=T0 + timedelta(minutes=5))
    # Started 3 min 59 s in, ended 2 s later: past the deadline, so it proves nothing.
    late = f.payload(t, r1, eu, T0 + timedelta(minutes=3, seconds=59))
    late["slot_at"] = T0.isoformat()
    assert ingest.ingest([late]) == 0
    assert ProbeResult.objects.get().outcome == "missed"
    assert ProbeSlot.objects.get().status == "missed"
    assert Rollup.objects.get(grain=GRAIN_HOUR, region=eu).count_missed == 1


def test_a_result_closes_its_slot(setup) -> None:
    t, r1, _, eu, _ = setup
    ProbeSlot.objects.create(
        task=t, route=r1, region=eu, slot_at=T0, deadline_at=T0 + timedelta(minutes=4)
    )
    ingest.ingest([f.payload(t, r1, eu, T0)])
    assert ProbeSlot.objects.get().status == "done"
    assert ingest.sweep_missed(now=T0 + timedelta(hours=1)) == 0


def test_retention_deletes_old_raw_rows_and_keeps_rollups(setup) -> None:
    t, r1, _, eu, _ = setup
    old = datetime.now(UTC) - timedelta(days=100)
    ingest.ingest([f.payload(t, r1, eu, old), f.payload(t, r1, eu, datetime.now(UTC))])
    for at, status in (
        (old, "done"),
        (datetime.now(UTC), "done"),
        (old + timedelta(minutes=5), "dispatched"),
    ):
        RaceRun.objects.create(
            task=t, region=eu, slot_at=at, deadline_at=at + timedelta(minutes=5), status=status
        )
    assert ingest_retention.delete_old_results(days=90) == 1
    assert ProbeResult.objects.count() == 1
    assert Rollup.objects.filter(bucket_start__lt=old + timedelta(days=1)).exists()
    # Old closed races go with the raw rows; an open one waits for its sweep.
    assert sorted(RaceRun.objects.values_list("status", flat=True)) == ["dispatched", "done"]


def test_retention_deletes_closed_slots_after_a_week_and_never_an_open_one(setup) -> None:
    t, r1, r2, eu, _ = setup
    now = datetime.now(UTC)
    for route, age, status in (
        (r1, timedelta(days=8), "done"),
        (r1, timedelta(days=8, minutes=1), "missed"),
        (r2, timedelta(days=8), "dispatched"),  # still open: the sweep closes it first
        (r1, timedelta(days=6), "done"),  # inside the week: a late result can find it
    ):
        at = now - age
        ProbeSlot.objects.create(
            task=t, route=route, region=eu, slot_at=at, deadline_at=at, status=status
        )
    # Two per statement: the batching loop runs more than once.
    assert ingest_retention.delete_old_results(days=90, batch=2, slot_days=7) == 2
    left = sorted(ProbeSlot.objects.values_list("status", flat=True))
    assert left == ["dispatched", "done"]
    assert ProbeSlot.objects.get(status="done").slot_at > now - timedelta(days=7)
    # Raw results kept for fewer days than slots: slots go with them.
    assert ingest_retention.delete_old_results(days=5, slot_days=7) == 1
    assert list(ProbeSlot.objects.values_list("status", flat=True)) == ["dispatched"]


@pytest.mark.django_db
def test_probe_results_have_only_the_indexes_their_reads_need() -> None:
    """Each index costs every ingested row a write: none duplicates another's lead column."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'monitor_proberesult'"
        )
        indexes = dict(cursor.fetchall())
    assert set(indexes) == {
        "monitor_proberesult_pkey",
        "result_one_per_slot",  # (task, route, region, slot_at): also task lookups
        "result_route_started",  # (route, started_at): also route lookups
        "result_started_brin",
        "result_scenario_calls",  # partial: a scenario's calls only
        "result_generated_started",  # partial: generated demo history only (empty in production)
        "monitor_proberesult_region_id_82e89292",
        "monitor_proberesult_eval_case_id_f1eec2ad",
    }
    assert "INCLUDE" not in indexes["result_route_started"]
