"""The route page: one route's percentiles over time by region, its median probe as a
waterfall, errors, cache, rate-limit headroom and probe-option comparisons.

Percentiles come from the rollups (hourly or daily histograms, one chart point per bucket).
Raw results are read only where rollups cannot answer, each read bounded to the last 24 hours
of this route through the (route, started_at) index: the median probe, the latest rate-limit
headers, and the option comparisons (which rollups do not split).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypedDict

from django.db import connection
from django.db.models import F, FloatField, Func, Q

from monitor import hist, rollups
from monitor.models import (
    GRAIN_DAY,
    GRAIN_HOUR,
    OUTCOME_OK,
    ROW_QUANTILES,
    ProbeResult,
    Region,
    Route,
    Task,
)
from monitor.overview import stale_after
from monitor.pages import Range
from monitor.rollups import Stats

QUANTILES = ROW_QUANTILES
RAW_WINDOW = timedelta(hours=24)
COMPARISON_ROWS = 5000  # most recent raw rows read for the option comparisons


class Series(TypedDict):
    labels: list[str]
    ttft_ms: dict[str, list[float | None]]
    e2e_ms: dict[str, list[float | None]]
    tps: dict[str, list[float | None]]


class Segment(TypedDict):
    name: str
    start_ms: float
    end_ms: float


@dataclass
class RegionSummary:
    region: Region | None  # None: all regions merged
    stats: Stats
    stale: bool

    def figures(self, metric: str) -> list[float | None]:
        if metric == "tps":
            return [self.stats.tps(q) for q in QUANTILES]
        if metric == "ttft_ms":
            return [self.stats.ttft_ms(q) for q in QUANTILES]
        return [self.stats.e2e_ms(q) for q in QUANTILES]

    @property
    def ttft(self) -> list[float | None]:
        return self.figures("ttft_ms")

    @property
    def e2e(self) -> list[float | None]:
        return self.figures("e2e_ms")

    @property
    def speed(self) -> list[float | None]:
        return self.figures("tps")


@dataclass
class Headroom:
    region: Region
    started_at: datetime | None
    remaining_requests: int | None
    remaining_tokens: int | None
    retry_after_s: float | None
    throttled: int  # http_429 results in the window


@dataclass
class OptionGroup:
    value: str
    probes: int
    ok: int
    ttft_p50_ms: float | None
    e2e_p50_ms: float | None
    upload_p50_ms: float | None
    setup_p50_ms: float | None  # dns + connect + tls, where there was any
    mean_request_bytes: float | None


@dataclass
class Comparison:
    dimension: str
    groups: list[OptionGroup]


@dataclass
class RoutePage:
    route: Route
    tasks: list[Task]
    task: Task | None
    regions: list[Region]
    region: Region | None
    range: Range
    series: Series
    summaries: list[RegionSummary]
    selected: Stats | None
    error_kinds: list[tuple[str, int]]
    median_probe: dict[str, Any] | None
    waterfall: list[Segment]
    headroom: list[Headroom]
    comparisons: list[Comparison] = field(default_factory=list)
    now: datetime | None = None

    @property
    def has_data(self) -> bool:
        return self.selected is not None and self.selected.count > 0

    @property
    def stale(self) -> bool:
        return bool(self.summaries) and all(s.stale for s in self.summaries)

    @property
    def few_for_p99(self) -> bool:
        return self.selected is not None and self.selected.count_ok < hist.MIN_SAMPLES[99]


# One chart series in one row: PostgreSQL labels the points and transposes each rollup row's
# ready-made percentiles (Rollup.*_pcts, already rounded to 0.1) into one array per line, so
# Python only names them.
_LABEL_FORMATS = {GRAIN_DAY: "YYYY-MM-DD", GRAIN_HOUR: "MM-DD HH24:00"}
_SERIES_LINES = [
    (key, column, q, i)
    for key, column in (("ttft_ms", "ttft_pcts"), ("e2e_ms", "e2e_pcts"), ("tps", "tps_pcts"))
    for i, q in enumerate(QUANTILES, start=1)
]
_SERIES_SQL = (
    "SELECT array_agg(to_char(bucket_start AT TIME ZONE 'UTC', %s) ORDER BY bucket_start), "
)
_SERIES_SQL += ", ".join(
    f"array_agg({column}[{i}] ORDER BY bucket_start)" for _, column, _, i in _SERIES_LINES
)
_SERIES_SQL += " FROM ({rows}) AS points"


def series(route: Route, task: Task, region: Region | None, window: Range, now: datetime) -> Series:
    qs = rollups.rows(
        since=window.since(now),
        until=now + timedelta(hours=1),
        grain=window.series_grain,
        all_regions=region is None,
    ).filter(route=route, task=task)
    if region is not None:
        qs = qs.filter(region=region)
    rows_sql, params = (
        qs.order_by()
        .values("bucket_start", "ttft_pcts", "e2e_pcts", "tps_pcts")
        .query.sql_with_params()
    )
    with connection.cursor() as cursor:
        cursor.execute(
            _SERIES_SQL.replace("{rows}", rows_sql),
            [_LABEL_FORMATS[window.series_grain], *params],
        )
        labels, *lines = cursor.fetchone()
    out = Series(labels=labels or [], ttft_ms={}, e2e_ms={}, tps={})
    for (key, _, q, _), values in zip(_SERIES_LINES, lines, strict=True):
        out[key][f"p{q}"] = values or []  # type: ignore[literal-required]
    return out


class _Abs(Func):
    function = "ABS"
    output_field = FloatField()


def median_probe(
    route: Route, task: Task, region: Region | None, now: datetime
) -> dict[str, Any] | None:
    """The successful probe of the last 24 h whose e2e is nearest the rollups' median."""
    since = now - RAW_WINDOW
    qs = rollups.rows(
        since=since, until=now + timedelta(hours=1), grain="hour", all_regions=region is None
    )
    qs = qs.filter(route=route, task=task)
    if region is not None:
        qs = qs.filter(region=region)
    stats = rollups.stats_by(qs, ["route_id"]).get((route.pk,))
    median = stats.e2e_ms(50) if stats else None
    if median is None:
        return None
    raw = ProbeResult.objects.filter(
        route=route, started_at__gte=since, outcome=OUTCOME_OK, task=task, e2e_ms__isnull=False
    )
    if region is not None:
        raw = raw.filter(region=region)
    return (
        raw.annotate(distance=_Abs(F("e2e_ms") - median))
        .order_by("distance")
        .values(
            "id",
            "started_at",
            "region__name",
            "dns_ms",
            "connect_ms",
            "tls_ms",
            "upload_ms",
            "ttfb_ms",
            "ttft_ms",
            "e2e_ms",
            "output_tokens",
            "tps",
            "http_version",
            "cold",
        )
        .first()
    )


def waterfall(probe: dict[str, Any] | None) -> list[Segment]:
    """dns, connect, tls, upload, queue+prefill, decode, each from t0 (ms); phases a reused
    connection skipped are left out."""
    if probe is None or probe["ttft_ms"] is None or probe["e2e_ms"] is None:
        return []
    segments: list[Segment] = []
    at = 0.0
    for name, key in (("dns", "dns_ms"), ("connect", "connect_ms"), ("tls", "tls_ms")):
        if probe[key]:
            segments.append(Segment(name=name, start_ms=at, end_ms=at + probe[key]))
            at += probe[key]
    upload_end = max(at, probe["upload_ms"] or at)
    segments.append(Segment(name="upload", start_ms=at, end_ms=upload_end))
    ttft = max(upload_end, probe["ttft_ms"])
    segments.append(Segment(name="queue + prefill", start_ms=upload_end, end_ms=ttft))
    segments.append(Segment(name="decode", start_ms=ttft, end_ms=max(ttft, probe["e2e_ms"])))
    return [
        Segment(name=s["name"], start_ms=round(s["start_ms"], 1), end_ms=round(s["end_ms"], 1))
        for s in segments
    ]


def headroom(
    route: Route, regions: list[Region], window_stats: dict[int | None, Stats], now: datetime
) -> list[Headroom]:
    """The latest rate-limit headers per region (one DISTINCT ON read of the last 24 h)."""
    latest = {
        row["region_id"]: row
        for row in ProbeResult.objects.filter(
            route=route, region__in=regions, started_at__gte=now - RAW_WINDOW
        )
        .filter(
            Q(ratelimit_remaining_requests__isnull=False)
            | Q(ratelimit_remaining_tokens__isnull=False)
            | Q(retry_after_s__isnull=False)
        )
        .order_by("region_id", "-started_at")
        .distinct("region_id")
        .values(
            "region_id",
            "started_at",
            "ratelimit_remaining_requests",
            "ratelimit_remaining_tokens",
            "retry_after_s",
        )
    }
    out = []
    for region in regions:
        row = latest.get(region.pk)
        stats = window_stats.get(region.pk)
        out.append(
            Headroom(
                region=region,
                started_at=row["started_at"] if row else None,
                remaining_requests=row["ratelimit_remaining_requests"] if row else None,
                remaining_tokens=row["ratelimit_remaining_tokens"] if row else None,
                retry_after_s=row["retry_after_s"] if row else None,
                throttled=stats.error_kinds.get("http_429", 0) if stats else 0,
            )
        )
    return out


_DIMENSIONS = (
    ("HTTP version", lambda r: "HTTP/2" if r["http2"] else "HTTP/1.1"),
    ("connection", lambda r: "cold" if r["cold"] else "warm"),
    (
        "request body",
        lambda r: "msgpack + gzip" if r["body_encoding"] == "msgpack-gzip" else "JSON",
    ),
    ("prompt prefix", lambda r: r["prefix_mode"]),
)


def _p50(values: list[float]) -> float | None:
    return hist.percentile(hist.build(values, hist.MS), 50, hist.MS) if values else None


def comparisons(route: Route, task: Task, region: Region | None, now: datetime) -> list[Comparison]:
    """Side by side, for each probe option this task probed both ways (last 24 h)."""
    raw = ProbeResult.objects.filter(route=route, task=task, started_at__gte=now - RAW_WINDOW)
    if region is not None:
        raw = raw.filter(region=region)
    rows: list[dict[str, Any]] = [
        dict(r)
        for r in raw.order_by("-started_at").values(
            "http2",
            "cold",
            "body_encoding",
            "prefix_mode",
            "outcome",
            "dns_ms",
            "connect_ms",
            "tls_ms",
            "upload_ms",
            "ttft_ms",
            "e2e_ms",
            "request_bytes",
        )[:COMPARISON_ROWS]
    ]
    out = []
    for dimension, key in _DIMENSIONS:
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            groups[key(r)].append(r)
        if len(groups) < 2:
            continue
        stats = []
        for value, members in sorted(groups.items()):
            ok = [m for m in members if m["outcome"] == OUTCOME_OK]
            setup = [
                (m["dns_ms"] or 0) + (m["connect_ms"] or 0) + (m["tls_ms"] or 0)
                for m in ok
                if m["connect_ms"] is not None
            ]
            sizes = [m["request_bytes"] for m in members if m["request_bytes"] is not None]
            stats.append(
                OptionGroup(
                    value=value,
                    probes=len(members),
                    ok=len(ok),
                    ttft_p50_ms=_p50([m["ttft_ms"] for m in ok if m["ttft_ms"] is not None]),
                    e2e_p50_ms=_p50([m["e2e_ms"] for m in ok if m["e2e_ms"] is not None]),
                    upload_p50_ms=_p50([m["upload_ms"] for m in ok if m["upload_ms"] is not None]),
                    setup_p50_ms=_p50(setup),
                    mean_request_bytes=sum(sizes) / len(sizes) if sizes else None,
                )
            )
        out.append(Comparison(dimension=dimension, groups=stats))
    return out


def build(
    route: Route, task: Task | None, region: Region | None, window: Range, now: datetime
) -> RoutePage:
    tasks = list(route.tasks.filter(is_active=True).order_by("name"))
    if task is None:
        return RoutePage(
            route=route,
            tasks=tasks,
            task=None,
            regions=[],
            region=None,
            range=window,
            series=Series(labels=[], ttft_ms={}, e2e_ms={}, tps={}),
            summaries=[],
            selected=None,
            error_kinds=[],
            median_probe=None,
            waterfall=[],
            headroom=[],
            now=now,
        )
    regions = list(task.regions.filter(is_active=True).order_by("name"))
    until = now + timedelta(hours=1)
    per_region = rollups.stats_by(
        rollups.rows(since=window.since(now), until=until, grain=window.stats_grain).filter(
            route=route, task=task
        ),
        ["region_id"],
    )
    merged = rollups.stats_by(
        rollups.rows(
            since=window.since(now), until=until, grain=window.stats_grain, all_regions=True
        ).filter(route=route, task=task),
        ["route_id"],
    ).get((route.pk,))
    limit = stale_after(task)

    def is_stale(s: Stats) -> bool:
        return s.last_probe_at is None or now - s.last_probe_at > limit

    summaries = []
    by_region: dict[int | None, Stats] = {k[0]: s for k, s in per_region.items()}
    for g in regions:
        if g.pk in by_region:
            summaries.append(RegionSummary(g, by_region[g.pk], is_stale(by_region[g.pk])))
    if merged is not None:
        summaries.append(RegionSummary(None, merged, is_stale(merged)))
    selected = by_region.get(region.pk) if region is not None else merged
    kinds = sorted((selected.error_kinds if selected else {}).items(), key=lambda kv: -kv[1])
    probe = median_probe(route, task, region, now)
    return RoutePage(
        route=route,
        tasks=tasks,
        task=task,
        regions=regions,
        region=region,
        range=window,
        series=series(route, task, region, window, now),
        summaries=summaries,
        selected=selected,
        error_kinds=kinds,
        median_probe=probe,
        waterfall=waterfall(probe),
        headroom=headroom(route, regions if region is None else [region], by_region, now),
        comparisons=comparisons(route, task, region, now),
        now=now,
    )
