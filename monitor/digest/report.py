"""The weekly digest: what changed for each task, and sending it exactly once per subscriber.

Content (`build_report`): for a week that ends at the subscriber's chosen local time (rounded
down to the hour, so it is exactly 168 hourly rollup buckets) and the week before it, per task:
- per region, the fastest qualifying route of each week (monitor.stats.selection over the week's
  rollups, quality from all regions) and, when it changed, why: a faster route appeared, last
  week's winner dropped below the quality bar, or it failed too often to be measured;
- p50/p95 TTFT and e2e of the fastest route, week over week, with a direction;
- regressions: any (route, region) whose p50/p95 TTFT or e2e worsened by more than
  DIGEST_REGRESSION_PCT percent against the same route and region last week;
- latency-budget compliance of the fastest route (monitor.pages.overview.budget_status);
- error rate and probe spend of the whole task (all routes, all regions).
Every figure comes from the rollups.

Sending (`send_due`), the habit of healthchecks' reports: an optimistic lock on next_send_at.
For each due subscription, a sender claims it with
    filter(pk=..., next_send_at=<value it read>).update(next_send_at=<lease end>, ...)
and goes on only if exactly one row changed; a second sender that read the same row changes
nothing and skips it. While claimed, next_send_at is a lease (LEASE from now), not next week:
- sent: next_send_at moves to the next regular slot (conditional on the lease, so a user who
  rescheduled or unsubscribed meanwhile keeps their change);
- SMTP or network failure: next_send_at moves to now + a back-off (RETRY_DELAYS), and a later
  tick claims it again the same way; after MAX_ATTEMPTS the week is given up (last_error says
  why) and the next regular slot is kept;
- the sender dies mid-send: the lease runs out and another tick retries, counted as an attempt.
A message goes out at most once per claim, and claims never overlap (the lease is far longer
than EMAIL_TIMEOUT). The one gap left is a sender dying after the SMTP server accepted the
message but before the database recorded it: that digest is sent again after the lease. We
prefer that rare duplicate to a digest silently lost, and give the message a Message-ID fixed
per (subscription, week), so mail systems that de-duplicate by Message-ID drop the copy.
"""

from __future__ import annotations

import logging
import smtplib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.core.signing import TimestampSigner
from django.db.models import QuerySet
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from monitor.models import GRAIN_HOUR, Region, Route, Subscription, Task
from monitor.pages import overview
from monitor.stats import rollups, selection
from monitor.stats.rollups import Stats
from monitor.templatetags.rw import ms as format_ms

log = logging.getLogger(__name__)

WEEK = timedelta(days=7)
LEASE = timedelta(minutes=15)
RETRY_DELAYS = (timedelta(minutes=5), timedelta(minutes=30), timedelta(hours=2))
MAX_ATTEMPTS = len(RETRY_DELAYS) + 1
# Percentiles read back from the log-bucket histograms are within about 2.5% (monitor.stats.hist):
# a smaller change is noise, reported as steady.
STEADY_PCT = 3.0
UNSUBSCRIBE_SALT = "routewatch.digest.unsubscribe"

METRICS = [
    ("ttft_p50", "TTFT p50"),
    ("ttft_p95", "TTFT p95"),
    ("e2e_p50", "e2e p50"),
    ("e2e_p95", "e2e p95"),
]

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

BUDGET_LABELS = {
    overview.STATUS_OK: "within budget",
    overview.STATUS_NEAR: "near budget",
    overview.STATUS_OVER: "over budget",
    overview.STATUS_UNKNOWN: "no data",
}


# --- figures ------------------------------------------------------------------------------


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
    def changed_regions(self) -> list[RegionDigest]:
        return [r for r in self.regions if r.verdict in (VERDICT_CHANGED, VERDICT_NEW)]

    @property
    def within_budget(self) -> tuple[int, int]:
        """(regions whose fastest route is inside every budget set, regions with a budget)."""
        if self.task.ttft_p95_budget_ms is None and self.task.e2e_p95_budget_ms is None:
            return (0, 0)
        inside = 0
        for r in self.regions:
            statuses = []
            if self.task.ttft_p95_budget_ms is not None:
                statuses.append(r.ttft_status)
            if self.task.e2e_p95_budget_ms is not None:
                statuses.append(r.e2e_status)
            inside += all(s in (overview.STATUS_OK, overview.STATUS_NEAR) for s in statuses)
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


def _page_url(name: str, *args: object) -> str:
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
    metric = task.get_latency_metric_display()
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
            detail = f"{name} passed {now_last.pass_rate * 100:.0f}% of graded probes{bar_text}."
        else:
            detail = f"{name}: {now_last.reason}."
    else:
        stats = latency.get(last.route.pk)
        rate = stats.error_rate if stats else None
        if stats and rate:
            why = WHY_ERRORS
            detail = f"{name} failed {rate * 100:.1f}% of its probes ({stats.count} probes)."
        else:
            why, detail = WHY_SAMPLES, f"{name} had too few successful probes to rank."
    if winner is None:
        return VERDICT_CHANGED, why, f"No route qualifies this week. {detail}"
    return VERDICT_CHANGED, why, detail


def _metric(stats: Stats | None, name: str) -> float | None:
    return stats.metric(name) if stats else None


@dataclass
class _Week:
    per_region: dict[tuple[int | None, ...], Stats]
    per_route: dict[tuple[int | None, ...], Stats]


def _read_week(since: datetime, until: datetime, task_ids: Sequence[int]) -> _Week:
    def rows(all_regions: bool) -> QuerySet[Any]:
        qs = rollups.rows(since=since, until=until, grain=GRAIN_HOUR, all_regions=all_regions)
        return qs.filter(task_id__in=task_ids)

    return _Week(
        per_region=rollups.stats_by(rows(False), ["task_id", "route_id", "region_id"]),
        # Quality, error rates and spend need counts only.
        per_route=rollups.stats_by(rows(True), ["task_id", "route_id"], histograms=False),
    )


def _task_totals(week: _Week, task: Task) -> Stats:
    total = Stats()
    for (task_id, _route_id), stats in week.per_route.items():
        if task_id != task.pk:
            continue
        for name in ("count_ok", "count_error", "count_missed", "cost_usd"):
            setattr(total, name, getattr(total, name) + getattr(stats, name))
        for kind, n in stats.error_kinds.items():
            total.error_kinds[kind] = total.error_kinds.get(kind, 0) + n
    return total


def _by_route(week: _Week, task: Task, routes: Sequence[Route]) -> dict[int, Stats]:
    keys = ((r.pk, (task.pk, r.pk)) for r in routes)
    return {pk: week.per_route[key] for pk, key in keys if key in week.per_route}


def _in_region(
    week: _Week, task: Task, routes: Sequence[Route], region: Region
) -> dict[int, Stats]:
    keys = ((r.pk, (task.pk, r.pk, region.pk)) for r in routes)
    return {pk: week.per_region[key] for pk, key in keys if key in week.per_region}


def build_report(tasks: Iterable[Task], period: Period) -> list[TaskDigest]:
    """The digest's figures for these tasks over `period` and the week before it."""
    tasks = list(tasks)
    ids = [t.pk for t in tasks]
    this_week = _read_week(period.since, period.until, ids)
    last_week = _read_week(period.last_since, period.since, ids)
    threshold = settings.DIGEST_REGRESSION_PCT
    digests = []
    for task in tasks:
        routes = [r for r in task.routes.all() if r.is_active]
        route_urls = {r.pk: _page_url("rw-route", r.pk) for r in routes}
        quality_this = _by_route(this_week, task, routes)
        quality_last = _by_route(last_week, task, routes)
        regions: list[RegionDigest] = []
        regressions: list[Regression] = []
        for region in task.regions.all():
            latency_this = _in_region(this_week, task, routes, region)
            latency_last = _in_region(last_week, task, routes, region)
            this_choice = selection.choose(task, routes, latency_this, quality_this)
            last_choice = selection.choose(task, routes, latency_last, quality_last)
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
                        for name, label in METRICS
                    ],
                    ttft_status=overview.budget_status(
                        _metric(best_this, "ttft_p95"), task.ttft_p95_budget_ms
                    ),
                    e2e_status=overview.budget_status(
                        _metric(best_this, "e2e_p95"), task.e2e_p95_budget_ms
                    ),
                    winner_url=route_urls[this_choice.winner.route.pk]
                    if this_choice.winner
                    else "",
                )
            )
            for route in routes:
                for name, label in METRICS:
                    change = Change(
                        label,
                        _metric(latency_this.get(route.pk), name),
                        _metric(latency_last.get(route.pk), name),
                    )
                    if change.pct is not None and change.pct > threshold:
                        regressions.append(
                            Regression(route, region, change, url=route_urls[route.pk])
                        )
        regressions.sort(key=lambda r: -(r.change.pct or 0))
        digests.append(
            TaskDigest(
                task=task,
                url=_page_url("rw-task", task.slug),
                regions=regions,
                regressions=regressions,
                this_week=_task_totals(this_week, task),
                last_week=_task_totals(last_week, task),
                threshold_pct=threshold,
            )
        )
    return digests


def tasks_for(subscription: Subscription) -> QuerySet[Task]:
    """The subscriber's chosen tasks; none chosen means every active task."""
    qs = Task.objects.filter(is_active=True)
    if subscription.pk and subscription.tasks.exists():
        qs = qs.filter(pk__in=subscription.tasks.values("pk"))
    return qs.prefetch_related("routes__provider", "regions")


# --- messages -----------------------------------------------------------------------------


def unsubscribe_token(subscription: Subscription) -> str:
    return TimestampSigner(salt=UNSUBSCRIBE_SALT).sign(str(subscription.pk))


def subscription_pk_from_token(token: str) -> int:
    """Raises BadSignature (tampered) or SignatureExpired (too old), its subclass."""
    value = TimestampSigner(salt=UNSUBSCRIBE_SALT).unsign(
        token, max_age=timedelta(days=settings.DIGEST_UNSUBSCRIBE_MAX_AGE_DAYS)
    )
    return int(value)


def unsubscribe(pk: int) -> bool:
    """Turn a subscription off; True if it was on. A digest being sent right now is not sent
    again (its sender's release is conditional on the lease, which this clears)."""
    updated = Subscription.objects.filter(pk=pk, is_active=True).update(
        is_active=False, next_send_at=None, send_attempts=0
    )
    return updated == 1


def make_message(
    name: str, to: str, ctx: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> EmailMultiAlternatives:
    """Render emails/<name>-subject.html, -body-text.html and -body-html.html into one message."""
    subject = " ".join(render_to_string(f"emails/{name}-subject.html", ctx).split())
    text = render_to_string(f"emails/{name}-body-text.html", ctx)
    html = render_to_string(f"emails/{name}-body-html.html", ctx)
    message = EmailMultiAlternatives(subject, text, to=[to], headers=dict(headers or {}))
    message.attach_alternative(html, "text/html")
    return message


def digest_context(
    subscription: Subscription, report: list[TaskDigest], period: Period, *, preview: bool = False
) -> dict[str, Any]:
    unsubscribe_url = ""
    if subscription.pk:
        path = reverse("rw-digest-unsubscribe", args=[unsubscribe_token(subscription)])
        unsubscribe_url = settings.SITE_URL + path
    changes = sum(len(t.changed_regions) for t in report)
    regressions = sum(len(t.regressions) for t in report)
    return {
        "subscription": subscription,
        "user": subscription.user,
        "report": report,
        "period": period,
        # The last day of the week, for people: until is midnight or an hour of the next day.
        "period_last_day": period.until - timedelta(seconds=1),
        "changes": changes,
        "regressions": regressions,
        "threshold_pct": settings.DIGEST_REGRESSION_PCT,
        "overview_url": _page_url("rw-overview"),
        "settings_url": _page_url("rw-digest-settings"),
        "unsubscribe_url": unsubscribe_url,
        "preview": preview,
        "site_url": settings.SITE_URL,
    }


def _message_id(subscription: Subscription, period: Period) -> str:
    domain = urlsplit(settings.SITE_URL).hostname or "routewatch.invalid"
    return f"<digest-{subscription.pk}-{period.until:%Y%m%d%H}@{domain}>"


def digest_message(
    subscription: Subscription, period: Period, report: list[TaskDigest]
) -> EmailMultiAlternatives:
    ctx = digest_context(subscription, report, period)
    headers = {
        "List-Unsubscribe": f"<{ctx['unsubscribe_url']}>",
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
        "Message-ID": _message_id(subscription, period),
        "Auto-Submitted": "auto-generated",
    }
    return make_message("digest", subscription.user.email, ctx, headers)


# --- sending ------------------------------------------------------------------------------


@dataclass
class SendSummary:
    sent: int = 0
    skipped: int = 0  # claimed by another sender first
    failed: int = 0


def due(now: datetime) -> QuerySet[Subscription]:
    return (
        Subscription.objects.filter(is_active=True, next_send_at__lte=now)
        .select_related("user")
        .order_by("next_send_at", "pk")
    )


class _Reports:
    """Reports by (period, task ids): subscribers with the same slot share one computation."""

    def __init__(self) -> None:
        self._cache: dict[tuple[datetime, tuple[int, ...]], list[TaskDigest]] = {}

    def get(self, subscription: Subscription, period: Period) -> list[TaskDigest]:
        tasks = list(tasks_for(subscription))
        key = (period.until, tuple(t.pk for t in tasks))
        if key not in self._cache:
            self._cache[key] = build_report(tasks, period)
        return self._cache[key]


def _claim(sub: Subscription, lease_until: datetime, attempts: int) -> bool:
    # A sort of optimistic lock: only the sender that still sees the next_send_at it read
    # moves it, so each digest is claimed once however many senders run.
    claimed = Subscription.objects.filter(
        pk=sub.pk, is_active=True, next_send_at=sub.next_send_at
    ).update(next_send_at=lease_until, send_attempts=attempts)
    return claimed == 1


def _release(sub: Subscription, lease_until: datetime, **values: Any) -> None:
    # Conditional on our lease: a user who rescheduled or unsubscribed meanwhile wins.
    Subscription.objects.filter(pk=sub.pk, next_send_at=lease_until).update(**values)


def send_one(sub: Subscription, now: datetime, reports: _Reports | None = None) -> str:
    """Claim, render, send and record one due subscription: 'sent', 'skipped' or 'failed'."""
    reports = reports or _Reports()
    attempts = sub.send_attempts + 1
    lease_until = now + LEASE
    if not _claim(sub, lease_until, attempts):
        return "skipped"
    if attempts > MAX_ATTEMPTS or not sub.user.email:
        if not sub.user.email:
            reason = "the user has no e-mail address"
        else:
            reason = f"gave up after {MAX_ATTEMPTS} attempts (the last one stopped mid-send)"
        _release(
            sub,
            lease_until,
            next_send_at=sub.choose_next_send(now),
            send_attempts=0,
            last_error=reason[:300],
        )
        return "failed"
    period = period_ending(sub.previous_slot(now))
    try:
        message = digest_message(sub, period, reports.get(sub, period))
        message.send()
    except SoftTimeLimitExceeded:
        raise  # the lease runs out and a later tick retries
    except Exception as exc:
        # SMTP refusals, network errors, and bugs alike: retry later rather than stop every
        # other subscriber's digest.
        transport = isinstance(exc, smtplib.SMTPException | OSError)
        log.warning(
            "digest for subscription %s failed (attempt %s): %s",
            sub.pk,
            attempts,
            exc.__class__.__name__,
            exc_info=not transport,
        )
        error = f"{exc.__class__.__name__}: {exc}"[:300]
        if attempts >= MAX_ATTEMPTS:
            next_send_at = sub.choose_next_send(now)
            attempts, error = 0, f"gave up after {MAX_ATTEMPTS} attempts: {error}"[:300]
        else:
            next_send_at = now + RETRY_DELAYS[attempts - 1]
        _release(
            sub, lease_until, next_send_at=next_send_at, send_attempts=attempts, last_error=error
        )
        return "failed"
    _release(sub, lease_until, next_send_at=sub.choose_next_send(now), send_attempts=0)
    # Recorded even when the user changed their schedule meanwhile: this digest did go out.
    Subscription.objects.filter(pk=sub.pk).update(last_sent_at=now, last_error="")
    return "sent"


def send_due(now: datetime | None = None) -> SendSummary:
    """Send every due digest (the beat task). Safe to run in several processes at once."""
    summary = SendSummary()
    reports = _Reports()
    for sub in due(now or timezone.now()):
        # Each claim's lease starts at its own claim, however long the run has taken so far.
        outcome = send_one(sub, now or timezone.now(), reports)
        setattr(summary, outcome, getattr(summary, outcome) + 1)
    return summary
