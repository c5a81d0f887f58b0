"""The route page: one route's percentiles over time by region, its median probe as a
waterfall, errors, cache, rate-limit headroom and probe-option comparisons.

Percentiles come from the rollups (hourly or daily histograms, one chart point per bucket;
hourly points are read from the hour strips PostgreSQL keeps from the hourly rollups).
Raw results are read only where rollups cannot answer, each read bounded through the
(route, started_at) index: the latest rate-limit headers (last hour), and the selected window's
most recent COMPARISON_ROWS probes, for the option comparisons (which rollups do not split)
and the median probe (the one of the last 24 hours nearest the rollups' median).

The chart data is monitor.pages.route_chart's, the option comparisons and reasoning figures
monitor.pages.route_options'; this module reads the rest and puts the page together (build).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from django.db import connection
from django.db.models import FloatField, Func
from django.utils.safestring import SafeString

from monitor.models import (
    BODY_MSGPACK_GZIP,
    GRAIN_HOUR,
    HTTP_2,
    OUTCOME_OK,
    ROW_QUANTILES,
    ProbeResult,
    Region,
    Rollup,
    Route,
    Task,
)
from monitor.pages.common import Range
from monitor.pages.route_chart import NO_SERIES, series_with_note

# The chart data moved to route_chart; tests, bench_scale and comments still name it here.
from monitor.pages.route_chart import SERIES_METRICS as SERIES_METRICS
from monitor.pages.route_chart import series as series
from monitor.pages.route_options import Comparison, Reasoning, comparisons, reasoning
from monitor.pages.server_time import ServerShare, server_time
from monitor.stats import hist, rollups
from monitor.stats.confidence import Rate
from monitor.stats.rollups import Stats
from probes.errors import Kind, counts_against_provider

QUANTILES = ROW_QUANTILES
RAW_WINDOW = timedelta(hours=24)
# Most recent raw rows read for the option comparisons and the median probe: 5,000 took 90 ms
# to read and group on a route probed by 20 tasks from 6 regions; 2,000 still split into
# groups large enough for a p95 with its interval.
COMPARISON_ROWS = 2000
# The newest part of the window read first for them holds this many times COMPARISON_ROWS by
# the rollups' count (probes are not spread exactly evenly).
COMPARISON_MARGIN = 1.5
# Headroom is about now: the latest headers of the last hour. Over 24 h, a route probed by 20
# tasks from 6 regions has 172,800 rows to search when its provider sends no such headers
# (34 ms); an hour has 7,200.
HEADROOM_WINDOW = timedelta(hours=1)


class Segment(TypedDict):
    name: str
    start_ms: float
    end_ms: float


@dataclass
class CallFigures:
    """A scenario task's calls (ProbeResult rows with a scenario), as histograms: its rollups
    hold one app e2e sample per scenario, not the calls' own TTFT, e2e and speed."""

    calls: int  # successful calls
    ttft: hist.Pairs
    e2e: hist.Pairs
    tps: hist.Pairs

    def figures(self, metric: str) -> list[float | None]:
        pairs, scale = {
            "ttft_ms": (self.ttft, hist.MS),
            "e2e_ms": (self.e2e, hist.MS),
            "tps": (self.tps, hist.TPS),
        }[metric]
        return hist.percentiles(pairs, QUANTILES, scale)


@dataclass
class RegionSummary:
    region: Region | None  # None: all regions merged
    stats: Stats
    stale: bool
    calls: CallFigures | None = None  # a scenario task's calls: what TTFT, e2e, speed read

    def figures(self, metric: str) -> list[float | None]:
        if self.calls is not None:
            return self.calls.figures(metric)
        if metric == "tps":
            return [self.stats.tps(q) for q in QUANTILES]
        if metric == "ttft_ms":
            return [self.stats.ttft_ms(q) for q in QUANTILES]
        return [self.stats.e2e_ms(q) for q in QUANTILES]

    @property
    def errors(self) -> Rate:
        """The provider's failures out of its attempts, with its interval: what the availability
        bar judges, as the overview shows it. Slots our workers missed and failures that are ours
        (configuration, engine) are not the route's: `missed` is shown apart."""
        return Rate(self.stats.provider_errors, self.stats.attempts)

    @property
    def missed(self) -> int:
        return self.stats.count_missed

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
class RoutePage:
    route: Route
    tasks: list[Task]
    task: Task | None
    regions: list[Region]
    region: Region | None
    range: Range
    series: SafeString  # chart data as JSON text (series)
    summaries: list[RegionSummary]
    selected: Stats | None
    error_kinds: list[tuple[str, int]]  # the route's failures (its availability)
    median_probe: dict[str, Any] | None
    waterfall: list[Segment]
    headroom: list[Headroom]
    comparisons: list[Comparison] = field(default_factory=list)
    reasoning: Reasoning | None = None
    our_kinds: list[tuple[str, int]] = field(default_factory=list)  # ours, never the route's
    server_time: list[ServerShare] = field(default_factory=list)  # per region, where reported
    not_sent: list[str] = field(default_factory=list)
    now: datetime | None = None
    point_note: str = ""  # what a chart point is (monitor.pages.tails.describe)

    @property
    def has_data(self) -> bool:
        return self.selected is not None and self.selected.count > 0

    @property
    def stale(self) -> bool:
        return bool(self.summaries) and all(s.stale for s in self.summaries)

    @property
    def few_for_p99(self) -> bool:
        return self.selected is not None and self.selected.count_ok < hist.MIN_SAMPLES[99]


def median_probe(
    rows: list[Any], median: float | None, regions: list[Region], now: datetime
) -> dict[str, Any] | None:
    """The successful probe of the last 24 h whose e2e is nearest `median` (the rollups' e2e
    p50 over the last 24 h), among `rows` (the most recent probes, comparison_rows): no raw
    read of its own, which over a route probed by 20 tasks from 6 regions scanned 172,800
    index entries (13 ms)."""
    if median is None:
        return None
    since = (now - RAW_WINDOW).timestamp()
    candidates = [
        r for r in rows if r.outcome == OUTCOME_OK and r.e2e_ms is not None and r.at >= since
    ]
    if not candidates:
        return None
    # min() keeps the first of equals: rows are newest first.
    chosen = min(candidates, key=lambda r: abs(r.e2e_ms - median))
    probe: dict[str, Any] = chosen._asdict()
    probe["started_at"] = datetime.fromtimestamp(probe.pop("at"), UTC)
    names = {g.pk: g.name for g in regions}
    probe["region_name"] = names.get(probe["region_id"]) or (
        Region.objects.values_list("name", flat=True).get(pk=probe["region_id"])
    )
    return probe


# The e2e histograms of the hours the last RAW_WINDOW touches, as rollups.stats_over reads
# them (bucket_start from the hour of now - 24 h, before now + 1 h), concatenated by
# PostgreSQL (rw_cat, migration 0002), through the route's index (tails._ROWS says why
# `task_id + 0`).
_E2E_24H_SQL = f"""
SELECT rw_cat(e2e_hist) FROM {Rollup._meta.db_table}
WHERE grain = %(grain)s AND task_id + 0 = %(task)s AND route_id = %(route)s
  AND region_id {{region}} AND bucket_start >= %(since)s AND bucket_start < %(until)s
"""


def e2e_median_24h(route: Route, task: Task, region: Region | None, now: datetime) -> float | None:
    """The rollups' e2e p50 over the last RAW_WINDOW of the route for the task (in `region`,
    or all regions merged): what the median probe is chosen against when the page shows
    another window. The same figure as rollups.stats_over's Stats.e2e_ms(50) over that window,
    which read every counter, error kind and histogram of it for this one percentile (a
    fifth of the 7-day page's server time)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _E2E_24H_SQL.replace("{region}", "IS NULL" if region is None else "= %(region)s"),
            {
                "grain": GRAIN_HOUR,
                "task": task.pk,
                "route": route.pk,
                "region": region.pk if region is not None else None,
                "since": rollups.bucket_start(now - RAW_WINDOW, GRAIN_HOUR),
                "until": now + timedelta(hours=1),
            },
        )
        found = cursor.fetchone()[0]
    return hist.percentile(hist.merge([found or []]), 50, hist.MS)


# A scenario task's call figures read at most this many successful calls per region (the
# newest): 10 calls a scenario, one scenario an interval.
CALL_ROWS = 5000


def call_figures(
    route: Route, task: Task, regions: list[Region], since: datetime
) -> dict[int | None, CallFigures]:
    """Per region and all regions merged (under None), the TTFT, e2e and speed of a scenario
    task's successful calls on the route over the window (the newest CALL_ROWS of each
    region), through the (route, started_at) index."""
    per_region: dict[int | None, CallFigures] = {}
    merged: list[tuple[float | None, float | None, float | None]] = []
    for region in regions:
        rows = list(
            ProbeResult.objects.filter(
                route=route,
                task=task,
                region=region,
                scenario__isnull=False,
                outcome=OUTCOME_OK,
                started_at__gte=since,
            )
            .order_by("-started_at")
            .values_list("ttft_ms", "e2e_ms", "tps")[:CALL_ROWS]
        )
        if rows:
            per_region[region.pk] = _call_figures(rows)
            merged.extend(rows)
    if merged:
        per_region[None] = _call_figures(merged)
    return per_region


def _call_figures(rows: list[tuple[float | None, float | None, float | None]]) -> CallFigures:
    return CallFigures(
        calls=len(rows),
        ttft=hist.build((r[0] for r in rows), hist.MS),
        e2e=hist.build((r[1] for r in rows), hist.MS),
        tps=hist.build((r[2] for r in rows), hist.TPS),
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


_HEADROOM_SQL = f"""
SELECT g.id, r.started_at, r.ratelimit_remaining_requests, r.ratelimit_remaining_tokens,
       r.retry_after_s
FROM unnest(%(regions)s::bigint[]) AS g(id)
CROSS JOIN LATERAL (
    SELECT p.started_at, p.ratelimit_remaining_requests, p.ratelimit_remaining_tokens,
           p.retry_after_s
    FROM {ProbeResult._meta.db_table} p
    WHERE p.route_id = %(route)s AND p.region_id = g.id AND p.started_at >= %(since)s
      AND (p.ratelimit_remaining_requests IS NOT NULL
           OR p.ratelimit_remaining_tokens IS NOT NULL OR p.retry_after_s IS NOT NULL)
    ORDER BY p.started_at DESC
    LIMIT 1
) AS r
"""


def headroom(
    route: Route, regions: list[Region], window_stats: dict[int | None, Stats], now: datetime
) -> list[Headroom]:
    """The latest rate-limit headers per region, from the last hour: for each region, the
    route's (route, started_at) index read backwards to its first row with headers (0.2 ms
    where the provider sends them; 10 ms over an hour of 7,200 rows where it never does). One
    DISTINCT ON over the hour's rows, sorted, took 7-29 ms either way."""
    with connection.cursor() as cursor:
        cursor.execute(
            _HEADROOM_SQL,
            {
                "regions": [g.pk for g in regions],
                "route": route.pk,
                "since": now - HEADROOM_WINDOW,
            },
        )
        latest = {
            row[0]: dict(
                zip(
                    (
                        "started_at",
                        "ratelimit_remaining_requests",
                        "ratelimit_remaining_tokens",
                        "retry_after_s",
                    ),
                    row[1:],
                    strict=True,
                )
            )
            for row in cursor.fetchall()
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
                throttled=stats.error_kinds.get(Kind.HTTP_429, 0) if stats else 0,
            )
        )
    return out


def not_sent(route: Route, task: Task) -> list[str]:
    """Options the task asks for that this route's provider cannot take (so are not sent)."""
    provider = route.provider
    notes = []
    if HTTP_2 in task.http_versions and not provider.http2:
        notes.append(
            f"HTTP/2: {provider.name} is not set to support it, so its probes use HTTP/1.1."
        )
    if BODY_MSGPACK_GZIP in task.body_encodings and not provider.accepts_msgpack:
        notes.append(
            f"msgpack + gzip bodies: {provider.name} does not accept them, so its probes send "
            "JSON (a msgpack probe would only fail for a reason that is ours)."
        )
    return notes


_COMPARISON_FIELDS = (
    "id",
    "region_id",
    "http_version",
    "connection_reused",
    "cold",
    "body_encoding",
    "prefix_mode",
    "served_model",
    "service_tier",
    "outcome",
    "dns_ms",
    "connect_ms",
    "tls_ms",
    "upload_ms",
    "ttft_ms",
    "ttfat_ms",
    "e2e_ms",
    "request_bytes",
    "reasoning_tokens",
    "hidden_reasoning_tokens",
    "tps_token_source",
    "server_ms",
)


class _Epoch(Func):
    """A timestamp as seconds since 1970 (a float): 2,000 of them load in a fraction of the
    time Django's time-zone-aware datetime loader takes, which ran in Python for each."""

    template = "extract(epoch from %(expressions)s)::float8"
    output_field = FloatField()

    @property
    def convert_value(self) -> Any:
        # psycopg loads float8 as float already: no converter called for each row.
        return self._convert_value_noop  # type: ignore[attr-defined]


def comparison_rows(
    route: Route,
    task: Task,
    region: Region | None,
    since: datetime,
    now: datetime,
    probes: int,
) -> list[Any]:
    """The window's most recent raw rows (at most COMPARISON_ROWS, see _newest), newest first, for
    comparisons, the reasoning figures and the median probe. `probes`: how many the window
    holds (its rollups' count). When that is many more than COMPARISON_ROWS, only the newest
    part of the window that should hold them is read (its share, COMPARISON_MARGIN times):
    no index orders a (task, route)'s rows by time, so PostgreSQL reads and sorts
    every row of what it is asked for (8,640 over 24 h at one probe a minute from 6 regions,
    for 2,000). Should that part hold fewer, the whole window is read."""
    start = since
    if probes > COMPARISON_ROWS:
        start = max(since, now - (now - since) * (COMPARISON_ROWS * COMPARISON_MARGIN / probes))
    rows = _newest(route, task, region, start)
    if len(rows) < COMPARISON_ROWS and start > since:
        rows = _newest(route, task, region, since)
    return rows


def _newest(route: Route, task: Task, region: Region | None, since: datetime) -> list[Any]:
    """Named tuples of _COMPARISON_FIELDS and `at`, started_at in seconds since 1970: half
    the time of dicts with datetimes (12 against 22 ms for 2,000 rows)."""
    raw = ProbeResult.objects.filter(route=route, task=task, started_at__gte=since)
    if region is not None:
        raw = raw.filter(region=region)
    rows = raw.annotate(at=_Epoch("started_at")).order_by("-started_at")
    return list(rows.values_list(*_COMPARISON_FIELDS, "at", named=True)[:COMPARISON_ROWS])


def build(
    route: Route,
    tasks: list[Task],
    task: Task | None,
    region: Region | None,
    window: Range,
    now: datetime,
) -> RoutePage:
    """`tasks`: the active tasks probing the route (the page's task chips), `task` one of
    them (None: no task probes it)."""
    if task is None:
        return _no_task(route, tasks, window, now)
    regions = list(task.regions.filter(is_active=True).order_by("name"))
    by_region, merged = _window_stats(route, task, window, now)
    selected = by_region.get(region.pk) if region is not None else merged
    kinds, ours = _error_kinds(selected)
    since = window.since(now)
    rows = comparison_rows(route, task, region, since, now, selected.count if selected else 0)
    # The median probe is chosen against the last 24 h: the selected figures, when that is
    # the window.
    if window.length == RAW_WINDOW:
        median = selected.e2e_ms(50) if selected else None
    else:
        median = e2e_median_24h(route, task, region, now)
    probe = median_probe(rows, median, regions, now)
    chart, point_note = series_with_note(route, task, region, window, now)
    return RoutePage(
        route=route,
        tasks=tasks,
        task=task,
        regions=regions,
        region=region,
        range=window,
        series=chart,
        point_note=point_note,
        summaries=_summaries(route, task, regions, by_region, merged, since, now),
        selected=selected,
        error_kinds=kinds,
        our_kinds=ours,
        median_probe=probe,
        waterfall=waterfall(probe),
        headroom=headroom(route, regions if region is None else [region], by_region, now),
        comparisons=comparisons(rows),
        reasoning=reasoning(rows),
        server_time=server_time(rows, regions),
        not_sent=not_sent(route, task),
        now=now,
    )


def _no_task(route: Route, tasks: list[Task], window: Range, now: datetime) -> RoutePage:
    """The page of a route no active task probes: its chips, and nothing measured."""
    return RoutePage(
        route=route,
        tasks=tasks,
        task=None,
        regions=[],
        region=None,
        range=window,
        series=NO_SERIES,
        summaries=[],
        selected=None,
        error_kinds=[],
        median_probe=None,
        waterfall=[],
        headroom=[],
        now=now,
    )


def _window_stats(
    route: Route, task: Task, window: Range, now: datetime
) -> tuple[dict[int | None, Stats], Stats | None]:
    """Each region's figures over the window, and all regions merged, in one read; settled
    hours kept between reads: the page refreshes itself in an open tab."""
    by_region: dict[int | None, Stats] = {
        k[0]: s
        for k, s in rollups.stats_over(
            since=window.since(now),
            until=now + timedelta(hours=1),
            grain=window.stats_grain,
            key_fields=["region_id"],
            all_regions=None,
            where={"route_id": route.pk, "task_id": task.pk},
            keep_settled=True,
        ).items()
    }
    merged = by_region.pop(None, None)
    return by_region, merged


def _summaries(
    route: Route,
    task: Task,
    regions: list[Region],
    by_region: dict[int | None, Stats],
    merged: Stats | None,
    since: datetime,
    now: datetime,
) -> list[RegionSummary]:
    """A row per region with figures, then all regions merged. A scenario's rollups hold app
    e2e; its calls' own figures come from the calls."""
    calls = call_figures(route, task, regions, since) if task.is_scenario else {}
    summaries = [
        RegionSummary(g, stats, not task.is_fresh(stats.last_probe_at, now), calls.get(g.pk))
        for g in regions
        if (stats := by_region.get(g.pk)) is not None
    ]
    if merged is not None:
        summaries.append(
            RegionSummary(
                None, merged, not task.is_fresh(merged.last_probe_at, now), calls.get(None)
            )
        )
    return summaries


def _error_kinds(selected: Stats | None) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The route's failures by kind, most frequent first, and ours (missed slots,
    configuration, engine) apart."""
    kinds = sorted((selected.error_kinds if selected else {}).items(), key=lambda kv: -kv[1])
    ours = [(k, n) for k, n in kinds if not counts_against_provider(k)]
    return [(k, n) for k, n in kinds if counts_against_provider(k)], ours
