"""Hour strips (monitor.HourStrip) stay equal to the hourly rollups whoever writes them, and a
route chart read from them shows each bucket's rollup percentiles, or a gap, at its time."""

from __future__ import annotations

import json
import random
import threading
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

import pytest
from django.db import connection

from monitor.models import GRAIN_DAY, GRAIN_HOUR, HourStrip, Region, Rollup, Route, Task
from monitor.pages import route as pages_route
from monitor.pages.common import RANGES
from monitor.pipeline.ingest import results as ingest
from monitor.stats import hist, rollups
from tests.monitor import factories as f
from tests.support import SERIES_METRICS, unfold_series

T0 = datetime(2026, 11, 2, 21, 0, tzinfo=UTC)  # three hours before a UTC day ends


class World(NamedTuple):
    task: Task
    fast: Route
    slow: Route
    eu: Region
    us: Region


def _world() -> World:
    p = f.provider()
    fast, slow = f.route(p, "fast"), f.route(p, "slow")
    eu, us = f.region("eu-west"), f.region("us-east")
    return World(f.task("qa", [fast, slow], [eu, us]), fast, slow, eu, us)


def _probe_days(task: Task, routes: list[Route], regions: list[Region], seed: int) -> None:
    """Ingest, in several batches as workers would, probes over two days with gaps, errors
    and missed slots."""
    rng = random.Random(seed)
    payloads = []
    for minute in range(0, 48 * 60, 7):
        at = T0 - timedelta(hours=20) + timedelta(minutes=minute)
        if 6 <= at.hour <= 8:  # an outage: no rollup rows at all for these hours
            continue
        for route in routes:
            for region in regions:
                if rng.random() < 0.3:
                    continue
                outcome = rng.choice(["ok"] * 8 + ["error", "missed"])
                payloads.append(
                    f.payload(
                        task,
                        route,
                        region,
                        at + timedelta(seconds=rng.randrange(60)),
                        ttft_ms=rng.lognormvariate(6, 0.5),
                        ttfat_ms=rng.lognormvariate(6.5, 0.5),
                        e2e_ms=rng.lognormvariate(8, 0.4),
                        tps=rng.lognormvariate(4.5, 0.3),
                        outcome=outcome,
                        error_kind="http_5xx" if outcome == "error" else "",
                    )
                )
    rng.shuffle(payloads)  # results arrive out of order
    for i in range(0, len(payloads), 97):
        ingest.ingest(payloads[i : i + 97])


def _strips() -> dict[tuple[int, int, int | None, datetime], list[object]]:
    """Every strip's points, leaving out strips with no point (a rebuild writes none)."""
    out = {}
    for s in HourStrip.objects.all():
        points = json.loads(s.points)
        assert len(points) == 24
        if any(p is not None for p in points):
            out[(s.task_id, s.route_id, s.region_id, s.day)] = points
    return out


def _expected_point(row: Rollup | None) -> list[float | None] | None:
    if row is None:
        return None
    ttfat = hist.percentiles(row.ttfat_hist, (50, 95, 99), hist.MS)
    return [*row.ttft_pcts, *row.e2e_pcts, *row.tps_pcts, *(_tenth(v) for v in ttfat)]


def _tenth(value: float | None) -> float | None:
    """As rw_pairs_pcts rounds (charts show 0.1 ms)."""
    return None if value is None else round(value, 1)


@pytest.mark.django_db
def test_the_trigger_keeps_every_strip_equal_to_a_rebuild_from_the_hourly_rollups() -> None:
    task, fast, slow, eu, us = _world()
    _probe_days(task, [fast, slow], [eu, us], seed=7)
    kept = _strips()
    hours = Rollup.objects.filter(grain=GRAIN_HOUR)
    assert len(kept) == 3 * 2 * 3  # 3 UTC days x 2 routes x (2 regions + all regions)
    for row in hours:
        day = row.bucket_start.replace(hour=0)
        assert kept[(row.task_id, row.route_id, row.region_id, day)][row.bucket_start.hour] == (
            pytest.approx(_expected_point(row), abs=1e-9)
        )
    assert sum(p is not None for points in kept.values() for p in points) == hours.count()

    # An admin deletes an hour's rollups: their hours are blanked, the rest untouched
    gone = hours.filter(route=fast, bucket_start=T0)
    assert gone.count() == 3
    gone.delete()
    for key, points in _strips().items():
        if key[1] == fast.pk and key[3] == T0.replace(hour=0):
            assert points[T0.hour] is None
    kept = _strips()

    with connection.cursor() as cursor:
        cursor.execute("SELECT rw_hour_strips_rebuild()")
        assert cursor.fetchone()[0] == HourStrip.objects.count()
    assert _strips() == kept
    assert HourStrip.objects.get(task=task, route=slow, region=None, day=T0.replace(hour=0))


@pytest.mark.django_db
def test_deleting_a_task_leaves_no_strip_behind_and_breaks_no_foreign_key() -> None:
    task, fast, _, eu, _ = _world()
    other = f.task("other", [fast], [eu])
    ingest.ingest([f.payload(t, fast, eu, T0) for t in (task, other)])
    assert HourStrip.objects.filter(task=task).count() == 2  # eu-west and all regions
    task.delete()  # Django deletes strips and rollups; the trigger must not write a strip back
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the deferred checks a commit makes
    assert not HourStrip.objects.filter(task_id=task.pk).exists()
    assert HourStrip.objects.filter(task=other).count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("range_key", ["24h", "7d", "30d"])
def test_every_chart_point_is_its_buckets_rollup_percentiles_or_a_gap(range_key: str) -> None:
    task, fast, slow, eu, us = _world()
    _probe_days(task, [fast, slow], [eu, us], seed=11)
    window = RANGES[range_key]
    now = T0 + timedelta(hours=27, minutes=40)  # the day after, mid-hour
    step = timedelta(hours=1) if window.series_grain == GRAIN_HOUR else timedelta(days=1)
    first = rollups.bucket_start(window.since(now), window.series_grain)
    for region in (None, eu, us):
        packed = json.loads(pages_route.series(fast, task, region, window, now))
        chart = unfold_series(packed, with_tails=False)
        flat = [p for chunk in packed["chunks"] for p in chunk]
        points = flat[packed["skip"] : packed["skip"] + packed["count"]]
        rows = {
            r.bucket_start: r
            for r in Rollup.objects.filter(
                grain=window.series_grain, task=task, route=fast, region=region
            )
        }
        count = (rollups.bucket_start(now, window.series_grain) - first) // step + 1
        assert len(chart["labels"]) == count
        label = "%Y-%m-%d" if window.series_grain == GRAIN_DAY else "%m-%d %H:00"
        seen = 0
        for i in range(count):
            at = first + i * step
            assert chart["labels"][i] == at.strftime(label)
            expected = _expected_point(rows.get(at))
            assert (points[i] is None) == (expected is None), at  # no row: null, not [null x 9]
            seen += expected is not None
            for mi, metric in enumerate(SERIES_METRICS):
                for qi, q in enumerate(("p50", "p95", "p99")):
                    value = chart[metric][q][i]
                    assert value == (expected[mi * 3 + qi] if expected else None), (at, metric, q)
        assert seen == len([t for t in rows if first <= t < first + count * step])
        assert seen > 0


@pytest.mark.django_db(transaction=True)
def test_two_ingest_workers_writing_the_same_strips_never_deadlock() -> None:
    """Two workers fold results into the same days' strips, hours in opposite orders."""
    w = _world()
    errors: list[BaseException] = []

    def worker(hours: list[int], regions: list[Region], offset: int) -> None:
        try:
            for n in range(25):
                batch = [
                    f.payload(w.task, w.fast, g, T0 + timedelta(hours=h, seconds=offset + n))
                    for h in hours
                    for g in regions
                ]
                ingest.ingest(batch)
        except BaseException as e:  # reported below, from the test's own thread
            errors.append(e)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=worker, args=([-2, -1], [w.eu, w.us], 0)),
        threading.Thread(target=worker, args=([-1, -2], [w.us, w.eu], 30)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert Rollup.objects.filter(grain=GRAIN_HOUR, region=None).count() == 2
    kept = _strips()
    assert sum(p is not None for points in kept.values() for p in points) == 6
    with connection.cursor() as cursor:
        cursor.execute("SELECT rw_hour_strips_rebuild()")
    assert _strips() == kept


def _strip_writes() -> int:
    """Rows this transaction inserted or updated in monitor_hourstrip so far."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_inserted(c.oid) + pg_stat_get_xact_tuples_updated(c.oid)"
            " FROM pg_class AS c WHERE c.relname = 'monitor_hourstrip'"
        )
        return int(cursor.fetchone()[0])


@pytest.mark.django_db
def test_a_result_that_moves_no_percentile_leaves_its_strips_unwritten() -> None:
    """Ingest rewrites an hour's strip only when the hour's chart point changed: an error adds
    no sample, and a sample in the bucket the percentiles already sit in moves none of them.
    A sample that moves one rewrites both strips (the region's and all regions')."""
    task, fast, _slow, eu, _us = _world()
    at = T0 + timedelta(minutes=1)
    ingest.ingest([f.payload(task, fast, eu, at + timedelta(minutes=m)) for m in range(6)])
    point = _strips()[(task.pk, fast.pk, eu.pk, T0.replace(hour=0))][T0.hour]
    before = _strip_writes()

    ingest.ingest([f.payload(task, fast, eu, at + timedelta(minutes=10), outcome="error")])
    ingest.ingest([f.payload(task, fast, eu, at + timedelta(minutes=11))])  # the same values
    assert _strip_writes() == before
    assert _strips()[(task.pk, fast.pk, eu.pk, T0.replace(hour=0))][T0.hour] == point

    ingest.ingest([f.payload(task, fast, eu, at + timedelta(minutes=m + 20), ttft_ms=9000.0)
                   for m in range(10)])  # fmt: skip
    assert _strip_writes() == before + 2
    moved = _strips()[(task.pk, fast.pk, eu.pk, T0.replace(hour=0))][T0.hour]
    assert moved != point
    row = Rollup.objects.get(grain=GRAIN_HOUR, bucket_start=T0, route=fast, region=eu)
    assert moved == pytest.approx(_expected_point(row), abs=1e-9)
