"""The fastest qualifying route: the one question the product answers.

For a task and a region, over a window: among the task's routes that clear its bar, the one
lowest on the task's ranking metric (Task.ranking_metric), measured on the task's reference
option set only (Task.reference: other option probes feed comparisons, never the ranking).

A route qualifies when, in order:
- Quality: with `min_quality_index`, the route's external index is at or above it. With
  `min_pass_rate`, the route has at least Task.graded_needed() graded probes in the window (all
  regions together: quality does not depend on where you call from) and the whole 95% Wilson
  interval of its pass rate is at or above the bar (monitor.stats.confidence): 8 of 10 does
  not clear 80%, it might be 49%.
- Availability: its error rate in this region, counting only failures that are the
  provider's or the network's (probes.errors.Kind.counts_against_provider), is not above
  Task.error_ceiling() with confidence (a route is out when the whole 95% Wilson interval of
  its error rate lies above the ceiling, so a single error among a few dozen probes does not
  throw it out for the day).
- Working: it has succeeded recently (a route whose recent probes all failed is failing, not
  fresh).
- Enough samples: enough successful reference probes in this region for the metric's
  percentile (monitor.stats.hist.MIN_SAMPLES).

Among qualifying routes the lowest metric ranks first. Ties (equal to the millisecond) go to
the lower p95 e2e, then the lower price for the task's token counts, then the lower route id.
A batch task prefers the cheapest of the routes tied within noise with the fastest.

Stability: the current winner (the incumbent, monitor.models.WinnerChange) stays the winner
unless it stops qualifying or a challenger is faster with confidence (its 95% interval wholly
below the incumbent's). Routes whose intervals overlap the winner's are "tied within noise".
Two routes 1% apart therefore never swap back and forth, and a route 30% faster (lognormal
spread, sigma 0.3) takes over after a median of about 10 of its probes in the window, within
30 in 95% of cases (tests/monitor/test_trust.py measures both).
No route qualifies: `winner` is None and every candidate carries the reason it was left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any, TypeVar

from monitor.models import Region, Route, Task, fresh_within
from monitor.stats import rollups
from monitor.stats.confidence import NO_ESTIMATE, Estimate, Rate, percentile
from monitor.stats.rollups import Stats

K = TypeVar("K")

REASON_QUALITY = "below the quality bar"
REASON_UNGRADED = "too few graded probes"
REASON_NO_INDEX = "no quality index"
REASON_ERRORS = "fails too often"
REASON_FAILING = "failing"
REASON_FEW_SAMPLES = "too few samples"


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%" if x >= 0.1 or x == 0 else f"{x * 100:.1f}%"


@dataclass(frozen=True)
class Candidate:
    route: Route
    metric: Estimate  # the ranking metric over the reference probes in this region
    pass_rate: Rate | None  # all regions; None when nothing was graded
    errors: Rate  # the provider's failures out of its attempts, in this region
    qualifies: bool
    reason: str  # why it does not qualify ("" when it does): one of the REASON_ constants
    detail: str = ""  # the reason with its numbers, for people
    tied: bool = False  # qualifies and within noise of the winner

    @property
    def metric_ms(self) -> float | None:
        return self.metric.point


@dataclass(frozen=True)
class Choice:
    winner: Candidate | None
    candidates: list[Candidate]  # the winner, then the qualifying by metric, then the rest
    metric: str = ""
    change: str = ""  # why the winner is not the incumbent ("" when it is, or both are None)

    @property
    def reason(self) -> str:
        if self.winner:
            return ""
        if not self.candidates:
            return "no candidate routes"
        return "no route meets the bar with enough samples"

    @property
    def runner_up(self) -> Candidate | None:
        rest = [c for c in self.candidates[1:] if c.qualifies]
        return rest[0] if self.winner and rest else None

    @property
    def changed(self) -> bool:
        return bool(self.change)


def quality_verdict(task: Task, route: Route, quality: Stats | None) -> tuple[bool, str, str]:
    """(qualifies, reason, detail) on the quality bar alone."""
    if task.min_quality_index is not None and (
        route.quality_index is None or route.quality_index < task.min_quality_index
    ):
        if route.quality_index is None:
            return False, REASON_NO_INDEX, "no quality index to hold against the bar"
        return (
            False,
            REASON_QUALITY,
            f"quality index {route.quality_index:g} below {task.min_quality_index:g}",
        )
    if task.min_pass_rate is not None:
        needed = task.graded_needed()
        if quality is None or quality.graded < needed:
            graded = quality.graded if quality else 0
            return False, REASON_UNGRADED, f"{graded} of {needed} graded probes needed"
        rate = Rate(quality.passed, quality.graded)
        assert rate.low is not None
        assert rate.high is not None
        if rate.low < task.min_pass_rate:
            return (
                False,
                REASON_QUALITY,
                f"pass rate {quality.passed}/{quality.graded} "
                f"({_pct(rate.low)}-{_pct(rate.high)}) not surely at or above "
                f"{_pct(task.min_pass_rate)}",
            )
    return True, "", ""


def availability_verdict(
    task: Task, stats: Stats | None, now: datetime | None
) -> tuple[bool, str, str]:
    """(qualifies, reason, detail) on errors and on recent success, in one region."""
    if stats is None:
        return True, "", ""
    failed = stats.provider_errors  # a sum over the error kinds: once
    errors = Rate(failed, stats.count_ok + failed)
    ceiling = task.error_ceiling()
    # Above the ceiling with confidence (the whole 95% interval above it): one error in 24
    # probes is no evidence of failing more than 2% of the time, nine in ten is.
    if errors.point is not None and errors.low is not None and errors.low > ceiling:
        return (
            False,
            REASON_ERRORS,
            f"{_pct(errors.point)} errors ({errors.k} of {errors.n}), above the "
            f"{_pct(ceiling)} ceiling",
        )
    stale_after = task.stale_after()
    if (
        now is not None
        and fresh_within(stats.last_probe_at, now, stale_after)
        and not fresh_within(stats.last_ok_at, now, stale_after)
    ):
        since = f" since {stats.last_ok_at:%Y-%m-%d %H:%M} UTC" if stats.last_ok_at else ""
        return False, REASON_FAILING, f"every recent probe failed (no success{since})"
    return True, "", ""


@dataclass
class Window:
    """Tasks' route stats over [since, until) from the hourly rollups, read once for many
    choices: per region (latency) and all regions merged (quality; counts only)."""

    per_region: dict[tuple[int | None, ...], Stats]
    per_route: dict[tuple[int | None, ...], Stats]

    @classmethod
    def read(
        cls,
        since: datetime,
        until: datetime,
        task_ids: Sequence[int] | None = None,
        *,
        keep_settled: bool = False,
    ) -> Window:
        """Every task's rows, or only those of `task_ids`; `keep_settled`: see
        rollups.stats_over (for a window read again and again as it slides)."""
        return cls(
            per_region=rollups.stats_over(
                since=since,
                until=until,
                key_fields=["task_id", "route_id", "region_id"],
                all_regions=False,
                task_ids=task_ids,
                keep_settled=keep_settled,
            ),
            per_route=rollups.stats_over(
                since=since,
                until=until,
                key_fields=["task_id", "route_id"],
                all_regions=True,
                histograms=False,
                task_ids=task_ids,
                keep_settled=keep_settled,
            ),
        )

    def quality(self, task: Task, routes: Sequence[Route]) -> dict[int, Stats]:
        """Per route id, all regions merged: `choose`'s quality."""
        keys = ((r.pk, (task.pk, r.pk)) for r in routes)
        return {pk: self.per_route[key] for pk, key in keys if key in self.per_route}

    def latency(self, task: Task, routes: Sequence[Route], region: Region) -> dict[int, Stats]:
        """Per route id, in one region: `choose`'s latency."""
        keys = ((r.pk, (task.pk, r.pk, region.pk)) for r in routes)
        return {pk: self.per_region[key] for pk, key in keys if key in self.per_region}


def per_route(
    task: Task,
    *,
    since: datetime,
    until: datetime,
    grain: str,
    region: Region | None = None,
    histograms: bool = True,
) -> dict[int, Stats]:
    """A task's stats per route id over [since, until), all regions merged or in `region`:
    `choose`'s quality (counts only are enough) or a page's latency. Settled hours are kept
    between reads (rollups.stats_over): pages refresh themselves in open tabs."""
    where = {"task_id": task.pk} | ({"region_id": region.pk} if region is not None else {})
    found = rollups.stats_over(
        since=since,
        until=until,
        grain=grain,
        key_fields=["route_id"],
        all_regions=region is None,
        histograms=histograms,
        where=where,
        keep_settled=True,
    )
    return {k[0]: s for k, s in found.items() if k[0] is not None}


def fresh(task: Task, latency: Mapping[K, Stats], now: datetime) -> dict[K, Stats]:
    """Only the figures probed recently (Task.is_fresh): a route with nothing recent in a
    region cannot be its fastest."""
    return {key: s for key, s in latency.items() if task.is_fresh(s.last_probe_at, now)}


def _errors(stats: Stats | None) -> Rate:
    """The provider's failures out of its attempts in one region (Stats.attempts, with the
    failures summed once)."""
    if stats is None:
        return Rate(0, 0)
    failed = stats.provider_errors
    return Rate(failed, stats.count_ok + failed)


class _Later:
    """A part of a sort key worked out only when the parts before it tie (a tuple compares
    its items with == until two differ), then kept."""

    __slots__ = ("_make", "_value")

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make: Callable[[], Any] | None = make
        self._value: Any = None

    def value(self) -> Any:
        if self._make is not None:
            self._value, self._make = self._make(), None
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Later) and self.value() == other.value()

    def __lt__(self, other: _Later) -> bool:
        return bool(self.value() < other.value())

    __hash__ = None  # type: ignore[assignment]


def choose(
    task: Task,
    routes: Sequence[Route],
    latency: Mapping[int, Stats],
    quality: Mapping[int, Stats],
    *,
    now: datetime | None = None,
    incumbent: int | None = None,
) -> Choice:
    """`latency`: per route id, stats in this region; `quality`: per route id, all regions;
    `incumbent`: the current winner's route id (monitor.answer.winners), kept unless it stops
    qualifying or a challenger is faster with confidence; `now` judges "failing"."""
    metric = task.ranking_metric(routes)
    q = int(metric.partition("_p")[2])
    candidates: list[Candidate] = []
    for route in routes:
        region_stats = latency.get(route.pk)
        estimate = (
            percentile(region_stats.counts_for(metric, reference=True), q)
            if region_stats
            else NO_ESTIMATE
        )
        quality_stats = quality.get(route.pk)
        ok, reason, detail = quality_verdict(task, route, quality_stats)
        if ok:
            ok, reason, detail = availability_verdict(task, region_stats, now)
        if ok and estimate.point is None:
            ok, reason = False, REASON_FEW_SAMPLES
            detail = f"{estimate.n} reference probes, too few for {metric.replace('_', ' ')}"
        candidates.append(
            Candidate(
                route=route,
                metric=estimate,
                pass_rate=Rate(quality_stats.passed, quality_stats.graded)
                if quality_stats and quality_stats.graded
                else None,
                errors=_errors(region_stats),
                qualifies=ok,
                reason=reason,
                detail=detail,
            )
        )

    def price(c: Candidate) -> Decimal:
        return c.route.cost_usd(task.input_tokens, task.max_tokens)

    def rank(c: Candidate) -> tuple[int, float, _Later, _Later, int]:
        stats = latency.get(c.route.pk)
        # Equal to the millisecond counts as a tie, broken by e2e p95 (a histogram merged for
        # it: only when there is a tie to break), then price.
        value = float(round(c.metric_ms)) if c.metric_ms is not None else float("inf")
        p95 = _Later(lambda: (stats.e2e_ms(95) if stats else None) or float("inf"))
        return (0 if c.qualifies else 1, value, p95, _Later(lambda: price(c)), c.route.pk)

    def tied(a: Candidate, b: Candidate) -> bool:
        return not a.metric.faster_than(b.metric) and not b.metric.faster_than(a.metric)

    candidates.sort(key=rank)
    qualifying = [c for c in candidates if c.qualifies]
    if not qualifying:
        change = "" if incumbent is None else "no route qualifies any more"
        return Choice(winner=None, candidates=candidates, metric=metric, change=change)
    best = qualifying[0]
    if task.defaults.prefer_cheaper and not task.latency_metric:
        best = min((c for c in qualifying if tied(c, best)), key=lambda c: (price(c), rank(c)))
    held = next((c for c in qualifying if c.route.pk == incumbent), None)
    if held is not None and (held is best or not best.metric.faster_than(held.metric)):
        winner, change = held, ""
    else:
        winner = best
        if incumbent is None:
            change = "first route to qualify"
        elif held is None:
            gone = next((c for c in candidates if c.route.pk == incumbent), None)
            change = (
                f"{gone.route} stopped qualifying: {gone.detail or gone.reason}"
                if gone
                else "the previous winner is no longer a candidate"
            )
        else:
            change = (
                f"faster with confidence: {_range(best.metric)} against {held.route}'s "
                f"{_range(held.metric)} ({metric.replace('_', ' ')})"
            )
    ordered = [winner] + [c for c in candidates if c is not winner]
    marked = [
        c if c is winner or not c.qualifies else replace(c, tied=tied(c, winner)) for c in ordered
    ]
    return Choice(winner=winner, candidates=marked, metric=metric, change=change)


def _range(e: Estimate) -> str:
    def ms(v: float | None) -> str:
        return "?" if v is None else f"{v:.0f} ms"

    return f"{ms(e.point)} ({ms(e.low)}-{ms(e.high)})"
