"""The weekly digest's figures: what changed for each task between two weeks.

For a week that ends at the subscriber's chosen local time (rounded down to the hour, so it is
exactly 168 hourly rollup buckets) and the week before it, per task:
- per region, the fastest qualifying route of each week (monitor.answer.selection over the week's
  rollups, quality from all regions) and, when it changed, why: a faster route appeared, last
  week's winner dropped below the quality bar, or it failed too often to be measured;
- p50/p95 TTFT and e2e of the fastest route, week over week, with a direction;
- regressions: any (route, region) whose p50/p95 TTFT or e2e worsened by more than
  DIGEST_REGRESSION_PCT percent against the same route and region last week;
- latency-budget compliance of the fastest route (Task.budget_status);
- error rate and probe spend of the whole task (all routes, all regions).
Every figure comes from the rollups. Sending them is monitor.digest.sending.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import QuerySet
from django.urls import NoReverseMatch, reverse

from monitor.answer import board, selection
from monitor.models import (
    APP_E2E_METRICS,
    BUDGET_STATUSES,
    GRAIN_HOUR,
    LATENCY_METRICS,
    METRIC_E2E_P50,
    METRIC_E2E_P95,
    METRIC_TTFT_P50,
    METRIC_TTFT_P95,
    STATUS_NEAR,
    STATUS_OK,
    Region,
    Route,
    Subscription,
    Task,
)
from monitor.stats import rollups
from monitor.stats.confidence import NO_ESTIMATE, Estimate, percentile
from monitor.stats.rollups import Stats
from monitor.templatetags.rw import ms as format_ms
from monitor.templatetags.rw import pct as format_pct

WEEK = timedelta(days=7)
# Percentiles read back from the log-bucket histograms are within about 2.5% (monitor.stats.hist):
# a smaller change is noise, reported as steady.
STEADY_PCT = 3.0

# (metric, label), in the order of RegionDigest.changes
METRICS = [
    (metric, dict(LATENCY_METRICS)[metric])
    for metric in (METRIC_TTFT_P50, METRIC_TTFT_P95, METRIC_E2E_P50, METRIC_E2E_P95)
]

# Scenario tasks also report application end to end (after the four above, which stay in
# place: RegionDigest reads TTFT p95 and e2e p95 by position).
APP_METRICS = [(metric, dict(LATENCY_METRICS)[metric]) for metric in APP_E2E_METRICS]


def metrics_for(task: Task) -> list[tuple[str, str]]:
    return METRICS + APP_METRICS if task.is_scenario else METRICS


DIRECTION_FASTER = "faster"
DIRECTION_SLOWER = "slower"
DIRECTION_STEADY = "steady"
DIRECTION_NONE = ""  # nothing to compare with

VERDICT_SAME = "unchanged"
VERDICT_CHANGED = "changed"
VERDICT_NEW = "new"
VERDICT_NONE = "none"

WHY_FASTER = "faster route appeared"
WHY_QUALITY = "quality dropped"
WHY_ERRORS = "errors"
WHY_SAMPLES = "too few samples"
WHY_GONE = "no longer a candidate"

BUDGET_LABELS = dict(BUDGET_STATUSES)


@dataclass(frozen=True)
class Period:
    """This week is [since, until), last week the seven days before it."""

    until: datetime

    @property
    def since(self) -> datetime:
        return self.until - WEEK

    @property
    def last_since(self) -> datetime:
        return self.until - 2 * WEEK


def period_ending(when: datetime) -> Period:
    return Period(until=rollups.bucket_start(when, GRAIN_HOUR))


def usd(value: Decimal) -> str:
    """$0.0560 for the cents that probes cost, $12.40 from a dollar up."""
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


@dataclass(frozen=True)
class Change:
    """One percentile, this week against last week."""

    label: str
    this_ms: float | None
    last_ms: float | None

    @property
    def pct(self) -> float | None:
        if self.this_ms is None or self.last_ms is None or self.last_ms <= 0:
            return None
        return (self.this_ms - self.last_ms) / self.last_ms * 100

    @property
    def direction(self) -> str:
        pct = self.pct
        if pct is None:
            return DIRECTION_NONE
        if abs(pct) < STEADY_PCT:
            return DIRECTION_STEADY
        return DIRECTION_SLOWER if pct > 0 else DIRECTION_FASTER

    @property
    def pct_display(self) -> str:
        pct = self.pct
        return "" if pct is None else f"{pct:+.0f}%"


@dataclass(frozen=True)
class Regression:
    route: Route
    region: Region
    change: Change
    url: str


@dataclass
class RegionDigest:
    region: Region
    this_choice: selection.Choice
    last_choice: selection.Choice
    verdict: str
    why: str  # one of WHY_* ("" when unchanged)
    detail: str  # a sentence that explains the verdict
    changes: list[Change]  # fastest route this week vs fastest route last week
    ttft_status: str
    e2e_status: str
    winner_url: str

    @property
    def winner(self) -> Route | None:
        return self.this_choice.winner.route if self.this_choice.winner else None

    @property
    def last_winner(self) -> Route | None:
        return self.last_choice.winner.route if self.last_choice.winner else None

    @property
    def ttft_p95_ms(self) -> float | None:
        return self.changes[1].this_ms

    @property
    def e2e_p95_ms(self) -> float | None:
        return self.changes[3].this_ms

    @property
    def ttft_budget(self) -> str:
        return BUDGET_LABELS[self.ttft_status]

    @property
    def e2e_budget(self) -> str:
        return BUDGET_LABELS[self.e2e_status]


@dataclass
class TaskDigest:
    task: Task
    url: str
    regions: list[RegionDigest]
    regressions: list[Regression]
    this_week: Stats
    last_week: Stats
    threshold_pct: int

    @property
    def metric_label(self) -> str:
        """What "fastest" means for this task: the metric that ranks its routes (a scenario's
        app e2e, the latency class's default, or the one the task sets), never the words
        "the latency class's default"."""
        metric = self.task.ranking_metric()
        return dict(LATENCY_METRICS).get(metric, metric)

    @property
    def overview_hours(self) -> int:
        """The overview's and the read API's window: their winner is judged over it, this
        digest's over its week, so the two can name different routes."""
        return int(board.WINDOW.total_seconds() // 3600)

    @property
    def changed_regions(self) -> list[RegionDigest]:
        return [r for r in self.regions if r.verdict in (VERDICT_CHANGED, VERDICT_NEW)]

    @property
    def within_budget(self) -> tuple[int, int]:
        """(regions whose fastest route is inside every budget set, regions with a budget)."""
        ttft_budget = self.task.budget_ms(METRIC_TTFT_P95)
        e2e_budget = self.task.budget_ms(METRIC_E2E_P95)
        if ttft_budget is None and e2e_budget is None:
            return (0, 0)
        inside = 0
        for r in self.regions:
            statuses = []
            if ttft_budget is not None:
                statuses.append(r.ttft_status)
            if e2e_budget is not None:
                statuses.append(r.e2e_status)
            inside += all(s in (STATUS_OK, STATUS_NEAR) for s in statuses)
        return (inside, len(self.regions))

    @property
    def error_kinds(self) -> list[tuple[str, int]]:
        kinds = sorted(self.this_week.error_kinds.items(), key=lambda kv: (-kv[1], kv[0]))
        return kinds[:4]

    @property
    def error_rate_this(self) -> str:
        return rate(self.this_week.error_rate)

    @property
    def error_rate_last(self) -> str:
        return rate(self.last_week.error_rate)

    @property
    def spend_this(self) -> str:
        return usd(self.this_week.cost_usd)

    @property
    def spend_last(self) -> str:
        return usd(self.last_week.cost_usd)

    @property
    def spend_cap(self) -> str:
        cap = self.task.monthly_spend_cap_usd
        return "" if cap is None else usd(cap)


def page_url(name: str, *args: object) -> str:
    """An absolute link to a dashboard page; the overview when that page does not exist."""
    try:
        path = reverse(name, args=args)
    except NoReverseMatch:
        path = reverse("rw-overview")
    return settings.SITE_URL + path


def _route_name(route: Route | None) -> str:
    return str(route) if route else "none"


def _why_changed(
    task: Task,
    this_choice: selection.Choice,
    last_choice: selection.Choice,
    latency: Mapping[int, Stats],
) -> tuple[str, str, str]:
    """(verdict, why, detail) for one region."""
    winner = this_choice.winner
    last = last_choice.winner
    metric = dict(LATENCY_METRICS).get(this_choice.metric, this_choice.metric)
    if winner is None and last is None:
        return VERDICT_NONE, "", "No route met the quality bar with enough samples either week."
    if last is None:
        assert winner is not None
        return VERDICT_NEW, "", "No route qualified last week."
    if winner is not None and winner.route.pk == last.route.pk:
        return VERDICT_SAME, "", "Same route as last week."
    # Last week's winner lost its place: how does it stand this week?
    now_last = next((c for c in this_choice.candidates if c.route.pk == last.route.pk), None)
    name = _route_name(last.route)
    if now_last is None:
        why, detail = WHY_GONE, f"{name} is no longer a candidate route of this task."
    elif now_last.qualifies:
        assert winner is not None
        why = WHY_FASTER
        detail = (
            f"{_route_name(winner.route)} is faster on {metric} "
            f"({format_ms(winner.metric_ms)} against {format_ms(now_last.metric_ms)} for {name})."
        )
    elif now_last.reason in (
        selection.REASON_QUALITY,
        selection.REASON_UNGRADED,
        selection.REASON_NO_INDEX,
    ):
        why = WHY_QUALITY
        if now_last.reason == selection.REASON_QUALITY and now_last.pass_rate is not None:
            bar = task.min_pass_rate
            bar_text = f" under the {bar * 100:.0f}% bar" if bar is not None else ""
            passed = now_last.pass_rate
            detail = (
                f"{name} passed {passed.k} of {passed.n} graded probes "
                f"({format_pct(passed.low)}-{format_pct(passed.high)}, 95%){bar_text}."
            )
        else:
            detail = f"{name}: {now_last.detail or now_last.reason}."
    else:
        stats = latency.get(last.route.pk)
        rate = stats.provider_error_rate if stats else None
        if stats and rate:
            why = WHY_ERRORS
            detail = (
                f"{name} failed {rate * 100:.1f}% of its probes "
                f"({stats.provider_errors} of {stats.attempts})."
            )
        else:
            why, detail = WHY_SAMPLES, f"{name} had too few successful probes to rank."
    if winner is None:
        return VERDICT_CHANGED, why, f"No route qualifies this week. {detail}"
    return VERDICT_CHANGED, why, detail


def _metric(stats: Stats | None, name: str) -> float | None:
    return stats.metric(name, reference=True) if stats else None


def _estimate(stats: Stats | None, name: str) -> Estimate:
    if stats is None:
        return NO_ESTIMATE
    return percentile(stats.counts_for(name, reference=True), int(name.partition("_p")[2]))


def slower_with_confidence(this: Stats | None, last: Stats | None, name: str) -> bool:
    """A regression: this week's figure is above last week's with confidence (the same test
    that lets a challenger take a winner's place, monitor.stats.confidence)."""
    return _estimate(last, name).faster_than(_estimate(this, name))


def _task_totals(week: selection.Window, task: Task) -> Stats:
    total = Stats()
    for (task_id, _route_id), stats in week.per_route.items():
        if task_id == task.pk:
            total.add(stats)
    return total


def build_report(tasks: Iterable[Task], period: Period) -> list[TaskDigest]:
    """The digest's figures for these tasks over `period` and the week before it."""
    tasks = list(tasks)
    ids = [t.pk for t in tasks]
    this_week = selection.Window.read(period.since, period.until, ids)
    last_week = selection.Window.read(period.last_since, period.since, ids)
    threshold = settings.DIGEST_REGRESSION_PCT
    digests = []
    for task in tasks:
        routes = [r for r in task.routes.all() if r.is_active]
        route_urls = {r.pk: page_url("rw-route", r.pk) for r in routes}
        quality_this = this_week.quality(task, routes)
        quality_last = last_week.quality(task, routes)
        regions: list[RegionDigest] = []
        regressions: list[Regression] = []
        for region in task.regions.all():
            latency_this = this_week.latency(task, routes, region)
            latency_last = last_week.latency(task, routes, region)
            last_choice = selection.decide(task, routes, latency_last, quality_last)
            # Last week's winner stays unless this week's is faster with confidence or it
            # stopped qualifying: the pages' rule, so "winner changed" means what it says.
            this_choice = selection.decide(
                task,
                routes,
                latency_this,
                quality_this,
                incumbent=last_choice.winner.route.pk if last_choice.winner else None,
            )
            verdict, why, detail = _why_changed(task, this_choice, last_choice, latency_this)
            best_this = (
                latency_this.get(this_choice.winner.route.pk) if this_choice.winner else None
            )
            best_last = (
                latency_last.get(last_choice.winner.route.pk) if last_choice.winner else None
            )
            regions.append(
                RegionDigest(
                    region=region,
                    this_choice=this_choice,
                    last_choice=last_choice,
                    verdict=verdict,
                    why=why,
                    detail=detail,
                    changes=[
                        Change(label, _metric(best_this, name), _metric(best_last, name))
                        for name, label in metrics_for(task)
                    ],
                    ttft_status=task.budget_status(
                        METRIC_TTFT_P95, _metric(best_this, METRIC_TTFT_P95)
                    ),
                    e2e_status=task.budget_status(
                        METRIC_E2E_P95, _metric(best_this, METRIC_E2E_P95)
                    ),
                    winner_url=route_urls[this_choice.winner.route.pk]
                    if this_choice.winner
                    else "",
                )
            )
            regressions += _regressions(
                task, routes, region, (latency_this, latency_last), threshold, route_urls
            )
        regressions.sort(key=lambda r: -(r.change.pct or 0))
        digests.append(
            TaskDigest(
                task=task,
                url=page_url("rw-task", task.slug),
                regions=regions,
                regressions=regressions,
                this_week=_task_totals(this_week, task),
                last_week=_task_totals(last_week, task),
                threshold_pct=threshold,
            )
        )
    return digests


def _regressions(
    task: Task,
    routes: list[Route],
    region: Region,
    latency: tuple[Mapping[int, Stats], Mapping[int, Stats]],
    threshold: float,
    route_urls: Mapping[int, str],
) -> list[Regression]:
    """The routes of one region slower this week than last by more than the threshold, and
    slower with confidence."""
    latency_this, latency_last = latency
    found = []
    for route in routes:
        for name, label in metrics_for(task):
            change = Change(
                label,
                _metric(latency_this.get(route.pk), name),
                _metric(latency_last.get(route.pk), name),
            )
            if (
                change.pct is not None
                and change.pct > threshold
                and slower_with_confidence(
                    latency_this.get(route.pk), latency_last.get(route.pk), name
                )
            ):
                found.append(Regression(route, region, change, url=route_urls[route.pk]))
    return found


def tasks_for(subscription: Subscription) -> QuerySet[Task]:
    """The subscriber's chosen tasks; none chosen means every active task."""
    qs = Task.objects.filter(is_active=True)
    if subscription.pk and subscription.tasks.exists():
        qs = qs.filter(pk__in=subscription.tasks.values("pk"))
    return qs.prefetch_related("routes__provider", "regions")
