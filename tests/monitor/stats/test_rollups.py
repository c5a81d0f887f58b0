"""Rollups hold counts and histograms per hour and day, per region and all regions merged;
reads over a window agree with a full read, and settled hours and days are read once (real
ingest into real PostgreSQL).
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from monitor.answer import selection
from monitor.models import GRAIN_DAY, GRAIN_HOUR, Rollup
from monitor.pipeline.ingest import results as ingest
from monitor.stats import hist, rollups
from tests.monitor import factories as f

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


@pytest.fixture
def setup(db: None):
    p = f.provider()
    r1, r2 = f.route(p, "m1"), f.route(p, "m2")
    eu, us = f.region("eu-west"), f.region("us-east")
    t = f.task("qa", [r1, r2], [eu, us], min_pass_rate=0.5)
    return t, r1, r2, eu, us


def test_rollups_hold_counts_histograms_and_merged_regions(setup) -> None:
    t, r1, _, eu, us = setup
    payloads = [
        f.payload(t, r1, eu, T0 + timedelta(minutes=i), ttft_ms=100.0 + i) for i in range(40)
    ]
    payloads += [f.payload(t, r1, us, T0 + timedelta(minutes=i), ttft_ms=300.0) for i in range(10)]
    payloads.append(
        f.payload(t, r1, eu, T0 + timedelta(minutes=50), outcome="error", error_kind="http_5xx")
    )
    ingest.ingest(payloads[:25])
    ingest.ingest(payloads[25:])  # a second batch adds to the same rows
    eu_hour = Rollup.objects.get(grain=GRAIN_HOUR, region=eu, route=r1)
    assert (eu_hour.count_ok, eu_hour.count_error) == (40, 1)
    assert eu_hour.error_kinds == {"http_5xx": 1}
    all_hour = Rollup.objects.get(grain=GRAIN_HOUR, region__isnull=True, route=r1)
    assert all_hour.count_ok == 50
    assert hist.total(all_hour.ttft_hist) == 50
    day = Rollup.objects.get(grain=GRAIN_DAY, region__isnull=True, route=r1)
    assert day.count == 51
    stats = rollups.Stats()
    stats.add_row(eu_hour)
    exact_p50 = sorted(100.0 + i for i in range(40))[19]
    assert stats.ttft_ms(50) == pytest.approx(exact_p50, rel=0.03)
    assert stats.ttft_ms(99) is None  # 40 samples are too few for a p99
    assert stats.error_rate == pytest.approx(1 / 41)


def test_stats_merge_each_histogram_when_first_read_exactly_as_row_by_row(setup) -> None:
    t, r1, _, eu, us = setup
    rng = random.Random(7)
    ingest.ingest(
        [
            f.payload(
                t,
                r1,
                g,
                T0 + timedelta(minutes=17 * i),
                ttft_ms=rng.lognormvariate(6, 0.5),
                ttfat_ms=rng.lognormvariate(6.5, 0.5),
                e2e_ms=rng.lognormvariate(7.5, 0.4),
                tps=rng.lognormvariate(4, 0.3),
            )
            for i in range(40)
            for g in (eu, us)
        ]
    )
    qs = rollups.rows(since=T0, until=T0 + timedelta(days=1), grain=GRAIN_HOUR, all_regions=True)
    assert qs.count() > 3  # several hours, so stats_by concatenates several arrays
    eager = rollups.Stats()
    for row in qs:
        eager.add_row(row)
    lazy = rollups.stats_by(qs, ["route_id"])[(r1.pk,)]
    # One histogram read first; the others are still merged right when read later.
    assert lazy.ref_e2e_counts == eager.ref_e2e_counts
    for name in ("ttft", "e2e", "tps", "ttfat", "ref_ttft", "ref_ttfat", "ref_e2e", "app_e2e"):
        assert getattr(lazy, f"{name}_counts") == getattr(eager, f"{name}_counts"), name
    assert sum(lazy.ttft_counts.values()) == 80
    # Folding unread stats into others merges what they hold.
    total, fresh = rollups.Stats(), rollups.stats_by(qs, ["route_id"])[(r1.pk,)]
    total.add(fresh)
    assert total.e2e_counts == eager.e2e_counts
    assert total.tps(50) == eager.tps(50)


def test_cache_hit_rate_tells_not_reported_from_zero(setup) -> None:
    t, r1, r2, eu, _ = setup
    ingest.ingest([f.payload(t, r1, eu, T0, cached_tokens=0), f.payload(t, r2, eu, T0)])
    reported = rollups.Stats()
    reported.add_row(Rollup.objects.get(grain=GRAIN_HOUR, region=eu, route=r1))
    unreported = rollups.Stats()
    unreported.add_row(Rollup.objects.get(grain=GRAIN_HOUR, region=eu, route=r2))
    assert reported.cache_hit_rate == 0.0
    assert unreported.cache_hit_rate is None


def test_the_sql_merge_of_histograms_matches_the_python_one(db: None) -> None:
    from django.db import connection

    a = hist.build([1.0, 5.0, 5.1, 900.0], hist.MS)
    b = hist.build([5.05, 900.0, 70_000.0], hist.MS)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rw_pairs_add(%s::int[], %s::int[]), rw_pairs_add('{}', '{}')", [a, b]
        )
        merged, empty = cursor.fetchone()
    assert merged == hist.merge([a, b])
    assert empty == []
    # Random histograms, either side empty or disjoint or overlapping: the merge the UPSERT
    # runs (migration 0021) agrees with Python's every time.
    rng = random.Random(7)
    cases = []
    for _ in range(200):
        left = [rng.lognormvariate(6, 1.5) for _ in range(rng.choice([0, 1, 3, 40]))]
        right = [rng.lognormvariate(6, 1.5) for _ in range(rng.choice([0, 1, 5, 300]))]
        cases.append((hist.build(left, hist.MS), hist.build(right, hist.MS)))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rw_pairs_add(l, r) FROM unnest(%s::text[], %s::text[]) AS c(lt, rt), "
            "LATERAL (SELECT lt::int[] AS l, rt::int[] AS r) AS arrays",
            [[_text(x) for x, _ in cases], [_text(y) for _, y in cases]],
        )
        got = [row[0] for row in cursor.fetchall()]
    assert got == [hist.merge([x, y]) for x, y in cases]


def _text(pairs: list[int]) -> str:
    return "{" + ",".join(map(str, pairs)) + "}"


def test_histogram_percentiles_track_exact_ones() -> None:
    values = [10 * 1.01**i for i in range(1000)]
    h = hist.build(values, hist.MS)
    exact = sorted(values)
    for q in (50, 95, 99):
        assert hist.percentile(h, q, hist.MS) == pytest.approx(
            exact[int(q / 100 * 1000) - 1], rel=0.03
        )
    assert hist.percentile(hist.build(values[:3], hist.MS), 50, hist.MS) is None


def _figures(window: selection.Window) -> dict[object, object]:
    """Every counter, histogram and time of a Window, comparable with ==."""
    out: dict[object, object] = {}
    for part, stats_by_key in (("region", window.per_region), ("route", window.per_route)):
        for key, s in stats_by_key.items():
            out[(part, key)] = (
                s.count,
                s.count_ok,
                s.provider_errors,
                s.graded,
                s.passed,
                s.last_probe_at,
                s.last_ok_at,
                s.error_kinds,
                *(
                    getattr(s, f"{name}_counts")
                    for name in ("ttft", "e2e", "tps", "ttfat", "ref_ttft", "ref_e2e")
                ),
            )
    return out


def test_the_overview_window_reads_its_settled_hours_once_and_agrees_with_a_full_read(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, r1, r2, eu, us = setup
    now = T0 + timedelta(hours=9, minutes=30)
    rng = random.Random(3)
    ingest.ingest(
        [
            f.payload(
                t,
                r,
                g,
                T0 + timedelta(minutes=13 * i),
                ttft_ms=rng.lognormvariate(6, 0.5),
                e2e_ms=rng.lognormvariate(7.5, 0.4),
                error_kind="http_5xx" if i % 9 == 0 else "",
                outcome="error" if i % 9 == 0 else "ok",
            )
            for i in range(44)  # T0 to T0 + 9 h 19 min: settled hours and recent ones
            for r in (r1, r2)
            for g in (eu, us)
        ]
    )
    since, until = now - timedelta(hours=24), now + timedelta(hours=1)
    full = selection.Window.read(since, until)
    first = selection.Window.read(since, until, keep_settled=True)
    again = selection.Window.read(since, until, keep_settled=True)
    assert _figures(first) == _figures(full) == _figures(again)
    assert sum(s.count for s in full.per_route.values()) == 176
    # A result for a settled hour (T0 + 1 h) arriving now is a late write: the kept hours are
    # read again at once, and agree with a full read.
    late = rollups.late_writes()
    ingest.ingest([f.payload(t, r1, eu, T0 + timedelta(hours=1, minutes=1))])
    assert rollups.late_writes() == late + 1
    assert full.per_region[(t.pk, r1.pk, eu.pk)].count + 1 == (
        selection.Window.read(since, until).per_region[(t.pk, r1.pk, eu.pk)].count
    )
    kept = selection.Window.read(since, until, keep_settled=True)
    assert _figures(kept) == _figures(selection.Window.read(since, until))
    first = kept
    # A result for a recent hour shows at once.
    ingest.ingest([f.payload(t, r2, us, now - timedelta(minutes=2))])
    kept = selection.Window.read(since, until, keep_settled=True)
    assert kept.per_region[(t.pk, r2.pk, us.pk)].count == (
        first.per_region[(t.pk, r2.pk, us.pk)].count + 1
    )
    monkeypatch.setattr(rollups, "SETTLED_TTL", 0.0)
    assert _figures(selection.Window.read(since, until, keep_settled=True)) == _figures(
        selection.Window.read(since, until)
    )


def test_the_hour_before_settles_once_its_slots_are_past_their_deadlines(setup) -> None:
    """The previous hour is read each time until its last slot's deadline (the longest probe
    deadline plus the grace and a tick) has passed, and kept after that: from about 20 past
    the hour, a window's read holds the current hour only. A result written into a settled
    hour after that is a late write, and kept hours are read again at once."""
    t, r1, _r2, eu, _us = setup
    ingest.ingest([f.payload(t, r1, eu, T0 + timedelta(hours=8, minutes=10 + i)) for i in range(5)])
    where = {"task_id": t.pk}
    settle = rollups.settled_after()
    assert timedelta(minutes=15) < settle < timedelta(minutes=30)

    def read(now: datetime) -> tuple[int, datetime]:
        """The count, and where the kept hours end."""
        found = rollups.stats_over(
            since=now - timedelta(hours=24),
            until=now + timedelta(hours=1),
            key_fields=["route_id"],
            all_regions=False,
            where=where,
            keep_settled=True,
        )
        kept_until = max(k[-1] for k in rollups._settled if k[-3] == (("task_id", t.pk),))
        return found[(r1.pk,)].count, kept_until

    early = T0 + timedelta(hours=9) + settle - timedelta(minutes=1)
    late = T0 + timedelta(hours=9) + settle + timedelta(minutes=1)
    assert read(early) == (5, T0 + timedelta(hours=8))  # 8:00-9:00 still read each time
    assert read(late) == (5, T0 + timedelta(hours=9))  # settled: kept
    # A probe with a long deadline: its result for 8:50 arrives just before the hour settles
    # (not a late write), then another one just after (a late write).
    writes = rollups.late_writes()
    with time_machine.travel(early - timedelta(minutes=1), tick=False):
        ingest.ingest([f.payload(t, r1, eu, T0 + timedelta(hours=8, minutes=50))])
    assert rollups.late_writes() == writes
    assert read(early)[0] == 6
    assert read(late) == (6, T0 + timedelta(hours=9))  # kept again, with it
    with time_machine.travel(late, tick=False):
        ingest.ingest([f.payload(t, r1, eu, T0 + timedelta(hours=8, minutes=51))])
    assert rollups.late_writes() == writes + 1
    assert read(late) == (7, T0 + timedelta(hours=9))


def test_one_read_gives_each_regions_figures_and_all_regions_merged(setup) -> None:
    """all_regions=None: the per-region rows and the all-regions rows in one read, the merged
    figures under region None, equal to what the two reads give apart (kept hours or not)."""
    t, r1, _r2, eu, us = setup
    now = T0 + timedelta(hours=9, minutes=30)
    ingest.ingest(
        [
            f.payload(t, r1, g, T0 + timedelta(minutes=17 * i), ttft_ms=100.0 + 7 * i)
            for i in range(33)
            for g in (eu, us)
        ]
    )
    window = {"since": now - timedelta(hours=24), "until": now + timedelta(hours=1)}
    where = {"task_id": t.pk, "route_id": r1.pk}
    for keep in (False, True, True):
        both = rollups.stats_over(
            **window, key_fields=["region_id"], all_regions=None, where=where, keep_settled=keep
        )
        each = rollups.stats_over(
            **window, key_fields=["region_id"], all_regions=False, where=where, keep_settled=keep
        )
        merged = rollups.stats_over(
            **window, key_fields=["route_id"], all_regions=True, where=where, keep_settled=keep
        )[(r1.pk,)]
        assert set(both) == {(eu.pk,), (us.pk,), (None,)}
        assert both[(None,)].count == merged.count == 66
        assert both[(None,)].ttft_counts == merged.ttft_counts
        for key in ((eu.pk,), (us.pk,)):
            assert both[key].count == each[key].count == 33
            assert both[key].ttft_counts == each[key].ttft_counts
    with pytest.raises(ValueError, match="region_id"):
        rollups.stats_over(**window, key_fields=["route_id"], all_regions=None, where=where)


def test_daily_rows_keep_their_settled_days_and_agree_with_a_full_read(setup) -> None:
    """Windows read by day (a page's 30 days): days that ended are read once and kept;
    today's row each time."""
    t, r1, r2, eu, _us = setup
    now = T0 + timedelta(days=3, hours=5)
    ingest.ingest(
        [
            f.payload(t, r, eu, T0 + timedelta(hours=7 * i), ttft_ms=200.0 + 11 * i)
            for i in range(11)  # T0 to T0 + 70 h: three settled days and today
            for r in (r1, r2)
        ]
    )
    window = {"since": T0 - timedelta(days=400), "until": now + timedelta(hours=1)}
    keys = ["task_id", "route_id", "region_id"]

    def read(keep: bool) -> dict[tuple[int | None, ...], rollups.Stats]:
        return rollups.stats_over(
            **window, grain="day", key_fields=keys, all_regions=False, keep_settled=keep
        )

    full, first, again = read(False), read(True), read(True)
    for got in (first, again):
        assert {k: (s.count, s.ttft_counts) for k, s in got.items()} == {
            k: (s.count, s.ttft_counts) for k, s in full.items()
        }
    assert full[(t.pk, r1.pk, eu.pk)].count == 11
    # A result today shows at once; the settled days are not read again.
    ingest.ingest([f.payload(t, r1, eu, now - timedelta(minutes=5))])
    assert read(True)[(t.pk, r1.pk, eu.pk)].count == 12
