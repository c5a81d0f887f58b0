"""The fastest qualifying route: the one question the product answers.

For a task and a region, over a window: among the task's routes that clear its quality bar
with enough samples, the one lowest on the task's latency metric (default p50 e2e).

Rules, in order:
- Quality bar: if the task sets `min_pass_rate`, a route needs at least MIN_GRADED graded
  probes in the window (all regions together: quality does not depend on where you call from)
  and a pass rate at or above the bar. If it sets `min_quality_index`, the route's external
  index must be at or above it. A task with neither bar lets every route qualify.
- Enough samples: the route needs enough successful probes in this region for the metric's
  percentile (monitor.stats.hist.MIN_SAMPLES); otherwise it is "too few samples", not ranked.
- Lowest metric wins. Ties (equal to the millisecond) go to the lower p95 e2e, then the lower
  price for the task's token counts, then the lower route id, so the answer is deterministic.
- No route qualifies: `winner` is None and every candidate carries the reason it was left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TypeVar

from django.db.models import QuerySet

from monitor.models import GRAIN_HOUR, Region, Rollup, Route, Task
from monitor.stats import rollups
from monitor.stats.rollups import Stats

MIN_GRADED = 10

K = TypeVar("K")

REASON_QUALITY = "below the quality bar"
REASON_UNGRADED = "too few graded probes"
REASON_NO_INDEX = "no quality index"
REASON_FEW_SAMPLES = "too few samples"


@dataclass(frozen=True)
class Candidate:
    route: Route
    metric_ms: float | None
    pass_rate: float | None
    qualifies: bool
    reason: str  # why it does not qualify ("" when it does)


@dataclass(frozen=True)
class Choice:
    winner: Candidate | None
    candidates: list[Candidate]  # ranked: qualifying by metric first, then the rest

    @property
    def reason(self) -> str:
        if self.winner:
            return ""
        if not self.candidates:
            return "no candidate routes"
        return "no route meets the quality bar with enough samples"


def quality_verdict(task: Task, route: Route, quality: Stats | None) -> tuple[bool, str]:
    if task.min_quality_index is not None and (
        route.quality_index is None or route.quality_index < task.min_quality_index
    ):
        return False, REASON_NO_INDEX if route.quality_index is None else REASON_QUALITY
    if task.min_pass_rate is not None:
        if quality is None or quality.graded < MIN_GRADED:
            return False, REASON_UNGRADED
        assert quality.pass_rate is not None
        if quality.pass_rate < task.min_pass_rate:
            return False, REASON_QUALITY
    return True, ""


@dataclass
class Window:
    """Tasks' route stats over [since, until) from the hourly rollups, read once for many
    choices: per region (latency) and all regions merged (quality; counts only)."""

    per_region: dict[tuple[int | None, ...], Stats]
    per_route: dict[tuple[int | None, ...], Stats]

    @classmethod
    def read(
        cls, since: datetime, until: datetime, task_ids: Sequence[int] | None = None
    ) -> Window:
        """Every task's rows, or only those of `task_ids`."""

        def rows(all_regions: bool) -> QuerySet[Rollup]:
            qs = rollups.rows(since=since, until=until, grain=GRAIN_HOUR, all_regions=all_regions)
            return qs if task_ids is None else qs.filter(task_id__in=task_ids)

        return cls(
            per_region=rollups.stats_by(rows(False), ["task_id", "route_id", "region_id"]),
            per_route=rollups.stats_by(rows(True), ["task_id", "route_id"], histograms=False),
        )

    def quality(self, task: Task, routes: Sequence[Route]) -> dict[int, Stats]:
        """Per route id, all regions merged: `choose`'s quality."""
        keys = ((r.pk, (task.pk, r.pk)) for r in routes)
        return {pk: self.per_route[key] for pk, key in keys if key in self.per_route}

    def latency(self, task: Task, routes: Sequence[Route], region: Region) -> dict[int, Stats]:
        """Per route id, in one region: `choose`'s latency."""
        keys = ((r.pk, (task.pk, r.pk, region.pk)) for r in routes)
        return {pk: self.per_region[key] for pk, key in keys if key in self.per_region}


def fresh(task: Task, latency: Mapping[K, Stats], now: datetime) -> dict[K, Stats]:
    """Only the figures probed recently (Task.is_fresh): a route with nothing recent in a
    region cannot be its fastest."""
    return {key: s for key, s in latency.items() if task.is_fresh(s.last_probe_at, now)}


def choose(
    task: Task,
    routes: Sequence[Route],
    latency: Mapping[int, Stats],
    quality: Mapping[int, Stats],
) -> Choice:
    """`latency`: per route id, stats in this region; `quality`: per route id, all regions."""
    candidates: list[Candidate] = []
    for route in routes:
        region_stats = latency.get(route.pk)
        metric = region_stats.metric(task.latency_metric) if region_stats else None
        quality_stats = quality.get(route.pk)
        ok, reason = quality_verdict(task, route, quality_stats)
        if ok and metric is None:
            ok, reason = False, REASON_FEW_SAMPLES
        candidates.append(
            Candidate(
                route=route,
                metric_ms=metric,
                pass_rate=quality_stats.pass_rate if quality_stats else None,
                qualifies=ok,
                reason=reason,
            )
        )

    def rank(c: Candidate) -> tuple[int, float, float, Decimal, int]:
        stats = latency.get(c.route.pk)
        p95 = (stats.e2e_ms(95) if stats else None) or float("inf")
        price = c.route.cost_usd(task.input_tokens, task.max_tokens)
        # Equal to the millisecond counts as a tie.
        metric = float(round(c.metric_ms)) if c.metric_ms is not None else float("inf")
        return (0 if c.qualifies else 1, metric, p95, price, c.route.pk)

    candidates.sort(key=rank)
    winner = candidates[0] if candidates and candidates[0].qualifies else None
    return Choice(winner=winner, candidates=candidates)
