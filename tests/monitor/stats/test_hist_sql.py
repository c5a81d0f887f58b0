"""The percentiles PostgreSQL generates on each rollup row equal monitor.stats.hist's, bucket for
bucket: a chart point read ready-made must be the figure the histogram gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.models import GRAIN_HOUR, ROW_QUANTILES, Rollup
from monitor.pipeline.ingest import results as ingest
from monitor.stats import hist
from tests.monitor import factories as f
from tests.support import unfold_series

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def _sql_percentiles(pairs: list[int], scale: hist.Scale) -> list[float | None]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT rw_pairs_pcts(%s::int[], %s)", [pairs, scale.low])
        return list(cursor.fetchone()[0])


histograms = st.dictionaries(
    st.integers(min_value=0, max_value=hist.MS.size - 1),
    st.integers(min_value=1, max_value=60),
    max_size=40,
).map(lambda counts: hist._flatten(counts))


@pytest.mark.django_db
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pairs=histograms)
def test_sql_percentiles_equal_the_python_ones(pairs: list[int]) -> None:
    for scale in (hist.MS, hist.TPS):
        expected = hist.percentiles(pairs, ROW_QUANTILES, scale)
        assert _sql_percentiles(pairs, scale) == [_rounded(v) for v in expected]


def _rounded(value: float | None) -> float | None:
    """Rounded to 0.1 as the SQL function does: float8 to numeric keeps 15 significant digits,
    and numeric rounding takes halves away from zero."""
    if value is None:
        return None
    return float(Decimal(f"{value:.15g}").quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


@pytest.mark.django_db
def test_too_few_samples_give_none_per_percentile() -> None:
    # 30 samples: enough for p50 (5) and p95 (20), not for p99 (100)
    pairs = hist.build([float(v) for v in range(100, 130)], hist.MS)
    p50, p95, p99 = _sql_percentiles(pairs, hist.MS)
    assert p50 is not None
    assert p95 is not None
    assert p99 is None
    assert _sql_percentiles([], hist.MS) == [None, None, None]


@pytest.mark.django_db
def test_rollup_rows_keep_their_percentiles_through_every_upsert() -> None:
    p = f.provider()
    route = f.route(p, "m1")
    eu = f.region("eu-west")
    task = f.task("qa", [route], [eu])
    first = [
        f.payload(task, route, eu, T0 + timedelta(seconds=i), ttft_ms=100.0) for i in range(10)
    ]
    later = [
        f.payload(task, route, eu, T0 + timedelta(seconds=100 + i), ttft_ms=900.0)
        for i in range(30)
    ]
    ingest.ingest(first)
    row = Rollup.objects.get(grain=GRAIN_HOUR, region=eu)
    assert row.ttft_pcts == [
        _rounded(v) for v in hist.percentiles(row.ttft_hist, ROW_QUANTILES, hist.MS)
    ]
    assert row.ttft_pcts[0] == pytest.approx(100.0, rel=0.03)
    assert row.ttft_pcts[1] is None  # 10 samples: too few for p95
    ingest.ingest(later)  # the UPSERT merges histograms; the generated column follows
    row.refresh_from_db()
    assert hist.total(row.ttft_hist) == 40
    assert row.ttft_pcts == [
        _rounded(v) for v in hist.percentiles(row.ttft_hist, ROW_QUANTILES, hist.MS)
    ]
    assert row.ttft_pcts[0] == pytest.approx(900.0, rel=0.03)
    assert row.tps_pcts == [
        _rounded(v) for v in hist.percentiles(row.tps_hist, ROW_QUANTILES, hist.TPS)
    ]


@pytest.mark.django_db
def test_a_route_chart_has_one_point_per_hour_with_its_rollup_percentiles_or_a_gap() -> None:
    from monitor.pages import route as pages_route
    from monitor.pages.common import RANGES

    p = f.provider()
    route = f.route(p, "m1")
    eu, us = f.region("eu-west"), f.region("us-east")
    task = f.task("qa", [route], [eu, us])
    payloads = []
    for hour in range(3):
        for i in range(25):
            at = T0 + timedelta(hours=hour, seconds=i)
            payloads.append(f.payload(task, route, eu, at, ttft_ms=100.0 * (hour + 1) + i))
            payloads.append(f.payload(task, route, us, at, ttft_ms=1000.0, tps=50.0))
    ingest.ingest(payloads)
    now = T0 + timedelta(hours=3)
    for region in (None, eu):
        chart = unfold_series(
            pages_route.series(route, task, region, RANGES["24h"], now), with_tails=False
        )
        # 24 h back from 13:00: 25 hours, the three probed ones last but one
        assert len(chart["labels"]) == 25
        assert chart["labels"][0] == "11-01 13:00"
        assert chart["labels"][21:] == ["11-02 10:00", "11-02 11:00", "11-02 12:00", "11-02 13:00"]
        rows = Rollup.objects.filter(grain=GRAIN_HOUR, route=route, region=region)
        for i, row in enumerate(rows.order_by("bucket_start"), start=21):
            for key, pairs, scale in (
                ("ttft_ms", row.ttft_hist, hist.MS),
                ("tps", row.tps_hist, hist.TPS),
            ):
                expected = hist.percentiles(pairs, ROW_QUANTILES, scale)
                for q, value in zip(ROW_QUANTILES, expected, strict=True):
                    point = chart[key][f"p{q}"][i]
                    assert point == (None if value is None else pytest.approx(value, abs=0.05))
        # Hours without a rollup row are gaps, never a line drawn across them
        for key in ("ttft_ms", "e2e_ms", "tps"):
            for values in chart[key].values():
                assert values[:21] == [None] * 21
                assert values[24] is None
    # 25 probes an hour in one region: p99 needs 100, so the region's chart says "too few"
    eu_chart = unfold_series(
        pages_route.series(route, task, eu, RANGES["24h"], now), with_tails=False
    )
    assert eu_chart["ttft_ms"]["p99"][21:24] == [None, None, None]
    assert eu_chart["ttft_ms"]["p50"][21] == pytest.approx(112, rel=0.03)
    empty = unfold_series(
        pages_route.series(route, task, us, RANGES["24h"], T0 - timedelta(days=3))
    )
    assert len(empty["labels"]) == 25
    assert empty["ttft_ms"]["p50"] == [None] * 25
