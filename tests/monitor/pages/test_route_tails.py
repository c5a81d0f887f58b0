"""The route page's charts show the tail at realistic probe rates: a route probed every 5
minutes in a region has p50, p95 and p99 lines on the 24 h view, each tail point read over
the narrowest trailing span that holds its samples, with each point's sample count."""

from __future__ import annotations

import html
import json
import random
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client

from monitor.models import GRAIN_HOUR, Region, Rollup, Route, Task
from monitor.pages import route as pages_route
from monitor.pages import tails
from monitor.pages.common import RANGES
from monitor.pipeline.ingest import results as ingest
from monitor.stats import hist, rollups
from tests.monitor import factories as f
from tests.support import unfold_series

T0 = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=23, minutes=59)


def test_the_width_is_the_narrowest_that_holds_the_samples_a_tail_needs() -> None:
    # 12 probes an hour (every 5 minutes): p95 needs 20, p99 100.
    assert tails.choose_widths([12] * 24, max_width=6) == {95: 2, 99: 6}
    assert tails.choose_widths([12] * 24, max_width=42) == {95: 2, 99: 9}
    # The usual rate, not an odd busy hour; buckets without data do not count.
    assert tails.choose_widths([0, 0, 12, 12, 200, 12], max_width=42) == {95: 2, 99: 9}
    assert tails.choose_widths([120] * 24, max_width=6) == {95: 1, 99: 1}
    assert tails.choose_widths([0] * 24, max_width=6) == {95: 1, 99: 1}


@pytest.fixture
def probed(db: None) -> tuple[Task, Route, Region]:
    p = f.provider()
    route = f.route(p, "m1")
    eu = f.region("eu-west")
    task = f.task("qa", [route], [eu])
    rng = random.Random(7)
    payloads = [
        f.payload(
            task,
            route,
            eu,
            T0 + timedelta(minutes=5 * i),
            ttft_ms=rng.lognormvariate(6, 0.5),
            e2e_ms=rng.lognormvariate(7.5, 0.4),
            tps=rng.uniform(50, 150),
        )
        for i in range(24 * 12)
    ]
    ingest.ingest(payloads)
    return task, route, eu


def test_a_route_probed_every_5_minutes_has_p50_p95_and_p99_lines_over_24_h(
    probed: tuple[Task, Route, Region],
) -> None:
    task, route, eu = probed
    packed = pages_route.series(route, task, eu, RANGES["24h"], NOW)
    own = unfold_series(packed, with_tails=False)
    chart = unfold_series(packed)
    # One hour alone: p50 only (12 samples).
    assert all(v is None for v in own["ttft_ms"]["p95"])
    assert sum(v is not None for v in own["ttft_ms"]["p50"]) == 24
    # With the tails: p95 from the second hour on, p99 once 9 hours hold 100 samples.
    for metric in ("ttft_ms", "e2e_ms", "tps"):
        assert chart[metric]["p50"] == own[metric]["p50"]
        assert sum(v is not None for v in chart[metric]["p95"]) >= 23, metric
        assert sum(v is not None for v in chart[metric]["p99"]) >= 16, metric
    data = json.loads(packed)
    assert data["tails"]["p95"]["width"] == 2
    assert data["tails"]["p99"]["width"] == 9
    # Each point's own sample count; a tail's count is its span's.
    first = datetime.fromisoformat(data["start"])
    offset = (T0 - first) // timedelta(hours=1)
    assert data["counts"][offset : offset + 24] == [12] * 24
    assert data["tails"]["p95"]["samples"][offset + 5] == 24
    assert data["tails"]["p99"]["samples"][offset + 10] == 108
    assert chart["ttft_ms"]["p99"][offset + 7] is None  # 96 samples: too few
    assert chart["ttft_ms"]["p99"][offset + 8] is not None
    # p95 at an hour is the rollups' p95 over that hour and the one before.
    hours = {
        r.bucket_start: r
        for r in Rollup.objects.filter(grain=GRAIN_HOUR, task=task, route=route, region=eu)
    }
    at = T0 + timedelta(hours=5)
    merged = hist.merge([hours[at].ttft_hist, hours[at - timedelta(hours=1)].ttft_hist])
    expected = hist.percentile(merged, 95, hist.MS)
    assert expected is not None
    assert chart["ttft_ms"]["p95"][offset + 5] == pytest.approx(expected, abs=0.05)
    # The tail is a tail: above the median where both are drawn.
    assert all(
        p99 > p50
        for p50, p99 in zip(chart["e2e_ms"]["p50"], chart["e2e_ms"]["p99"], strict=True)
        if p99 is not None
    )


def test_the_route_page_says_what_a_point_is(
    probed: tuple[Task, Route, Region], client: Client, teammate: User
) -> None:
    task, route, eu = probed
    client.force_login(teammate)
    with time_machine.travel(NOW, tick=False):
        page = client.get(f"/routes/{route.pk}/?task={task.slug}&region={eu.slug}")
    body = html.unescape(page.content.decode())
    assert (
        "Each point is one hour: the p50 of that hour's successful probes, and the p95 of the"
        " 2 h and p99 of the 9 h ending with it"
    ) in body


@pytest.fixture
def uneven(db: None) -> tuple[Task, Route, Region]:
    """Two regions probed at rates that change from hour to hour: hours with no probe, hours
    whose every probe failed, a few slow outliers, over 3 days."""
    p = f.provider()
    route = f.route(p, "m1")
    eu, us = f.region("eu-west"), f.region("us-east")
    task = f.task("qa", [route], [eu, us])
    rng = random.Random(11)
    payloads = []
    for hour in range(72):
        for region in (eu, us):
            rate = rng.choice((0, 3, 6, 12, 12, 12, 30))
            failing = rng.random() < 0.05
            for i in range(rate):
                at = T0 + timedelta(hours=hour, minutes=60 * i / rate)
                slow = rng.random() < 0.02
                payloads.append(
                    f.payload(
                        task,
                        route,
                        region,
                        at,
                        ttft_ms=rng.lognormvariate(6, 0.5) * (40 if slow else 1),
                        ttfat_ms=rng.lognormvariate(6.5, 0.5),
                        e2e_ms=rng.lognormvariate(7.5, 0.4),
                        tps=rng.uniform(20, 150),
                        outcome="error" if failing else "ok",
                        error_kind="http_5xx" if failing else "",
                    )
                )
    ingest.ingest(payloads)
    return task, route, eu


@pytest.mark.parametrize("in_region", [True, False])
def test_every_tail_point_is_the_percentile_of_its_span_merged(
    uneven: tuple[Task, Route, Region], in_region: bool
) -> None:
    """Each tail point equals hist.percentile of its span's hourly histograms merged (the
    rollups' own rows, read apart), with the span's sample count; a point whose own hour has
    no successful probe is a gap."""
    task, route, eu = uneven
    region = eu if in_region else None
    now = T0 + timedelta(hours=71, minutes=30)
    window = RANGES["7d"]
    first = now.replace(minute=0) - timedelta(days=3) + timedelta(hours=5)
    count = 67
    counts, found = tails.tails(task, route, region, GRAIN_HOUR, first, count, window.length)
    rows = Rollup.objects.filter(grain=GRAIN_HOUR, task=task, route=route)
    rows = rows.filter(region=region) if region is not None else rows.filter(region__isnull=True)
    hours = {r.bucket_start: r for r in rows}
    assert counts == [
        hours[h].count_ok if (h := first + timedelta(hours=i)) in hours else 0 for i in range(count)
    ]
    assert set(found) == {95, 99}
    drawn = 0
    for q, tail in found.items():
        assert tail.width > 1
        for i in range(count):
            at = first + timedelta(hours=i)
            span = [hours[h] for w in range(tail.width) if (h := at - timedelta(hours=w)) in hours]
            if at not in hours or hours[at].count_ok == 0:
                assert (tail.points[i], tail.samples[i]) == (None, 0), (q, i)
                continue
            assert tail.samples[i] == sum(r.count_ok for r in span), (q, i)
            expected = [
                hist.percentile(hist.merge(getattr(r, column) for r in span), q, scale)
                for column, scale in tails.HISTOGRAMS
            ]
            assert tail.points[i] == expected, (q, i)
            drawn += expected[0] is not None
    assert drawn > 20  # the check is not about gaps only


@pytest.mark.parametrize("in_region", [True, False])
def test_the_chart_carries_the_counts_and_tails_of_the_rollup_rows_exactly(
    uneven: tuple[Task, Route, Region], in_region: bool
) -> None:
    """The chart data's counts (read in the chart's own query) and tails (each hour's
    histogram kept only from its top down, read with binary results) are those of the
    rollup rows: each tail point hist.percentile of its span merged, rounded as drawn. The
    uneven hours (3 to 30 probes, slow outliers) make windows whose tail sits 1 to 4
    samples from the top, so an hour cut too short gives a different point."""
    task, route, eu = uneven
    region = eu if in_region else None
    now = T0 + timedelta(hours=71, minutes=30)
    data = json.loads(pages_route.series(route, task, region, RANGES["7d"], now))
    first = datetime.fromisoformat(data["start"])
    rows = Rollup.objects.filter(grain=GRAIN_HOUR, task=task, route=route)
    rows = rows.filter(region=region) if region is not None else rows.filter(region__isnull=True)
    hours = {r.bucket_start: r for r in rows}
    at = [first + timedelta(hours=i) for i in range(data["count"])]
    assert data["counts"] == [hours[h].count_ok if h in hours else 0 for h in at]
    assert set(data["tails"]) == {"p95", "p99"}
    compared = 0
    for name, tail in data["tails"].items():
        q, width = int(name[1:]), tail["width"]
        for i, h in enumerate(at):
            if h not in hours or hours[h].count_ok == 0:
                assert (tail["points"][i], tail["samples"][i]) == (None, 0)
                continue
            span = [hours[s] for w in range(width) if (s := h - timedelta(hours=w)) in hours]
            assert tail["samples"][i] == sum(r.count_ok for r in span)
            expected = [
                hist.percentile(hist.merge(getattr(r, column) for r in span), q, scale)
                for column, scale in tails.HISTOGRAMS
            ]
            assert tail["points"][i] == [None if v is None else round(v, 1) for v in expected]
            compared += expected[1] is not None
    assert compared > 20


@pytest.mark.parametrize("in_region", [True, False])
def test_the_median_probe_is_chosen_against_the_rollups_e2e_median_of_the_last_24_h(
    uneven: tuple[Task, Route, Region], in_region: bool
) -> None:
    """Read on its own for the 7 d and 30 d pages (one histogram column of the hours the last
    24 h touch), the median is the figure the rollups' merged Stats of those 24 h give."""
    task, route, eu = uneven
    region = eu if in_region else None
    for minute in (0, 30, 59):
        now = T0 + timedelta(hours=71, minutes=minute)
        where = {"route_id": route.pk, "task_id": task.pk}
        if region is not None:
            where["region_id"] = region.pk
        day = rollups.stats_over(
            since=now - pages_route.RAW_WINDOW,
            until=now + timedelta(hours=1),
            key_fields=["route_id"],
            all_regions=region is None,
            where=where,
        )[(route.pk,)]
        expected = day.e2e_ms(50)
        assert expected is not None
        assert pages_route.e2e_median_24h(route, task, region, now) == expected
    # A route with no probe in the last 24 h has no median (and no median probe).
    later = T0 + timedelta(days=5)
    assert pages_route.e2e_median_24h(route, task, region, later) is None


def test_the_24_h_median_counts_the_whole_hour_the_window_starts_in(db: None) -> None:
    """As the rollups' Stats do: the window's first hour is read whole (its rows hold whole
    hours), here 300 slow probes that outvote the 240 fast ones after them."""
    p = f.provider()
    route = f.route(p, "m1")
    eu = f.region("eu-west")
    task = f.task("qa", [route], [eu])
    slow = [
        f.payload(task, route, eu, T0 + timedelta(seconds=10 * i), e2e_ms=5000.0)
        for i in range(300)
    ]
    fast = [
        f.payload(task, route, eu, T0 + timedelta(hours=h, minutes=5 * i), e2e_ms=500.0)
        for h in range(1, 25)
        for i in range(10)
    ]
    ingest.ingest(slow + fast)
    now = T0 + timedelta(hours=24, minutes=30)
    median = pages_route.e2e_median_24h(route, task, eu, now)
    assert median == pytest.approx(5000, rel=0.03)
    day = rollups.stats_over(
        since=now - pages_route.RAW_WINDOW,
        until=now + timedelta(hours=1),
        key_fields=["route_id"],
        all_regions=False,
        where={"route_id": route.pk, "task_id": task.pk, "region_id": eu.pk},
    )[(route.pk,)]
    assert median == day.e2e_ms(50)
