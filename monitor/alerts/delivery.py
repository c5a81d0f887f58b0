"""Sending the outbox (AlertNotification rows) exactly once, the digest's way.

A sender claims a due row with
    filter(pk=..., status=pending, next_attempt_at=<value it read>)
        .update(next_attempt_at=<lease end>, attempts=attempts + 1)
and sends only if exactly one row changed: a second sender that read the same row changes
nothing and skips it. While claimed, next_attempt_at is a lease (LEASE from the claim):
- sent: status sent, sent_at, conditional on the lease;
- the channel refused it or could not be reached: next_attempt_at moves to now + a back-off
  (RETRY_DELAYS) and a later run claims it again; after MAX_ATTEMPTS it is given up (status
  failed, last_error says why) and the history shows it;
- the sender dies mid-send (kill -9): the lease runs out and a later run sends it again,
  counted as an attempt.
Rows are written in the transaction of the state change they announce, so none is lost.
The gap left is the one every at-least-once sender has: a sender killed after the receiver
accepted but before our record of it sends again after the lease. Every copy carries the same
delivery id (X-Routewatch-Delivery; the e-mail's Message-ID; PagerDuty's dedup key is the
alert's), so the receiver keeps one: tests/monitor/alerts/test_delivery.py kills a real Celery
worker at that moment and counts what the receiver kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from celery.exceptions import SoftTimeLimitExceeded
from django.core.signing import TimestampSigner
from django.urls import reverse
from django.utils import timezone

from monitor.alerts import channels
from monitor.alerts.channels import AlertMessage, ChannelError
from monitor.alerts.models import (
    SEND_FAILED,
    SEND_PENDING,
    SEND_SENT,
    STATE_RESOLVED,
    AlertNotification,
    site_url,
)

log = logging.getLogger(__name__)

LEASE = timedelta(minutes=2)  # far longer than a send (channels.SEND_TIMEOUT_S)
RETRY_DELAYS = (
    timedelta(seconds=30),
    timedelta(minutes=2),
    timedelta(minutes=10),
    timedelta(minutes=30),
)
MAX_ATTEMPTS = len(RETRY_DELAYS) + 1
BATCH = 200  # rows one run looks at; the rest wait for the next run
ACTION_SALT = "routewatch.alerts.action"


def action_token(alert_id: int, action: str) -> str:
    return TimestampSigner(salt=ACTION_SALT).sign(f"{alert_id}:{action}")


def action_url(alert_id: int, action: str) -> str:
    return site_url(reverse("rw-alert-action", args=[action_token(alert_id, action)]))


@dataclass
class DeliverySummary:
    sent: int = 0
    skipped: int = 0  # claimed by another sender first
    failed: int = 0  # this attempt failed (retried later, or given up)


def message_for(n: AlertNotification) -> AlertMessage:
    """The message a notification carries, built from its event's facts (as they were)."""
    if n.event is None:
        return cast(AlertMessage, n.message)  # a test send keeps its own
    event = n.event
    alert = event.alert
    rule = alert.rule
    facts: dict[str, Any] = event.facts
    regions = list(facts.get("regions", []))
    kind = event.kind
    label = {
        "fired": "FIRING",
        "resolved": "RESOLVED",
        "reminder": "STILL FIRING",
        "escalated": "ESCALATED",
    }.get(kind, kind.upper())
    open_ = alert.state != STATE_RESOLVED
    return AlertMessage(
        delivery_id=n.delivery_id,
        alert_id=alert.pk,
        dedup_key=alert.dedup_key,
        event=kind,
        state=alert.state,
        rule=str(rule),
        task=rule.task.name,
        title=f"[Routewatch {label}] {rule.task.name}: {alert.summary}"[:250],
        summary=str(facts.get("summary") or alert.summary),
        why=str(facts.get("why", "")),
        metric=str(facts.get("metric", "")),
        unit=str(facts.get("unit", "")),
        figure=facts.get("figure"),
        low=facts.get("low"),
        high=facts.get("high"),
        samples=facts.get("samples"),
        threshold=facts.get("threshold"),
        threshold_label=str(facts.get("threshold_label", "")),
        regions=regions,
        regions_total=facts.get("regions_total"),
        regions_needed=facts.get("regions_needed"),
        at=event.at.isoformat(),
        onset_at=alert.since.isoformat(),
        confident_at=alert.started_at.isoformat(),
        since=alert.since_text(),
        url=site_url(str(facts.get("link") or reverse("rw-alerts"))),
        history_url=site_url(reverse("rw-alerts") + f"#alert-{alert.pk}"),
        ack_url=action_url(alert.pk, "ack") if open_ and not rule.is_event else "",
        snooze_url=action_url(alert.pk, "snooze") if open_ and not rule.is_event else "",
    )


def due(now: datetime) -> list[AlertNotification]:
    return list(
        AlertNotification.objects.filter(status=SEND_PENDING, next_attempt_at__lte=now)
        .select_related("channel", "event__alert__rule__task")
        .order_by("next_attempt_at", "pk")[:BATCH]
    )


def _claim(n: AlertNotification, lease_until: datetime) -> bool:
    # A sort of optimistic lock: only the sender that still sees the next_attempt_at it read
    # moves it, so each row is claimed once however many senders run.
    claimed = AlertNotification.objects.filter(
        pk=n.pk, status=SEND_PENDING, next_attempt_at=n.next_attempt_at
    ).update(next_attempt_at=lease_until, attempts=n.attempts + 1)
    return claimed == 1


def _release(n: AlertNotification, lease_until: datetime, **values: Any) -> None:
    AlertNotification.objects.filter(pk=n.pk, next_attempt_at=lease_until).update(**values)


def send_one(n: AlertNotification, now: datetime) -> str:
    """Claim, send and record one due row: 'sent', 'skipped' or 'failed'."""
    attempts = n.attempts + 1
    lease_until = now + LEASE
    if not _claim(n, lease_until):
        return "skipped"
    if attempts > MAX_ATTEMPTS:
        _release(
            n,
            lease_until,
            status=SEND_FAILED,
            last_error=f"gave up after {MAX_ATTEMPTS} attempts (the last one stopped mid-send)",
        )
        return "failed"
    try:
        channels.send(n.channel, message_for(n))
    except SoftTimeLimitExceeded:
        raise  # the lease runs out and a later run retries
    except Exception as exc:
        # Channel refusals, network errors and bugs alike: retry later rather than stop every
        # other notification. ChannelError's text names no secret; others are logged by class.
        known = isinstance(exc, ChannelError)
        error = str(exc) if known else f"{exc.__class__.__name__} (see the log)"
        log.warning(
            "alert notification %s to channel %s failed (attempt %s): %s",
            n.pk,
            n.channel_id,
            attempts,
            error,
            exc_info=not known,
        )
        if attempts >= MAX_ATTEMPTS:
            _release(
                n,
                lease_until,
                status=SEND_FAILED,
                last_error=f"gave up after {MAX_ATTEMPTS} attempts: {error}"[:300],
            )
        else:
            _release(
                n,
                lease_until,
                next_attempt_at=now + RETRY_DELAYS[attempts - 1],
                last_error=error[:300],
            )
        return "failed"
    _release(n, lease_until, status=SEND_SENT, sent_at=timezone.now(), last_error="")
    return "sent"


def send_due(now: datetime | None = None) -> DeliverySummary:
    """Send every due notification (after each evaluation, and the deliver task). Safe to run
    in several processes at once."""
    summary = DeliverySummary()
    for n in due(now or timezone.now()):
        outcome = send_one(n, now or timezone.now())
        setattr(summary, outcome, getattr(summary, outcome) + 1)
    return summary
