"""What the read API answers, as JSON shapes (TypedDicts) built from the overview snapshot and
the configuration.

The route answer is read from the same snapshot the overview page shows
(monitor.answer.board.current), so an application and a person looking at the dashboard see
the same winner, figures and reasons. Route rows carry what an application needs to call the
route (provider, base URL, model id, request settings) and never a secret: no API key, no
secret headers, not even their encrypted tokens, and no credentials or query in the base URL.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, TypedDict
from urllib.parse import urlsplit, urlunsplit

from monitor.answer import board
from monitor.answer.board import Cell, Overview, Ranked, TaskRow, metric_label
from monitor.models import Route, Task


class ApiError(Exception):
    """A request the API answers with an error (status, a stable code, a message for people,
    and what would have been valid)."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


class ProviderJSON(TypedDict):
    slug: str
    name: str


class SettingsJSON(TypedDict):
    token_limit_param: str
    reasoning_effort: str
    thinking_budget_tokens: int | None
    service_tier: str
    temperature: float | None
    extra_body: dict[str, Any]
    api_version: str


class RouteJSON(TypedDict):
    id: int
    label: str
    provider: ProviderJSON
    base_url: str
    wire_format: str
    model_id: str
    settings: SettingsJSON


class RouteListItemJSON(RouteJSON):
    is_active: bool
    tasks: list[str]


class IntervalJSON(TypedDict):
    value: float | None
    low: float | None
    high: float | None


class PassRateJSON(IntervalJSON):
    passed: int
    graded: int


class FiguresJSON(TypedDict):
    metric_ms: IntervalJSON
    samples: int
    pass_rate: PassRateJSON | None  # None: the route was not graded in the window
    errors: int
    attempts: int
    error_rate: float | None


class RankedJSON(TypedDict):
    route: RouteJSON
    figures: FiguresJSON


class TiedJSON(TypedDict):
    id: int | None
    label: str


class FreshnessJSON(TypedDict):
    last_probe_at: str | None
    stale: bool
    stale_after_s: float
    built_at: str
    window_hours: int


class MetricJSON(TypedDict):
    name: str
    label: str


class AnswerJSON(TypedDict):
    task: str
    region: str
    metric: MetricJSON
    route: RouteJSON | None
    figures: FiguresJSON | None
    reason: str
    why: str
    winner_since: str | None
    runner_up: RankedJSON | None
    tied: list[TiedJSON]
    freshness: FreshnessJSON


class RegionJSON(TypedDict):
    slug: str
    name: str


class TaskJSON(TypedDict):
    slug: str
    name: str
    latency_class: str
    metric: MetricJSON
    regions: list[RegionJSON]
    route_url: str


def public_base_url(url: str) -> str:
    """The base URL without credentials, query or fragment (the admin refuses userinfo, but
    what is shown to applications must not depend on that)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def route_json(route: Route) -> RouteJSON:
    return {
        "id": route.pk,
        "label": str(route),
        "provider": {"slug": route.provider.slug, "name": route.provider.name},
        "base_url": public_base_url(route.provider.base_url),
        "wire_format": route.provider.wire_format,
        "model_id": route.model_id,
        "settings": {
            "token_limit_param": route.token_limit_param,
            "reasoning_effort": route.reasoning_effort,
            "thinking_budget_tokens": route.thinking_budget_tokens,
            "service_tier": route.service_tier,
            "temperature": route.temperature,
            "extra_body": dict(route.extra_body or {}),
            "api_version": route.api_version,
        },
    }


def _interval(value: float | None, low: float | None, high: float | None) -> IntervalJSON:
    return {"value": value, "low": low, "high": high}


def _figures(
    *,
    metric: IntervalJSON,
    samples: int,
    passed: int,
    graded: int,
    pass_low: float | None,
    pass_high: float | None,
    errors: int,
    attempts: int,
) -> FiguresJSON:
    pass_rate: PassRateJSON | None = None
    if graded:
        pass_rate = {
            "value": passed / graded,
            "low": pass_low,
            "high": pass_high,
            "passed": passed,
            "graded": graded,
        }
    return {
        "metric_ms": metric,
        "samples": samples,
        "pass_rate": pass_rate,
        "errors": errors,
        "attempts": attempts,
        "error_rate": errors / attempts if attempts else None,
    }


def _ranked_figures(ranked: Ranked) -> FiguresJSON:
    """The winner's and the runner-up's figures: one shape for both (board.Ranked)."""
    return _figures(
        metric=_interval(ranked.metric_ms, ranked.metric_low_ms, ranked.metric_high_ms),
        samples=ranked.samples,
        passed=ranked.passed,
        graded=ranked.graded,
        pass_low=ranked.pass_low,
        pass_high=ranked.pass_high,
        errors=ranked.errors,
        attempts=ranked.attempts,
    )


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when else None


class _Vanished(Exception):
    """A route the snapshot names was deleted after the snapshot was read."""


def _find(data: Overview, task_slug: str, region_slug: str | None) -> tuple[TaskRow, Cell]:
    row = next((r for r in data.rows if r.task.slug == task_slug), None)
    if row is None:
        raise ApiError(
            404,
            "unknown_task",
            f"No active task {task_slug!r}.",
            tasks=[r.task.slug for r in data.rows],
        )
    regions = [c.region_slug for c in row.cells]
    if region_slug is None:
        if len(row.cells) == 1:
            return row, row.cells[0]
        raise ApiError(
            400,
            "region_required",
            f"Task {task_slug!r} runs in {len(regions)} regions: name one with ?region=.",
            regions=regions,
        )
    cell = next((c for c in row.cells if c.region_slug == region_slug), None)
    if cell is None:
        raise ApiError(
            404,
            "unknown_region",
            f"Task {task_slug!r} does not run in a region {region_slug!r}.",
            regions=regions,
        )
    return row, cell


# The route rows named by one snapshot, per process: (the snapshot's built_at, id -> shape).
# Any change to a route or provider drops the snapshot (monitor.apps), so the next snapshot
# has another built_at and the rows are read again; until then they cannot have changed.
_route_shapes: tuple[datetime | None, dict[int, RouteJSON]] = (None, {})


def _routes_of(data: Overview, wanted: list[int]) -> dict[int, RouteJSON]:
    global _route_shapes
    built_at, shapes = _route_shapes
    if built_at != data.built_at:
        shapes = {}
    missing = [i for i in wanted if i not in shapes]
    if missing:
        rows = Route.objects.select_related("provider").in_bulk(missing)
        if len(rows) != len(missing):
            raise _Vanished
        shapes = {**shapes, **{i: route_json(r) for i, r in rows.items()}}
        _route_shapes = (data.built_at, shapes)
    return shapes


def _answer(data: Overview, task_slug: str, region_slug: str | None) -> AnswerJSON:
    row, cell = _find(data, task_slug, region_slug)
    named = [r for r in (cell.winner, cell.runner_up) if r is not None]
    routes = _routes_of(data, [r.route_id for r in named])
    winner = routes[cell.winner.route_id] if cell.winner else None
    runner = routes[cell.runner_up.route_id] if cell.runner_up else None
    ids: list[int | None] = list(cell.tied_ids)
    if len(ids) != len(cell.tied):  # a snapshot written before tied_ids existed
        ids = [None] * len(cell.tied)
    return {
        "task": row.task.slug,
        "region": cell.region_slug,
        "metric": {"name": row.task.metric, "label": row.task.latency_metric},
        "route": winner,
        "figures": _ranked_figures(cell.winner) if cell.winner else None,
        "reason": cell.reason,
        "why": cell.why,
        "winner_since": _iso(cell.winner_since),
        "runner_up": (
            {"route": runner, "figures": _ranked_figures(cell.runner_up)}
            if runner and cell.runner_up
            else None
        ),
        "tied": [{"id": i, "label": label} for i, label in zip(ids, cell.tied, strict=True)],
        "freshness": {
            "last_probe_at": _iso(cell.last_probe_at),
            "stale": cell.stale,
            "stale_after_s": cell.stale_after_s,
            "built_at": data.built_at.isoformat(),
            "window_hours": int(board.WINDOW.total_seconds() // 3600),
        },
    }


def answer(task_slug: str, region_slug: str | None, now: datetime) -> AnswerJSON:
    """The fastest qualifying route of a task in a region, as the overview shows it now."""
    try:
        return _answer(board.current(now), task_slug, region_slug)
    except _Vanished:
        # A route was deleted between the snapshot's read and ours (the deletion dropped the
        # snapshot): answer from a fresh one.
        try:
            return _answer(board.rebuilt(now), task_slug, region_slug)
        except _Vanished:
            raise ApiError(
                503, "configuration_changed", "The configuration changed during the read; retry."
            ) from None


def tasks(route_url: str) -> list[TaskJSON]:
    """Active tasks (the ones the route answer covers), with the regions it can be asked for.
    `route_url` has a `{slug}` placeholder."""
    out: list[TaskJSON] = []
    for task in Task.objects.filter(is_active=True).prefetch_related("regions", "routes"):
        metric = task.ranking_metric()
        out.append(
            {
                "slug": task.slug,
                "name": task.name,
                "latency_class": task.latency_class,
                "metric": {"name": metric, "label": metric_label(metric)},
                "regions": [{"slug": g.slug, "name": g.name} for g in task.regions.all()],
                "route_url": route_url.replace("{slug}", task.slug),
            }
        )
    return sorted(out, key=lambda t: t["slug"])


def routes() -> list[RouteListItemJSON]:
    """Every configured route; `is_active` is false when the route or its provider is off."""
    rows: Iterable[Route] = (
        Route.objects.select_related("provider")
        .prefetch_related("tasks")
        .order_by("provider__name", "model_id")
    )
    out: list[RouteListItemJSON] = []
    for route in rows:
        item: RouteListItemJSON = {
            **route_json(route),
            "is_active": route.is_active and route.provider.is_active,
            "tasks": sorted(t.slug for t in route.tasks.all()),
        }
        out.append(item)
    return out
