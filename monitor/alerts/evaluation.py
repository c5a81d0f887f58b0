"""What each rule sees now: the subjects it finds breached, with the figures that say so.

Every figure is over exactly the rule's last W minutes (monitor.stats.window: the whole hours
inside it from the hourly rollups the pages read, its partial hours from the raw results folded
the same way), with the same 95% intervals as the pages (monitor.stats.confidence): a latency
rule fires only when the interval's lower bound is past the line, an availability rule only
when the whole Wilson interval of the provider's error rate is above the ceiling.

Agreement: a rule on a route is breached when K of the task's N regions see it
(AlertRule.min_regions, all of them with fewer than K). When every route of the task fails in
one region at once, that region is one "region path down" finding (subject region:<id>), and
the region does not count towards any single route's availability alert.

`evaluate(rule, now)` is pure reading: the lifecycle (monitor.alerts.lifecycle) turns findings
into state changes, and the backtest (monitor.alerts.backtest) runs it over past hours.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import NamedTuple, TypedDict, TypeVar

from django.urls import get_script_prefix, reverse

from monitor.alerts import onset
from monitor.alerts.models import (
    KIND_AVAILABILITY,
    KIND_LATENCY,
    KIND_MISSED_SLOTS,
    KIND_NO_WINNER,
    KIND_QUALITY,
    KIND_RATE_LIMIT,
    KIND_SERVED_MODEL,
    KIND_SPEND_CAP,
    KIND_STALE,
    KIND_WINNER_CHANGED,
    AlertRule,
)
from monitor.answer import winners
from monitor.answer.selection import REASON_QUALITY, quality_verdict
from monitor.models import ProbeResult, Region, Route, WinnerChange
from monitor.stats import health, hist, spend, window
from monitor.stats.confidence import Estimate, Rate, percentile
from monitor.stats.rollups import Stats

BASELINE_OFFSET = timedelta(days=7)  # "the same hours last week"
MIN_SLOTS_FOR_HEALTH = 10  # a region with fewer due slots in the window is not judged


class AlertFacts(TypedDict, total=False):
    """What a notification carries: the figure, its interval, the line, who agrees, why."""

    metric: str
    unit: str
    figure: float | None
    low: float | None
    high: float | None
    samples: int
    threshold: float | None
    threshold_label: str
    regions: list[str]  # the regions that agree
    regions_total: int
    regions_needed: int
    why: str
    link: str  # the page that explains it (a path; the message makes it absolute)


@dataclass(frozen=True)
class Finding:
    subject: str
    summary: str
    facts: AlertFacts
    route_id: int | None = None
    region_id: int | None = None
    # What the breach's onset is read from (monitor.alerts.onset): rules on probes in a
    # window. None: the minimum duration counts from the first confident evaluation.
    evidence: onset.Evidence | None = None


Keyed = dict[tuple[int | None, ...], Stats]
# Stats of the task's routes over [since, until): per (route id, region id), or per (route id,)
# with all regions merged (by_region False). Live: the rollups; the backtest: rows in memory.
Read = Callable[[datetime, datetime, bool], Keyed]


class Scope(NamedTuple):
    """What every rule kind's handler reads: the rule, the moment, the task's active routes
    and regions, and where rollup stats come from."""

    rule: AlertRule
    now: datetime
    routes: Sequence[Route]
    regions: Sequence[Region]
    read: Read


def _stats(
    task_id: int, route_ids: Sequence[int], since: datetime, until: datetime, by_region: bool
) -> Keyed:
    return window.task_stats(
        task_id=task_id, route_ids=route_ids, since=since, until=until, by_region=by_region
    )


def _route_page(route: Route, rule: AlertRule) -> str:
    return _route_path(route.pk, get_script_prefix()) + f"?task={rule.task.slug}"


@lru_cache(maxsize=1024)
def _route_path(route_id: int, prefix: str) -> str:
    """A route page's path (`prefix`: the script prefix reverse() reads, in the key so that a
    cached path never carries another deployment's). Cached: the backtest names every route's
    page in every hour it replays, and reverse() was a third of its time."""
    return reverse("rw-route", args=[route_id])


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "?"
    if unit == "ms":
        return f"{value:,.0f} ms"
    if unit == "tokens/s":
        return f"{value:,.1f} tokens/s"
    return f"{value * 100:.1f}%"


def _needed(rule: AlertRule, total: int) -> int:
    return max(1, min(rule.min_regions, total))


V = TypeVar("V")


def _seen_in(
    current: Keyed,
    route: Route,
    regions: Sequence[Region],
    judge: Callable[[Region, Stats], V | None],
) -> list[tuple[Region, V]]:
    """The regions whose figures for `route` the rule finds past its line, each with what
    `judge` made of them (None: not past it); regions without figures are not judged. Every
    per-route rule counts its K of N on this list."""
    seen = []
    for region in regions:
        stats = current.get((route.pk, region.pk))
        if stats is None:
            continue
        verdict = judge(region, stats)
        if verdict is not None:
            seen.append((region, verdict))
    return seen


def evaluate(rule: AlertRule, now: datetime, read: Read | None = None) -> list[Finding]:
    """The subjects `rule` finds breached at `now` (those it does not list are clear); `read`:
    where rollup stats come from (the backtest's rows in memory; default the database)."""
    task = rule.task
    routes = [r for r in task.routes.all() if r.is_active]
    regions = [g for g in task.regions.all() if g.is_active]
    if not routes and rule.kind not in (KIND_MISSED_SLOTS, KIND_SPEND_CAP):
        return []
    task_id = task.pk
    route_ids = [r.pk for r in task.routes.all()]

    def live(since: datetime, until: datetime, by_region: bool) -> Keyed:
        return _stats(task_id, route_ids, since, until, by_region)

    return _HANDLERS[rule.kind](Scope(rule, now, routes, regions, read or live))


def _latency(scope: Scope) -> list[Finding]:
    rule, now, routes, regions, read = scope
    metric = rule.effective_metric()
    speed = metric.startswith("tps")
    unit = "tokens/s" if speed else "ms"
    q = int(metric.rpartition("_p")[2])
    current = read(now - rule.window(), now, True)
    baseline = (
        read(now - BASELINE_OFFSET - rule.window(), now - BASELINE_OFFSET, True)
        if rule.baseline_ratio
        else {}
    )
    absolute = rule.effective_threshold()
    findings = []
    for route in routes:

        def past(
            region: Region, stats: Stats, route: Route = route
        ) -> tuple[Estimate, float] | None:
            est = _estimate(stats, metric, q)
            line = absolute
            if rule.baseline_ratio:
                before = baseline.get((route.pk, region.pk))
                base = _estimate(before, metric, q).point if before else None
                if base is None:
                    return None  # no baseline to hold it against
                ratio_line = base / rule.baseline_ratio if speed else base * rule.baseline_ratio
                line = ratio_line if line is None else line
            if line is None:
                return None
            beyond = (
                (est.high is not None and est.high < line)
                if speed
                else (est.low is not None and est.low > line)
            )
            return (est, line) if beyond else None

        agreeing = [(g, est, line) for g, (est, line) in _seen_in(current, route, regions, past)]
        if len(agreeing) >= _needed(rule, len(regions)) and agreeing:
            worst = max(agreeing, key=lambda a: (a[1].low or 0) if not speed else -(a[1].high or 0))
            region, est, line = worst
            label = (
                f"{rule.baseline_ratio:g}x its figure the same hours last week"
                if rule.baseline_ratio
                else "the budget"
            )
            bound = "upper" if speed else "lower"
            why = (
                f"{metric.replace('_', ' ')} {_fmt(est.point, unit)} "
                f"(95% interval {_fmt(est.low, unit)}-{_fmt(est.high, unit)}, {est.n} samples) "
                f"in {region.slug}: its {bound} bound is {'below' if speed else 'above'} "
                f"{_fmt(line, unit)} ({label}); {len(agreeing)} of {len(regions)} regions agree"
            )
            findings.append(
                Finding(
                    subject=f"route:{route.pk}",
                    route_id=route.pk,
                    summary=f"{route} slower on {metric.replace('_', ' ')}: {_fmt(est.point, unit)}"
                    f" ({_fmt(est.low, unit)}-{_fmt(est.high, unit)}, n={est.n}) past "
                    f"{_fmt(line, unit)}",
                    facts=AlertFacts(
                        metric=metric,
                        unit=unit,
                        figure=est.point,
                        low=est.low,
                        high=est.high,
                        samples=est.n,
                        threshold=line,
                        threshold_label=label,
                        regions=sorted(a[0].slug for a in agreeing),
                        regions_total=len(regions),
                        regions_needed=_needed(rule, len(regions)),
                        why=why,
                        link=_route_page(route, rule),
                    ),
                    evidence=onset.Evidence(
                        kind=onset.LATENCY,
                        share=1 - q / 100,
                        units=tuple((route.pk, a[0].pk) for a in agreeing),
                        needed=_needed(rule, len(regions)),
                        metric=metric,
                        lines={(route.pk, a[0].pk): a[2] for a in agreeing},
                    ),
                )
            )
    return findings


def _estimate(stats: Stats, metric: str, q: int) -> Estimate:
    if metric.startswith("tps"):
        return percentile(stats.tps_counts, q, hist.TPS)
    return percentile(stats.counts_for(metric, reference=True), q)


def _errors(stats: Stats) -> Rate:
    failed = stats.provider_errors
    return Rate(failed, stats.count_ok + failed)


def _availability(scope: Scope) -> list[Finding]:
    rule, now, routes, regions, read = scope
    ceiling = rule.effective_ceiling()
    current = read(now - rule.window(), now, True)

    def past(region: Region, stats: Stats) -> Rate | None:
        errors = _errors(stats)
        return errors if errors.low is not None and errors.low > ceiling else None

    failing: dict[int, dict[int, Rate]] = {}  # region id -> route id -> its errors
    for route in routes:
        for region, errors in _seen_in(current, route, regions, past):
            failing.setdefault(region.pk, {})[route.pk] = errors
    findings = []
    down = {g for g in regions if len(failing.get(g.pk, {})) == len(routes) and len(routes) > 1}
    for region in sorted(down, key=lambda g: g.slug):
        rates = failing[region.pk]
        k = sum(r.k for r in rates.values())
        n = sum(r.n for r in rates.values())
        why = (
            f"every one of the task's {len(routes)} routes fails in {region.slug} "
            f"({k} of {n} probes, each route's error rate surely above the "
            f"{ceiling * 100:.1f}% ceiling): the path from this region is down, not a provider"
        )
        findings.append(
            Finding(
                subject=f"region:{region.pk}",
                region_id=region.pk,
                summary=f"region path down: {region.slug} ({k} of {n} probes failed)",
                facts=AlertFacts(
                    metric="error_rate",
                    unit="share",
                    figure=k / n if n else None,
                    samples=n,
                    threshold=ceiling,
                    threshold_label="the error ceiling",
                    regions=[region.slug],
                    regions_total=len(regions),
                    regions_needed=1,
                    why=why,
                    link=reverse("rw-regions"),
                ),
                evidence=onset.Evidence(
                    kind=onset.ERRORS,
                    share=ceiling,
                    units=tuple((route_id, region.pk) for route_id in rates),
                    needed=len(rates),
                ),
            )
        )
    counted = [g for g in regions if g not in down]
    needed = _needed(rule, len(counted)) if counted else 1
    for route in routes:
        agreeing = [
            (g, failing[g.pk][route.pk]) for g in counted if route.pk in failing.get(g.pk, {})
        ]
        if not agreeing or len(agreeing) < needed:
            continue
        region, rate = max(agreeing, key=lambda a: a[1].low or 0.0)
        why = (
            f"error rate {_fmt(rate.point, 'share')} ({rate.k} of {rate.n} probes, 95% interval "
            f"{_fmt(rate.low, 'share')}-{_fmt(rate.high, 'share')}) in {region.slug}, surely above "
            f"the {_fmt(ceiling, 'share')} ceiling; {len(agreeing)} of {len(counted)} regions agree"
        )
        findings.append(
            Finding(
                subject=f"route:{route.pk}",
                route_id=route.pk,
                summary=f"{route} fails: {_fmt(rate.point, 'share')} errors ({rate.k} of "
                f"{rate.n}) above {_fmt(ceiling, 'share')}",
                facts=AlertFacts(
                    metric="error_rate",
                    unit="share",
                    figure=rate.point,
                    low=rate.low,
                    high=rate.high,
                    samples=rate.n,
                    threshold=ceiling,
                    threshold_label="the error ceiling",
                    regions=sorted(a[0].slug for a in agreeing),
                    regions_total=len(counted),
                    regions_needed=needed,
                    why=why,
                    link=_route_page(route, rule),
                ),
                evidence=onset.Evidence(
                    kind=onset.ERRORS,
                    share=ceiling,
                    units=tuple((route.pk, a[0].pk) for a in agreeing),
                    needed=needed,
                ),
            )
        )
    return findings


def _no_winner(scope: Scope) -> list[Finding]:
    rule, regions = scope.rule, scope.regions
    task = rule.task
    latest = winners.latest([task.pk])
    empty = [
        (g, latest[(task.pk, g.pk)])
        for g in regions
        if (task.pk, g.pk) in latest and latest[(task.pk, g.pk)].route_id is None
    ]
    if not empty or len(empty) < _needed(rule, len(regions)):
        return []
    reasons = "; ".join(f"{g.slug}: {w.reason}" for g, w in empty)
    return [
        Finding(
            subject="task",
            summary=f"no route qualifies for {task} in {len(empty)} of {len(regions)} regions",
            facts=AlertFacts(
                regions=sorted(g.slug for g, _ in empty),
                regions_total=len(regions),
                regions_needed=_needed(rule, len(regions)),
                why=reasons[:400],
                link=reverse("rw-task", args=[task.slug]),
            ),
        )
    ]


def _winner_changed(scope: Scope) -> list[Finding]:
    """One event per winner change recorded since the rule was made (the lifecycle keeps
    each subject's event once)."""
    rule, now = scope.rule, scope.now
    since = max(rule.created_at, now - rule.window())
    changes = WinnerChange.objects.filter(
        task=rule.task, at__gt=since, at__lte=now, route__isnull=False
    ).select_related("route", "previous", "region")
    return [
        Finding(
            subject=f"change:{c.pk}",
            route_id=c.route_id,
            region_id=c.region_id,
            summary=f"winner in {c.region.slug} is now {c.route} (was {c.previous or 'none'})",
            facts=AlertFacts(
                regions=[c.region.slug],
                why=c.reason,
                link=reverse("rw-task", args=[rule.task.slug]),
            ),
        )
        for c in changes
    ]


def _quality(scope: Scope) -> list[Finding]:
    rule, now, routes, read = scope.rule, scope.now, scope.routes, scope.read
    task = rule.task
    merged = read(now - rule.window(), now, False)
    findings = []
    for route in routes:
        ok, reason, detail = quality_verdict(task, route, merged.get((route.pk,)))
        if ok or reason != REASON_QUALITY:
            continue
        findings.append(
            Finding(
                subject=f"route:{route.pk}",
                route_id=route.pk,
                summary=f"{route} below the quality bar: {detail}",
                facts=AlertFacts(why=detail, link=reverse("rw-route", args=[route.pk])),
            )
        )
    return findings


def _served_model(scope: Scope) -> list[Finding]:
    """The model a route's responses name changed within the window (an event per new
    model: `model:<route>:<model>`)."""
    rule, now, routes = scope.rule, scope.now, scope.routes
    findings = []
    for route in routes:
        seen = list(
            ProbeResult.objects.filter(
                task=rule.task,
                route=route,
                started_at__gte=now - rule.window(),
                started_at__lte=now,
                served_model__gt="",
            )
            .order_by("-started_at")
            .values_list("served_model", flat=True)[:500]
        )
        if not seen:
            continue
        newest = seen[0]
        before = next((m for m in seen if m != newest), None)
        if before is None:
            continue
        findings.append(
            Finding(
                subject=f"model:{route.pk}:{newest}"[:60],
                route_id=route.pk,
                summary=f"{route} is now served by {newest} (was {before})",
                facts=AlertFacts(
                    why=f"responses name {newest!r}; earlier ones in the window named {before!r}",
                    link=_route_page(route, rule),
                ),
            )
        )
    return findings


def _stale(scope: Scope) -> list[Finding]:
    """A region with no fresh probe of any of the task's routes: silence is never healthy."""
    rule, now, regions, read = scope.rule, scope.now, scope.regions, scope.read
    task = rule.task
    stale_after = task.stale_after()
    current = read(now - max(rule.window(), stale_after * 2), now, True)
    findings = []
    for region in regions:
        last = max(
            (
                s.last_probe_at
                for (_, g), s in current.items()
                if g == region.pk and s.last_probe_at
            ),
            default=None,
        )
        if task.is_fresh(last, now):
            continue
        said = f"last probe {last:%Y-%m-%d %H:%M} UTC" if last else "no probe in the window"
        findings.append(
            Finding(
                subject=f"region:{region.pk}",
                region_id=region.pk,
                summary=f"{task} figures stale in {region.slug}: {said}",
                facts=AlertFacts(
                    regions=[region.slug],
                    why=f"{said}; figures older than {stale_after} are stale",
                    link=reverse("rw-status"),
                ),
            )
        )
    return findings


def _missed_slots(scope: Scope) -> list[Finding]:
    rule, now, regions = scope.rule, scope.now, scope.regions
    ceiling = rule.effective_ceiling()
    found = health.schedules(now, rule.window(), with_lags=False)
    findings = []
    for region in regions:
        schedule = found.get(region.pk)
        if schedule is None or schedule.due < MIN_SLOTS_FOR_HEALTH:
            continue
        share = schedule.missed_share or 0.0
        if share <= ceiling:
            continue
        why = (
            f"{schedule.missed} of {schedule.due} slots missed in {region.slug} "
            f"({share * 100:.1f}%, above {ceiling * 100:.1f}%): our workers there are down or "
            "overloaded (missed slots are ours, never a provider's)"
        )
        findings.append(
            Finding(
                subject=f"region:{region.pk}",
                region_id=region.pk,
                summary=f"region {region.slug} misses slots: {schedule.missed} of {schedule.due}",
                facts=AlertFacts(
                    figure=share,
                    unit="share",
                    samples=schedule.due,
                    threshold=ceiling,
                    regions=[region.slug],
                    why=why,
                    link=reverse("rw-status"),
                ),
            )
        )
    return findings


def _spend_cap(scope: Scope) -> list[Finding]:
    rule, now = scope.rule, scope.now
    state = spend.cap_states([rule.task], now).get(rule.task.pk)
    if state is None:
        return []
    return [
        Finding(
            subject="task",
            summary=state.reason[:300],
            facts=AlertFacts(
                figure=float(state.committed_usd),
                unit="usd",
                threshold=float(state.cap_usd),
                why=state.reason,
                link=reverse("rw-task", args=[rule.task.slug]),
            ),
        )
    ]


def _rate_limit(scope: Scope) -> list[Finding]:
    """Headroom: the share of probes answered 429 (rate limited), surely above the line."""
    rule, now, routes, regions, read = scope
    ceiling = rule.effective_ceiling()
    current = read(now - rule.window(), now, True)
    findings = []

    def past(region: Region, stats: Stats) -> Rate | None:
        limited = Rate(stats.error_kinds.get("http_429", 0), stats.count_ok + stats.count_error)
        return limited if limited.low is not None and limited.low > ceiling else None

    for route in routes:
        agreeing = _seen_in(current, route, regions, past)
        if agreeing and len(agreeing) >= _needed(rule, len(regions)):
            region, rate = agreeing[0]
            findings.append(
                Finding(
                    subject=f"route:{route.pk}",
                    route_id=route.pk,
                    summary=f"{route} rate limited: {rate.k} of {rate.n} probes got HTTP 429",
                    facts=AlertFacts(
                        figure=rate.point,
                        low=rate.low,
                        high=rate.high,
                        unit="share",
                        samples=rate.n,
                        threshold=ceiling,
                        regions=sorted(a[0].slug for a in agreeing),
                        regions_total=len(regions),
                        regions_needed=_needed(rule, len(regions)),
                        why=f"{rate.k} of {rate.n} probes in {region.slug} were refused with "
                        f"HTTP 429, surely more than {ceiling * 100:.0f}%",
                        link=_route_page(route, rule),
                    ),
                    evidence=onset.Evidence(
                        kind=onset.RATE_LIMITED,
                        share=ceiling,
                        units=tuple((route.pk, a[0].pk) for a in agreeing),
                        needed=_needed(rule, len(regions)),
                    ),
                )
            )
    return findings


Handler = Callable[[Scope], list[Finding]]
_HANDLERS: dict[str, Handler] = {
    KIND_LATENCY: _latency,
    KIND_AVAILABILITY: _availability,
    KIND_NO_WINNER: _no_winner,
    KIND_WINNER_CHANGED: _winner_changed,
    KIND_QUALITY: _quality,
    KIND_SERVED_MODEL: _served_model,
    KIND_STALE: _stale,
    KIND_MISSED_SLOTS: _missed_slots,
    KIND_SPEND_CAP: _spend_cap,
    KIND_RATE_LIMIT: _rate_limit,
}
