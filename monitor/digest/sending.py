"""The weekly digest's message, and sending it exactly once per subscriber.

`send_due`, the habit of healthchecks' reports: an optimistic lock on next_send_at.
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
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.core.signing import TimestampSigner
from django.db.models import QuerySet
from django.urls import reverse
from django.utils import timezone

from monitor.digest.report import (
    Period,
    TaskDigest,
    build_report,
    page_url,
    period_ending,
    tasks_for,
)
from monitor.emails import make_message
from monitor.models import Subscription

log = logging.getLogger(__name__)

LEASE = timedelta(minutes=15)
RETRY_DELAYS = (timedelta(minutes=5), timedelta(minutes=30), timedelta(hours=2))
MAX_ATTEMPTS = len(RETRY_DELAYS) + 1
UNSUBSCRIBE_SALT = "routewatch.digest.unsubscribe"


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
        "overview_url": page_url("rw-overview"),
        "settings_url": page_url("rw-digest-settings"),
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
