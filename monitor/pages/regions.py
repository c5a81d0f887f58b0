"""The regions matrix: for one task, every route x region on one metric, budget-coloured,
with each region's fastest qualifying route marked. One rollup query."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import prefetch_related_objects

from monitor.answer import selection
from monitor.answer import winners as stats_winners
from monitor.models import Region, Route, Task
from monitor.pages.common import Range
from monitor.stats import rollups
from monitor.stats.rollups import Stats

# metric key -> (label, unit); a metric the task sets a budget on is coloured by it
# (Task.budget_status).
METRICS: dict[str, tuple[str, str]] = {
    "ttft_p50": ("TTFT p50", "ms"),
    "ttft_p95": ("TTFT p95", "ms"),
    "e2e_p50": ("e2e p50", "ms"),
    "e2e_p95": ("e2e p95", "ms"),
    "ttfat_p50": ("first answer token p50", "ms"),
    "ttfat_p95": ("first answer token p95", "ms"),
    "tps_p50": ("speed p50", "tps"),
    "error_rate": ("error rate", "pct"),
}
DEFAULT_METRIC = "ttft_p95"


def value_of(stats: Stats | None, metric: str) -> float | None:
    if stats is None:
        return None
    if metric == "error_rate":
        return stats.provider_error_rate
    if metric == "tps_p50":
        return stats.tps(50)
    return stats.metric(metric)


@dataclass
class MatrixCell:
    region: Region
    value: float | None
    status: str
    winner: bool
    stale: bool
    probes: int
    errors: int = 0  # the provider's failures out of its attempts (availability)
    attempts: int = 0
    reason: str = ""  # why this route does not qualify here ("" when it does)


@dataclass
class MatrixRow:
    route: Route
    cells: list[MatrixCell]


@dataclass
class Matrix:
    task: Task
    metric: str
    range: Range
    regions: list[Region]
    rows: list[MatrixRow]

    @property
    def label(self) -> str:
        return METRICS[self.metric][0]

    @property
    def unit(self) -> str:
        return METRICS[self.metric][1]

    @property
    def has_data(self) -> bool:
        return any(c.probes for r in self.rows for c in r.cells)

    @property
    def has_values(self) -> bool:
        """Some cell shows a figure, not "too few" (its probes are enough for the metric)."""
        if self.unit in ("ms", "tps"):
            return any(c.value is not None for r in self.rows for c in r.cells)
        return any(c.attempts for r in self.rows for c in r.cells)


def build(task: Task, metric: str, window: Range, now: datetime) -> Matrix:
    metric = metric if metric in METRICS else DEFAULT_METRIC
    # Every region's choice asks whether the task is a scenario: one query, not one a region.
    prefetch_related_objects([task], "steps")
    routes = [r for r in task.routes.select_related("provider") if r.is_active]
    regions = list(task.regions.filter(is_active=True).order_by("name"))
    until = now + timedelta(hours=1)
    since = window.since(now)
    # Every cell and each route's all-regions figures (its quality: region None) in one
    # read; settled hours kept between reads: the page refreshes itself in an open tab.
    per_cell = rollups.stats_over(
        since=since,
        until=until,
        grain=window.stats_grain,
        key_fields=["route_id", "region_id"],
        all_regions=None,
        where={"task_id": task.pk},
        keep_settled=True,
    )
    quality = {k[0]: s for k, s in per_cell.items() if k[1] is None and k[0] is not None}
    held = stats_winners.incumbents([task.pk])
    winners: dict[int, int | None] = {}
    reasons: dict[tuple[int, int], str] = {}
    latency_in = {
        g.pk: {r.pk: per_cell[(r.pk, g.pk)] for r in routes if (r.pk, g.pk) in per_cell}
        for g in regions
    }
    # Every region's stale routes' missed slots in one read.
    missed = selection.missed_in_regions(
        task,
        {g.pk: selection.quiet_routes(task, routes, latency_in[g.pk], now) for g in regions},
        now,
    )
    for g in regions:
        choice = selection.decide(
            task,
            routes,
            latency_in[g.pk],
            quality,
            region=g,
            now=now,
            incumbent=held.get((task.pk, g.pk)),
            missed=missed.get(g.pk, {}),
        )
        winners[g.pk] = choice.winner.route.pk if choice.winner else None
        for c in choice.candidates:
            reasons[(c.route.pk, g.pk)] = c.detail or c.reason
    rows = []
    for r in routes:
        cells = []
        for g in regions:
            stats = per_cell.get((r.pk, g.pk))
            value = value_of(stats, metric)
            cells.append(
                MatrixCell(
                    region=g,
                    value=value,
                    status=task.budget_status(metric, value),
                    winner=winners.get(g.pk) == r.pk,
                    stale=not task.is_fresh(stats.last_probe_at if stats else None, now),
                    probes=stats.count if stats else 0,
                    errors=stats.provider_errors if stats else 0,
                    attempts=stats.attempts if stats else 0,
                    reason=reasons.get((r.pk, g.pk), ""),
                )
            )
        rows.append(MatrixRow(route=r, cells=cells))
    return Matrix(task=task, metric=metric, range=window, regions=regions, rows=rows)
