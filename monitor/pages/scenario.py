"""A scenario task on a route: app e2e over time, the median scenario as a waterfall, and the
what-if calculator's estimate beside the measured value.

App e2e percentiles come from the rollups (app_e2e_hist, one sample per successful scenario).
The median scenario is read raw (the last 24 hours, through the (route, started_at) index) with
its calls. The calculator's estimate is what monitor.pages.whatif would say from single-call
medians: the median TTFT and generation speed of the scenario's own calls on this route, each
step one wave (a fan-out's calls run at once), its output the calls' median output. The
measured value includes what it leaves out: the gaps between calls, the cache hits that make
later calls faster, the validation, and a fan-out waiting for its slowest branch.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils.safestring import SafeString, mark_safe

from monitor.models import (
    GRAIN_HOUR,
    OUTCOME_OK,
    ROW_QUANTILES,
    STEP_FAN_OUT,
    ProbeResult,
    Region,
    Rollup,
    Route,
    ScenarioResult,
    ScenarioStep,
    Task,
)
from monitor.pages import whatif
from monitor.pages.common import Range
from monitor.stats import confidence, hist, rollups
from monitor.stats.confidence import Estimate
from monitor.stats.rollups import Stats

RAW_WINDOW = timedelta(hours=24)
# Index of app e2e in a series point (static/js/app.js SERIES_METRICS): after ttft, e2e, tps,
# ttfat, three quantiles each.
_SERIES_OFFSET = 12
_JSON_ESCAPES = {ord("<"): "\\u003C", ord(">"): "\\u003E", ord("&"): "\\u0026"}


@dataclass
class Panel:
    steps: list[ScenarioStep]
    stats: Stats
    series: SafeString
    median: ScenarioResult | None = None
    calls: list[ProbeResult] = field(default_factory=list)
    waterfall: dict[str, Any] = field(default_factory=dict)
    estimate_ms: float | None = None
    call_ttft_p50_ms: float | None = None
    call_tps_p50: float | None = None
    call_output_p50: float | None = None

    @property
    def app_e2e(self) -> list[float | None]:
        return [self.stats.app_e2e_ms(q) for q in ROW_QUANTILES]

    @property
    def measured_p50_ms(self) -> float | None:
        return self.stats.app_e2e_ms(50)

    @property
    def calculator_error(self) -> float | None:
        """Measured p50 over the calculator's estimate (1.0: the calculator was right)."""
        measured = self.measured_p50_ms
        if measured is None or not self.estimate_ms:
            return None
        return measured / self.estimate_ms

    @property
    def call_count(self) -> int:
        return sum(s.fan_out if s.kind == STEP_FAN_OUT else 1 for s in self.steps)


def series(
    route: Route, task: Task, region: Region | None, window: Range, now: datetime
) -> SafeString:
    """App e2e p50/p95/p99 per bucket, packed as the route charts read it."""
    grain = window.series_grain
    first = rollups.bucket_start(window.since(now), grain)
    last = rollups.bucket_start(now, grain)
    step = timedelta(hours=1) if grain == GRAIN_HOUR else timedelta(days=1)
    rows = Rollup.objects.filter(
        task=task, route=route, grain=grain, bucket_start__gte=first, bucket_start__lte=last
    )
    rows = rows.filter(region=region) if region is not None else rows.filter(region__isnull=True)
    by_start = dict(rows.values_list("bucket_start", "app_e2e_hist"))
    count = (last - first) // step + 1
    points: list[list[float | None] | None] = []
    for i in range(count):
        pairs = by_start.get(first + i * step)
        if not pairs:
            points.append(None)
            continue
        pcts = hist.percentiles(pairs, ROW_QUANTILES, hist.MS)
        point: list[float | None] = [None] * _SERIES_OFFSET
        point.extend(round(p, 1) if p is not None else None for p in pcts)
        points.append(point)
    text = json.dumps(
        {
            "start": f"{first:%Y-%m-%dT%H:%M:%SZ}",
            "step": grain,
            "skip": 0,
            "count": count,
            "chunks": [points],
        }
    )
    return mark_safe(text.translate(_JSON_ESCAPES))  # noqa: S308 - escaped as json_script does


def _median(
    route: Route, task: Task, region: Region | None, now: datetime
) -> ScenarioResult | None:
    qs = ScenarioResult.objects.filter(
        route=route,
        task=task,
        started_at__gte=now - RAW_WINDOW,
        outcome=OUTCOME_OK,
        app_e2e_ms__isnull=False,
    )
    if region is not None:
        qs = qs.filter(region=region)
    ordered = list(qs.order_by("app_e2e_ms").values_list("pk", flat=True)[:2001])
    if not ordered:
        return None
    return ScenarioResult.objects.select_related("region").get(pk=ordered[len(ordered) // 2])


def waterfall(median: ScenarioResult, calls: list[ProbeResult]) -> dict[str, Any]:
    """One row per call on the scenario's time axis (fan-out calls side by side, one row
    each), with its phases: to headers, queue + prefill (to the first token), decode."""
    rows: list[str] = []
    phases: dict[str, list[list[float] | None]] = {
        "to headers": [],
        "queue + prefill": [],
        "decode": [],
    }
    seen: dict[int, int] = {}
    for call in calls:
        step = call.step or 0
        seen[step] = seen.get(step, 0) + 1
        rows.append(f"step {step + 1}" + (f" · {seen[step]}" if _fan(calls, step) else ""))
        start = (call.started_at - median.started_at).total_seconds() * 1000.0
        ttfb = call.ttfb_ms or 0.0
        ttft = max(ttfb, call.ttft_ms or ttfb)
        end = max(ttft, call.e2e_ms or ttft)
        phases["to headers"].append([round(start, 1), round(start + ttfb, 1)])
        phases["queue + prefill"].append([round(start + ttfb, 1), round(start + ttft, 1)])
        phases["decode"].append([round(start + ttft, 1), round(start + end, 1)])
    if median.validation_ms is not None and median.app_e2e_ms is not None:
        rows.append("validation")
        for name in phases:
            phases[name].append(None)
        end = median.app_e2e_ms
        phases["validation"] = [None] * (len(rows) - 1) + [
            [round(end - median.validation_ms, 1), round(end, 1)]
        ]
    return {"rows": rows, "phases": [{"name": k, "data": v} for k, v in phases.items()]}


def calculator_ms(
    task: Task, steps: list[ScenarioStep], ttft_ms: float, tps: float, output_tokens: float
) -> float:
    """What the what-if calculator says the scenario takes from single-call medians: each step
    one wave (a fan-out's calls at once), TTFT plus the median output at the median speed."""
    scenario = whatif.Scenario(
        calls=len(steps), input_tokens=task.input_tokens, output_tokens=round(output_tokens)
    )
    return whatif.estimate(scenario, ttft_ms, tps).total_ms


@dataclass(frozen=True)
class CallMedians:
    """The medians of a route's scenario calls over the last RAW_WINDOW."""

    ttft_ms: float
    tps: float
    output_tokens: float
    calls: int


_CALL_MEDIANS = """
SELECT route_id,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY ttft_ms),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY tps),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY output_tokens),
       count(*)
FROM monitor_proberesult
WHERE task_id = %s AND scenario_id IS NOT NULL AND outcome = %s
  AND started_at >= %s AND started_at < %s {region}
GROUP BY route_id
"""


def call_medians(task: Task, region: Region | None, now: datetime) -> dict[int, CallMedians]:
    """Per route, the medians of its scenario calls (TTFT, speed, output tokens), the
    calculator's inputs; routes with a missing figure are left out."""
    params: list[Any] = [task.pk, OUTCOME_OK, now - RAW_WINDOW, now + timedelta(minutes=5)]
    where = ""
    if region is not None:
        where, params = "AND region_id = %s", [*params, region.pk]
    with connection.cursor() as cursor:
        cursor.execute(_CALL_MEDIANS.format(region=where), params)
        rows = cursor.fetchall()
    return {
        route_id: CallMedians(ttft, tps, output, n)
        for route_id, ttft, tps, output, n in rows
        if ttft is not None and tps and output is not None
    }


@dataclass
class RouteLine:
    """One route of a scenario task: measured app e2e beside the calculator's estimate."""

    route: Route
    p50: Estimate
    p95: Estimate
    calls: CallMedians | None
    estimate_ms: float | None

    @property
    def ratio(self) -> float | None:
        """Measured p50 over the calculator's estimate (1.0: the calculator was right)."""
        if self.p50.point is None or not self.estimate_ms:
            return None
        return self.p50.point / self.estimate_ms


@dataclass
class Summary:
    steps: list[ScenarioStep]
    lines: list[RouteLine]

    @property
    def call_count(self) -> int:
        return sum(s.fan_out if s.kind == STEP_FAN_OUT else 1 for s in self.steps)

    @property
    def shape(self) -> str:
        """The steps in words: "10 calls in sequence", "a fan-out of 5, then 1 call"."""
        parts: list[str] = []
        run = 0
        for step in [*self.steps, None]:
            if step is not None and step.kind != STEP_FAN_OUT:
                run += 1
                continue
            if run:
                parts.append("1 call" if run == 1 else f"{run} calls in sequence")
                run = 0
            if step is not None:
                parts.append(f"a fan-out of {step.fan_out} parallel calls")
        return ", then ".join(parts)


def summary(
    task: Task, routes: list[tuple[Route, Stats | None]], region: Region | None, now: datetime
) -> Summary | None:
    """The task page's scenario panel: every route's app e2e p50/p95 with intervals (the
    window's rollups, `routes` in ranked order) and the calculator's estimate from its calls'
    medians (the last RAW_WINDOW)."""
    steps = list(task.steps.all())
    if not steps:
        return None
    medians = call_medians(task, region, now)
    lines = []
    for route, stats in routes:
        counts = stats.app_e2e_counts if stats is not None else {}
        m = medians.get(route.pk)
        lines.append(
            RouteLine(
                route=route,
                p50=confidence.percentile(counts, 50),
                p95=confidence.percentile(counts, 95),
                calls=m,
                estimate_ms=calculator_ms(task, steps, m.ttft_ms, m.tps, m.output_tokens)
                if m
                else None,
            )
        )
    return Summary(steps=steps, lines=lines)


def _fan(calls: list[ProbeResult], step: int) -> bool:
    return sum(1 for c in calls if c.step == step) > 1


def build(
    route: Route, task: Task, region: Region | None, window: Range, now: datetime
) -> Panel | None:
    steps = list(task.steps.all())
    if not steps:
        return None
    qs = rollups.rows(
        since=window.since(now),
        until=now + timedelta(hours=1),
        grain=window.stats_grain,
        all_regions=region is None,
    ).filter(task=task, route=route)
    if region is not None:
        qs = qs.filter(region=region)
    stats = rollups.stats_by(qs, ("task_id",)).get((task.pk,), Stats())
    panel = Panel(steps=steps, stats=stats, series=series(route, task, region, window, now))
    recent = ProbeResult.objects.filter(
        route=route,
        task=task,
        scenario__isnull=False,
        started_at__gte=now - RAW_WINDOW,
        outcome=OUTCOME_OK,
    )
    if region is not None:
        recent = recent.filter(region=region)
    figures = list(recent.values_list("ttft_ms", "tps", "output_tokens")[:5000])
    ttfts = [t for t, _, _ in figures if t is not None]
    speeds = [s for _, s, _ in figures if s]
    outputs = [o for _, _, o in figures if o is not None]
    if ttfts and speeds and outputs:
        panel.call_ttft_p50_ms = statistics.median(ttfts)
        panel.call_tps_p50 = statistics.median(speeds)
        panel.call_output_p50 = statistics.median(outputs)
        panel.estimate_ms = calculator_ms(
            task, steps, panel.call_ttft_p50_ms, panel.call_tps_p50, panel.call_output_p50
        )
    panel.median = _median(route, task, region, now)
    if panel.median is not None:
        panel.calls = list(panel.median.calls.order_by("step", "started_at"))
        panel.waterfall = waterfall(panel.median, panel.calls)
    return panel
