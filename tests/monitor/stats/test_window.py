"""Figures over an exact window: whole hours from the rollups, partial hours from the raw
results folded as ingest folds them (real ingest into real PostgreSQL)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from monitor.pipeline.ingest import results as ingest
from monitor.stats import window
from monitor.stats.confidence import percentile
from monitor.stats.rollups import COUNTERS, HISTOGRAMS, Stats
from tests.monitor import factories as f

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def setup(db: None):
    p = f.provider()
    r1, r2 = f.route(p, "m1"), f.route(p, "m2")
    eu, us = f.region("eu-west"), f.region("us-east")
    t = f.task("qa", [r1, r2], [eu, us])
    rng = random.Random(7)
    payloads = []
    for minute in range(180):  # 09:00 to 11:59, one a minute per route and region
        at = T0 + timedelta(minutes=minute, seconds=10)
        for route in (r1, r2):
            for region in (eu, us):
                if minute % 17 == 0:
                    payloads.append(
                        f.payload(t, route, region, at, outcome="error", error_kind="http_5xx")
                    )
                else:
                    payloads.append(
                        f.payload(
                            t,
                            route,
                            region,
                            at,
                            ttft_ms=rng.uniform(50, 900),
                            e2e_ms=rng.uniform(300, 9000),
                            tps=rng.uniform(10, 200),
                            quality_pass=rng.random() < 0.8,
                        )
                    )
    assert ingest.ingest(payloads) == len(payloads)
    return t, [r1.pk, r2.pk]


def _same(a: Stats, b: Stats) -> None:
    for name in COUNTERS:
        assert getattr(a, name) == getattr(b, name), name
    assert a.error_kinds == b.error_kinds
    assert a.last_probe_at == b.last_probe_at
    assert a.last_ok_at == b.last_ok_at
    for column in HISTOGRAMS:
        assert a._counts(column) == b._counts(column), column


@pytest.mark.parametrize("by_region", [True, False])
def test_raw_edges_read_the_same_figures_as_the_rollup_rows_of_the_same_probes(
    setup, by_region: bool
) -> None:
    t, routes = setup
    hours = window.task_stats(
        task_id=t.pk, route_ids=routes, since=T0, until=T0 + timedelta(hours=3), by_region=by_region
    )
    # The same probes (they start 10 s past each minute), read with both edges raw: 08:59:30
    # to 09:00 holds none, 11:00 to 11:59:30 is all of the last hour's.
    edged = window.task_stats(
        task_id=t.pk,
        route_ids=routes,
        since=T0 - timedelta(seconds=30),
        until=T0 + timedelta(hours=2, minutes=59, seconds=30),
        by_region=by_region,
    )
    # And an hour's probes raw, 10:00:05 to 11:00:05 (no whole hour inside).
    raw = window.task_stats(
        task_id=t.pk,
        route_ids=routes,
        since=T0 + timedelta(hours=1, seconds=5),
        until=T0 + timedelta(hours=2, seconds=5),
        by_region=by_region,
    )
    assert (
        window.edges(T0 + timedelta(hours=1, seconds=5), T0 + timedelta(hours=2, seconds=5)) is None
    )
    assert len(hours) == (4 if by_region else 2)
    assert hours.keys() == edged.keys() == raw.keys()
    for key in hours:
        if by_region:
            _same(edged[key], hours[key])
        else:  # the all-regions rows carry counts only
            for name in COUNTERS:
                assert getattr(edged[key], name) == getattr(hours[key], name)
        # 10:00 to 10:59 only (per region, or both merged): the window's edges are exact
        assert raw[key].count == (60 if by_region else 120)
    if by_region:
        key = next(iter(hours))
        e2e = percentile(edged[key].e2e_counts, 50)
        assert e2e == percentile(hours[key].e2e_counts, 50)
        assert e2e.n == 180 - 11  # one error every 17 minutes


def test_a_window_reads_exactly_its_minutes_not_the_hours_it_touches(setup) -> None:
    t, routes = setup
    now = T0 + timedelta(hours=2, minutes=25)  # 11:25: the window 11:15-11:25
    found = window.task_stats(
        task_id=t.pk, route_ids=routes, since=now - timedelta(minutes=10), until=now
    )
    assert {s.count for s in found.values()} == {10}
    # An hour and a half: 09:55-11:25, the hour 10:00 from the rollups.
    found = window.task_stats(
        task_id=t.pk, route_ids=routes, since=now - timedelta(minutes=90), until=now
    )
    assert {s.count for s in found.values()} == {90}


def test_an_edge_older_than_the_raw_results_kept_reads_its_hour_from_the_rollups(
    setup, settings
) -> None:
    t, routes = setup
    now = T0 + timedelta(hours=2, minutes=25)  # weeks ago: older than one day of raw results
    settings.RAW_RETENTION_DAYS = 1
    found = window.task_stats(
        task_id=t.pk, route_ids=routes, since=now - timedelta(minutes=10), until=now
    )
    assert {s.count for s in found.values()} == {60}  # the hour 11:00, as the rollups hold it
