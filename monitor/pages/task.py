"""The task page: every candidate route on quality vs speed, ranked, with the what-if.

One rollup query (the task's rows over the window, in one region or all regions merged)
gives both latency and quality; routes are chosen by monitor.answer.selection, as on the overview.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from monitor.answer import selection, winners
from monitor.answer.board import metric_label
from monitor.models import METRIC_E2E_P95, METRIC_TTFT_P95, Region, Route, Task, WinnerChange
from monitor.pages import scenario as pages_scenario
from monitor.pages import whatif as pages_whatif
from monitor.pages.common import Range
from monitor.stats.rollups import Stats

Y_PASSING = "pass rate (%)"
Y_QUALITY_INDEX = "quality index"


@dataclass
class RouteRow:
    rank: int
    route: Route
    candidate: selection.Candidate
    stats: Stats | None
    is_winner: bool
    stale: bool
    ttft_status: str
    e2e_status: str

    def _q(self, metric: str, q: int) -> float | None:
        if self.stats is None:
            return None
        value: float | None = getattr(self.stats, metric)(q)
        return value

    @property
    def ttft_p50_ms(self) -> float | None:
        return self._q("ttft_ms", 50)

    @property
    def ttft_p95_ms(self) -> float | None:
        return self._q("ttft_ms", 95)

    @property
    def e2e_p50_ms(self) -> float | None:
        return self._q("e2e_ms", 50)

    @property
    def e2e_p95_ms(self) -> float | None:
        return self._q("e2e_ms", 95)

    @property
    def tps_p50(self) -> float | None:
        return self._q("tps", 50)

    @property
    def error_rate(self) -> float | None:
        """The provider's failures out of its attempts (availability, what the bar judges)."""
        return self.candidate.errors.point

    @property
    def probes(self) -> int:
        return self.stats.count if self.stats else 0


class ScatterPoint(TypedDict):
    x: float  # the task's latency metric, in seconds
    y: float
    label: str
    route_id: int
    qualifies: bool
    winner: bool
    ttft_p50_ms: float | None
    tps_p50: float | None
    e2e_p95_ms: float | None


class ScatterData(TypedDict):
    x_label: str
    y_label: str
    bar: float | None
    points: list[ScatterPoint]


@dataclass
class TaskPage:
    task: Task
    region: Region | None
    range: Range
    choice: selection.Choice
    rows: list[RouteRow]
    scatter: ScatterData
    unplotted: list[RouteRow]  # no quality figure or no latency figure to plot
    last_probe_at: datetime | None
    whatif: pages_whatif.Form
    whatif_lines: list[pages_whatif.Line]
    winner_change: WinnerChange | None = None  # since when, and why, the winner is the winner
    scenario: pages_scenario.Summary | None = None  # a scenario task's app e2e vs calculator

    @property
    def tied(self) -> list[selection.Candidate]:
        return [c for c in self.choice.candidates if c.tied]

    @property
    def has_data(self) -> bool:
        return any(r.stats is not None and r.stats.count for r in self.rows)


def _quality_y(task: Task, row: RouteRow) -> tuple[str, float | None, float | None]:
    """The scatter's y axis: the task's own quality measure, and its bar."""
    if task.min_pass_rate is None and task.min_quality_index is not None:
        return Y_QUALITY_INDEX, row.route.quality_index, task.min_quality_index
    rate = row.candidate.pass_rate.point if row.candidate.pass_rate else None
    bar = task.min_pass_rate * 100 if task.min_pass_rate is not None else None
    return Y_PASSING, rate * 100 if rate is not None else None, bar


def build(
    task: Task,
    region: Region | None,
    window: Range,
    whatif_params: dict[str, str],
    now: datetime,
) -> TaskPage:
    routes = [r for r in task.routes.select_related("provider") if r.is_active]
    latency, quality = _figures(task, region, window, now)
    change = winners.latest([task.pk]).get((task.pk, region.pk)) if region else None
    choice = selection.decide(
        task,
        routes,
        latency,
        quality,
        region=region,
        now=now,
        incumbent=change.route_id if change else None,
    )
    rows = _rows(task, routes, choice, latency, now)
    scatter, unplotted = _scatter(task, choice, rows)
    scenario = pages_scenario.summary(task, [(r.route, r.stats) for r in rows], region, now)
    form, lines = _whatif(task, rows, scenario, whatif_params)
    last_probe = max((s.last_probe_at for s in latency.values() if s.last_probe_at), default=None)
    return TaskPage(
        task=task,
        region=region,
        range=window,
        choice=choice,
        rows=rows,
        scatter=scatter,
        unplotted=unplotted,
        last_probe_at=last_probe,
        whatif=form,
        whatif_lines=lines,
        winner_change=change,
        scenario=scenario,
    )


def _figures(
    task: Task, region: Region | None, window: Range, now: datetime
) -> tuple[dict[int, Stats], dict[int, Stats]]:
    """Each route's latency figures (in the region, or all regions merged) and its quality
    figures over all regions merged (the same figures when no region is chosen)."""
    since = window.since(now)
    until = now + timedelta(hours=1)
    latency = selection.per_route(
        task, since=since, until=until, grain=window.stats_grain, region=region
    )
    if region is None:
        return latency, latency
    quality = selection.per_route(
        task, since=since, until=until, grain=window.stats_grain, histograms=False
    )
    return latency, quality


def _rows(
    task: Task,
    routes: list[Route],
    choice: selection.Choice,
    latency: dict[int, Stats],
    now: datetime,
) -> list[RouteRow]:
    """One row per candidate, in the order the decision ranked them, with its budget colours."""
    ttft_basis = task.ttft_budget_metric(routes)
    rows = []
    for i, c in enumerate(choice.candidates, start=1):
        stats = latency.get(c.route.pk)
        rows.append(
            RouteRow(
                rank=i,
                route=c.route,
                candidate=c,
                stats=stats,
                is_winner=choice.winner is not None and choice.winner.route.pk == c.route.pk,
                stale=not task.is_fresh(stats.last_probe_at if stats else None, now),
                ttft_status=task.budget_status(
                    METRIC_TTFT_P95, stats.metric(ttft_basis, reference=True) if stats else None
                ),
                e2e_status=task.budget_status(
                    METRIC_E2E_P95, stats.metric(METRIC_E2E_P95, reference=True) if stats else None
                ),
            )
        )
    return rows


def _scatter(
    task: Task, choice: selection.Choice, rows: list[RouteRow]
) -> tuple[ScatterData, list[RouteRow]]:
    """Quality against the task's latency metric, a point per route that has both; the rows
    that lack either come back apart (unplotted)."""
    y_label, bar = Y_PASSING, None
    points: list[ScatterPoint] = []
    unplotted = []
    for row in rows:
        y_label, y, bar = _quality_y(task, row)
        metric = row.candidate.metric_ms
        if y is None or metric is None:
            unplotted.append(row)
            continue
        points.append(
            ScatterPoint(
                x=round(metric / 1000, 4),
                y=round(y, 2),
                label=str(row.route),
                route_id=row.route.pk,
                qualifies=row.candidate.qualifies,
                winner=row.is_winner,
                ttft_p50_ms=row.ttft_p50_ms,
                tps_p50=row.tps_p50,
                e2e_p95_ms=row.e2e_p95_ms,
            )
        )
    scatter = ScatterData(
        x_label=f"{metric_label(choice.metric)} (s)", y_label=y_label, bar=bar, points=points
    )
    return scatter, unplotted


def _whatif(
    task: Task,
    rows: list[RouteRow],
    scenario: pages_scenario.Summary | None,
    whatif_params: dict[str, str],
) -> tuple[pages_whatif.Form, list[pages_whatif.Line]]:
    """The what-if calculator's form (the task's own sizes unless the request says otherwise)
    and its line per route, plus the custom ones the form adds. A scenario task's rollups hold
    app e2e only: the calculator reads its calls' medians."""
    calls = {line.route.pk: line.calls for line in scenario.lines} if scenario else {}
    defaults = {k: str(v) for k, v in whatif_defaults(task).items()}
    form = pages_whatif.parse({**defaults, **{k: v for k, v in whatif_params.items() if v}})
    speeds = [
        pages_whatif.Speed(
            name=str(row.route),
            ttft_ms=row.ttft_p50_ms if not scenario else _or_none(calls, row, "ttft_ms"),
            tokens_per_s=row.tps_p50 if not scenario else _or_none(calls, row, "tps"),
            price_input_per_mtok=row.route.price_input_per_mtok,
            price_output_per_mtok=row.route.price_output_per_mtok,
            route_id=row.route.pk,
        )
        for row in rows
    ]
    return form, pages_whatif.compare(form.scenario, speeds + form.custom)


def _or_none(
    calls: dict[int, pages_scenario.CallMedians | None], row: RouteRow, name: str
) -> float | None:
    medians = calls.get(row.route.pk)
    return getattr(medians, name) if medians is not None else None


def whatif_defaults(task: Task) -> dict[str, Any]:
    """The calculator starts from the task's own sizes (a scenario's: one call per step)."""
    steps = task.steps.count()
    return {
        "calls": steps or 10,
        "input": task.input_tokens,
        "output": task.max_tokens,
        "parallel": 1,
    }
