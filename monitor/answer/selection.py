"""The fastest qualifying route: the one question the product answers.

For a task and a region, over a window: among the task's routes that clear its bar, the one
lowest on the task's ranking metric (Task.ranking_metric), measured on the task's reference
option set only (Task.reference: other option probes feed comparisons, never the ranking).

A route qualifies when, in order:
- Quality: with `min_quality_index`, the route's external index is at or above it. With
  `min_pass_rate`, the route has at least Task.graded_needed() graded probes in the window (all
  regions together: quality does not depend on where you call from) and the whole 95% Wilson
  interval of its pass rate is at or above the bar (monitor.stats.confidence): 8 of 10 does
  not clear 80%, it might be 49%. The incumbent keeps clearing it until its whole interval is
  below the bar, so a route whose rate sits near the bar does not take and lose the cell as
  its interval's low end moves.
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

First winner: with no incumbent, the best qualifying route is named only once the 95%
interval of its metric has both ends (confidence.samples_to_close: 6 samples for a median, 72
for a p95); until then the choice says "collecting: 3 of 6 reference probes".

Stability: the current winner (the incumbent, monitor.models.WinnerChange) stays the winner
unless it stops qualifying or a challenger takes over: the challenger is faster with
confidence (its 95% interval wholly below the incumbent's), or every one of its samples lies
below every one of the incumbent's (confidence.all_below; five below five is enough, whatever
the intervals say). Routes whose intervals overlap the winner's are "tied within noise". Two
routes 1% apart therefore never swap back and forth, and a route 30% faster (lognormal spread,
sigma 0.3) takes over after a median of about 10 of its probes in the window, within 30 in 95%
of cases (tests/monitor/answer/test_trust.py measures both; docs/answer.md).

Silence is not evidence: a route with no probe of its own for Task.stale_after() (its slots
missed by our workers, or not scheduled) keeps its figures here, marked stale, with the facts
of the silence as the reason. A stale route cannot take a cell; a stale incumbent keeps it
(a missed slot is ours, never the route's) for up to silence_limit(), after which any fresh
qualifying route takes over. With no fresh route to take over it stays, marked stale. It loses
the cell earlier only on its own figures (failing, errors, quality).

No route qualifies: `winner` is None, `reason` says why for the task as a whole (how many routes
were judged, what each lacked) and every candidate carries its own reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

# The figures the decision reads moved to monitor.answer.window; callers read them here.
from monitor.answer.window import Window as Window
from monitor.answer.window import per_route as per_route
from monitor.models import SLOT_MISSED, ProbeSlot, Region, Route, Task, fresh_within
from monitor.stats import confidence, hist
from monitor.stats.confidence import NO_ESTIMATE, Estimate, Rate, percentile
from monitor.stats.rollups import Stats

K = TypeVar("K")

REASON_QUALITY = "below the quality bar"
REASON_UNGRADED = "too few graded probes"
REASON_NO_INDEX = "no quality index"
REASON_ERRORS = "fails too often"
REASON_FAILING = "failing"
REASON_FEW_SAMPLES = "too few samples"
REASON_SILENT = "no recent probe"

# A winner whose probes stopped arriving keeps its cell this many times Task.stale_after(), and
# at least an hour (silence_limit).
SILENCE_KEPT = 3
SILENCE_KEPT_AT_LEAST = timedelta(hours=1)


def silence_limit(task: Task) -> timedelta:
    """How long a winner with no probe of its own keeps its cell against fresh routes."""
    return max(SILENCE_KEPT * task.stale_after(), SILENCE_KEPT_AT_LEAST)


def _ago(delta: timedelta) -> str:
    minutes = delta.total_seconds() / 60
    if minutes < 120:
        return f"{minutes:.0f} min"
    return f"{minutes / 60:.1f} h"


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
    # No probe of its own for Task.stale_after(): its figures are kept, and `silence` says
    # since when and what we know of why ("no probe for 6 min: 6 slots since were missed by
    # our ap-south workers").
    stale: bool = False
    silence: str = ""

    @property
    def metric_ms(self) -> float | None:
        return self.metric.point


@dataclass(frozen=True)
class Choice:
    winner: Candidate | None
    candidates: list[Candidate]  # the winner, then the qualifying by metric, then the rest
    metric: str = ""
    change: str = ""  # why the winner is not the incumbent ("" when it is, or both are None)
    # Why no route wins, for the task as a whole ("" when one does).
    no_winner: str = ""

    @property
    def reason(self) -> str:
        if self.winner:
            return ""
        if not self.candidates:
            return "no candidate routes"
        return self.no_winner or "no route meets the bar"

    @property
    def runner_up(self) -> Candidate | None:
        rest = [c for c in self.candidates[1:] if c.qualifies]
        return rest[0] if self.winner and rest else None

    @property
    def changed(self) -> bool:
        return bool(self.change)


def quality_verdict(
    task: Task, route: Route, quality: Stats | None, *, incumbent: bool = False
) -> tuple[bool, str, str]:
    """(qualifies, reason, detail) on the quality bar alone. A pass rate qualifies a route when
    its whole interval is at or above the bar; the incumbent keeps qualifying until its whole
    interval is below it. Without that margin a route whose true rate sits near the bar (84%
    against 80%, its interval's low end moving around 80% as samples come and go) took the
    cell and lost it again every few minutes on `make run`."""
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
        shown = f"pass rate {quality.passed}/{quality.graded} ({_pct(rate.low)}-{_pct(rate.high)})"
        if incumbent and rate.high < task.min_pass_rate:
            return False, REASON_QUALITY, f"{shown} surely below {_pct(task.min_pass_rate)}"
        if not incumbent and rate.low < task.min_pass_rate:
            return (
                False,
                REASON_QUALITY,
                f"{shown} not surely at or above {_pct(task.min_pass_rate)}",
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


def missed_since(
    task: Task, region: Region, last_probe_at: Mapping[int, datetime | None], now: datetime
) -> dict[int, int]:
    """Per route id, the slots our workers missed in `region` since the route's last probe
    (within silence_limit() when it never had one): the facts of a silence. One query, for
    stale routes only."""
    return missed_in_regions(task, {region.pk: last_probe_at}, now).get(region.pk, {})


def missed_in_regions(
    task: Task, quiet: Mapping[int, Mapping[int, datetime | None]], now: datetime
) -> dict[int, dict[int, int]]:
    """missed_since for several regions at once (region id -> its stale routes' last probes):
    one query for a page that decides in every region, not one a region."""
    quiet = {region_id: routes for region_id, routes in quiet.items() if routes}
    if not quiet:
        return {}
    floor = now - silence_limit(task)
    found = {region_id: dict.fromkeys(routes, 0) for region_id, routes in quiet.items()}
    earliest = min(v or floor for routes in quiet.values() for v in routes.values())
    rows = ProbeSlot.objects.filter(
        task=task,
        region_id__in=list(quiet),
        route_id__in={route_id for routes in quiet.values() for route_id in routes},
        status=SLOT_MISSED,
        slot_at__gt=earliest,
    ).values_list("region_id", "route_id", "slot_at")
    for region_id, route_id, slot_at in rows:
        if route_id not in quiet[region_id]:
            continue  # stale in another region only
        if slot_at > (quiet[region_id][route_id] or floor):
            found[region_id][route_id] += 1
    return found


def quiet_routes(
    task: Task, routes: Sequence[Route], latency: Mapping[int, Stats], now: datetime
) -> dict[int, datetime | None]:
    """The routes that are not fresh in a region (route id -> its last probe there, if any)."""
    last = {r.pk: (latency[r.pk].last_probe_at if r.pk in latency else None) for r in routes}
    return {pk: at for pk, at in last.items() if not task.is_fresh(at, now)}


def decide(
    task: Task,
    routes: Sequence[Route],
    latency: Mapping[int, Stats],
    quality: Mapping[int, Stats],
    *,
    region: Region | None = None,
    now: datetime | None = None,
    incumbent: int | None = None,
    missed: Mapping[int, int] | None = None,
) -> Choice:
    """The one decision every caller makes (the overview's board, the task and regions pages,
    the digest): `choose`, with the facts of each stale route's silence read for it (or given:
    `missed`, from missed_in_regions, when a caller decides in several regions)."""
    if missed is None:
        missed = {}
        if region is not None and now is not None:
            quiet = quiet_routes(task, routes, latency, now)
            missed = missed_since(task, region, quiet, now)
    return choose(
        task,
        routes,
        latency,
        quality,
        now=now,
        incumbent=incumbent,
        missed=missed,
        region_label=region.slug if region is not None else "",
    )


def _silence(
    task: Task, stats: Stats | None, now: datetime, missed: int | None, region_label: str
) -> str:
    """A stale route's silence in facts: how long, and the slots we missed since."""
    last = stats.last_probe_at if stats else None
    said = f"no probe for {_ago(now - last)}" if last else "no probe in the window"
    if missed:
        where = f" by our {region_label} workers" if region_label else ""
        said += f": {missed} slot{'s' if missed != 1 else ''} since were missed{where}"
    return said


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


def _unit(metric: str) -> str:
    return "scenarios" if metric.startswith("app_e2e") else "reference probes"


def _candidates(
    task: Task,
    routes: Sequence[Route],
    latency: Mapping[int, Stats],
    quality: Mapping[int, Stats],
    metric: str,
    now: datetime | None,
    incumbent: int | None,
    missed: Mapping[int, int] | None,
    region_label: str,
) -> tuple[list[Candidate], set[int]]:
    """Each route judged against the bar (quality, availability, freshness, samples), unranked;
    and the routes silent past the limit a winner keeps its cell without probes."""
    q = int(metric.partition("_p")[2])
    unit = _unit(metric)
    candidates: list[Candidate] = []
    silent_too_long: set[int] = set()
    for route in routes:
        region_stats = latency.get(route.pk)
        estimate = (
            percentile(region_stats.counts_for(metric, reference=True), q)
            if region_stats
            else NO_ESTIMATE
        )
        quality_stats = quality.get(route.pk)
        ok, reason, detail = quality_verdict(
            task, route, quality_stats, incumbent=route.pk == incumbent
        )
        if ok:
            ok, reason, detail = availability_verdict(task, region_stats, now)
        last = region_stats.last_probe_at if region_stats else None
        stale = now is not None and not task.is_fresh(last, now)
        silence = (
            _silence(task, region_stats, now, (missed or {}).get(route.pk), region_label)
            if stale and now is not None
            else ""
        )
        if ok and stale and now is not None:
            # A stale incumbent keeps qualifying (its silence is ours until shown otherwise);
            # past silence_limit() any fresh qualifying route may take its cell.
            if route.pk != incumbent:
                ok, reason, detail = False, REASON_SILENT, silence
            elif last is None or now - last > silence_limit(task):
                silent_too_long.add(route.pk)
        if ok and estimate.point is None:
            ok, reason = False, REASON_FEW_SAMPLES
            needed = hist.MIN_SAMPLES.get(q, 1)
            detail = f"{estimate.n} of {needed} {unit} needed for {metric.replace('_', ' ')}"
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
                stale=stale,
                silence=silence,
            )
        )

    return candidates, silent_too_long


def choose(
    task: Task,
    routes: Sequence[Route],
    latency: Mapping[int, Stats],
    quality: Mapping[int, Stats],
    *,
    now: datetime | None = None,
    incumbent: int | None = None,
    missed: Mapping[int, int] | None = None,
    region_label: str = "",
) -> Choice:
    """`latency`: per route id, stats in this region (stale ones too: silence is judged here);
    `quality`: per route id, all regions; `incumbent`: the current winner's route id
    (monitor.answer.winners); `now` judges "failing" and "stale" (None: neither, as for a past
    week); `missed`: per stale route id, the slots our workers missed since its last probe
    (`decide` reads them)."""
    metric = task.ranking_metric(routes)
    candidates, silent_too_long = _candidates(
        task, routes, latency, quality, metric, now, incumbent, missed, region_label
    )
    order = _Order(task, latency, metric)
    candidates.sort(key=order.rank)
    qualifying = [c for c in candidates if c.qualifies]
    held = next((c for c in qualifying if c.route.pk == incumbent), None)
    fresh = [c for c in qualifying if not c.stale]
    if held is not None and held.route.pk in silent_too_long and fresh:
        qualifying = fresh  # silent past the limit: any fresh qualifying route takes the cell
    if not qualifying:
        change = "" if incumbent is None else "no route qualifies any more"
        return Choice(
            winner=None,
            candidates=candidates,
            metric=metric,
            change=change,
            no_winner=_no_winner(candidates, metric, int(metric.partition("_p")[2])),
        )
    best = qualifying[0]
    if task.defaults.prefer_cheaper and not task.latency_metric:
        best = min(
            (c for c in qualifying if order.tied(c, best)),
            key=lambda c: (order.price(c), order.rank(c)),
        )
    return _crown(task, best, held, qualifying, candidates, incumbent, order)


@dataclass(frozen=True)
class _Order:
    """How candidates compare: qualifying first, then the metric to the millisecond (equal
    counts as a tie, broken by e2e p95, merged only when there is a tie to break, then price,
    then route id); "tied within noise" when neither is faster with confidence."""

    task: Task
    latency: Mapping[int, Stats]
    metric: str

    def price(self, c: Candidate) -> Decimal:
        return c.route.cost_usd(self.task.input_tokens, self.task.max_tokens)

    def rank(self, c: Candidate) -> tuple[int, float, _Later, _Later, int]:
        stats = self.latency.get(c.route.pk)
        value = float(round(c.metric_ms)) if c.metric_ms is not None else float("inf")
        p95 = _Later(lambda: (stats.e2e_ms(95) if stats else None) or float("inf"))
        return (0 if c.qualifies else 1, value, p95, _Later(lambda: self.price(c)), c.route.pk)

    @staticmethod
    def tied(a: Candidate, b: Candidate) -> bool:
        return not a.metric.faster_than(b.metric) and not b.metric.faster_than(a.metric)

    def counts(self, c: Candidate) -> dict[int, int]:
        stats = self.latency.get(c.route.pk)
        return stats.counts_for(self.metric, reference=True) if stats else {}


def _crown(
    task: Task,
    best: Candidate,
    held: Candidate | None,
    qualifying: list[Candidate],
    candidates: list[Candidate],
    incumbent: int | None,
    order: _Order,
) -> Choice:
    """The winner among qualifying routes, `best` ranked first, and why it changed: the
    incumbent (`held`) keeps its cell unless a challenger takes it over; a first winner is
    named only by a closed interval."""
    metric, q = order.metric, int(order.metric.partition("_p")[2])
    if held is not None and held in qualifying:
        takeover = _takeover(best, held, metric, _unit(metric), order.counts)
        if takeover is None:
            return _choice(
                best=held, candidates=candidates, metric=metric, change="", tied=order.tied
            )
        change = takeover
    elif held is not None:
        change = f"{held.route} {held.silence}, longer than the {_ago(silence_limit(task))} a winner keeps its cell without probes"
    elif incumbent is None:
        if best.metric.low is None or best.metric.high is None:
            # The first winner is named by a closed interval: at 5 samples a median's has no
            # upper end, and whoever got there first would keep the cell as "tied".
            needed = confidence.samples_to_close(q)
            return Choice(
                winner=None,
                candidates=candidates,
                metric=metric,
                no_winner=f"collecting: {best.metric.n} of {needed} {_unit(metric)} "
                f"({best.route}, the fastest so far)",
            )
        change = "first route to qualify"
    else:
        gone = next((c for c in candidates if c.route.pk == incumbent), None)
        change = (
            f"{gone.route} stopped qualifying: {gone.detail or gone.reason}"
            if gone
            else "the previous winner is no longer a candidate"
        )
    return _choice(best=best, candidates=candidates, metric=metric, change=change, tied=order.tied)


def _takeover(
    best: Candidate,
    held: Candidate,
    metric: str,
    unit: str,
    counts: Callable[[Candidate], dict[int, int]],
) -> str | None:
    """Why `best` takes the incumbent's cell, or None when the incumbent keeps it: a challenger
    must be faster with confidence (or have all its samples below all of the incumbent's)."""
    takes_over = best is not held and (
        best.metric.faster_than(held.metric) or confidence.all_below(counts(best), counts(held))
    )
    if not takes_over:
        return None
    if best.metric.faster_than(held.metric):
        return (
            f"faster with confidence: {_range(best.metric)} against {held.route}'s "
            f"{_range(held.metric)} ({metric.replace('_', ' ')})"
        )
    return (
        f"all {best.metric.n} of its {unit} below all {held.metric.n} of "
        f"{held.route}'s ({metric.replace('_', ' ')})"
    )


def _choice(
    *,
    best: Candidate,
    candidates: list[Candidate],
    metric: str,
    change: str,
    tied: Callable[[Candidate, Candidate], bool],
) -> Choice:
    ordered = [best] + [c for c in candidates if c is not best]
    marked = [
        c if c is best or not c.qualifies else replace(c, tied=tied(c, best)) for c in ordered
    ]
    return Choice(winner=best, candidates=marked, metric=metric, change=change)


def _no_winner(candidates: Sequence[Candidate], metric: str, q: int) -> str:
    """Why no route wins, for the task as a whole: how many were judged and what each lacked;
    "collecting" when all that is missing is samples."""
    if candidates and all(c.reason == REASON_FEW_SAMPLES for c in candidates):
        most = max(candidates, key=lambda c: c.metric.n)
        needed = confidence.samples_to_close(q)
        return f"collecting: {most.metric.n} of {needed} {_unit(metric)} ({most.route}, the most so far)"
    n = len(candidates)
    lacks = "; ".join(f"{c.route}: {c.detail or c.reason}" for c in candidates)
    return f"no route meets the bar ({n} route{'s' if n != 1 else ''} judged: {lacks})"


def _range(e: Estimate) -> str:
    def ms(v: float | None) -> str:
        return "?" if v is None else f"{v:.0f} ms"

    return f"{ms(e.point)} ({ms(e.low)}-{ms(e.high)})"
