"""Findings into state changes: pending -> firing -> resolved, each change an AlertEvent, each
event that tells someone an AlertNotification per channel, all in one transaction.

- A breach opens a pending alert; it fires once it has held for the rule's minimum duration
  (AlertRule.hold_for), counted from the onset of its evidence in data time
  (monitor.alerts.onset: for rules on probes in a window, the first probe of the stretch past
  the line, never before the window nor the subject's last resolution), not from the first
  confident evaluation; it must stay confident at every evaluation until it fires. A subject
  the rule no longer finds breached resolves at once (auto-resolve): a pending one quietly,
  a firing one with a notification.
- While firing and not acknowledged: a reminder every remind_every_minutes (not while
  snoozed), and one escalation to the escalation channels after escalate_after_minutes.
- Event rules (winner changed, served model changed) notify once per event and are resolved
  at once.
- A silence or a maintenance window that matches keeps the state changes (the history says
  why nobody was told) but writes no notification; an alert that fired unnotified resolves
  unnotified too.

Exactly once across evaluators: each rule is evaluated under its row lock (SELECT ... FOR
UPDATE SKIP LOCKED), so a second evaluator running at the same moment skips the rule rather
than applying the same change twice; one that runs after sees the first's state and finds
nothing to change. The outbox rows are written in the same transaction as the change they
announce, so a crash loses both or neither, and (event, channel) is unique.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from monitor.alerts import evaluation, onset
from monitor.alerts.evaluation import Finding
from monitor.alerts.models import (
    EVENT_ACKED,
    EVENT_ESCALATED,
    EVENT_FIRED,
    EVENT_PENDING,
    EVENT_REMINDER,
    EVENT_RESOLVED,
    EVENT_SNOOZED,
    STATE_FIRING,
    STATE_PENDING,
    STATE_RESOLVED,
    Alert,
    AlertChannel,
    AlertEvent,
    AlertNotification,
    AlertRule,
    MaintenanceWindow,
    Silence,
)
from monitor.models import Region, Route

log = logging.getLogger(__name__)


@dataclass
class EvaluationSummary:
    rules: int = 0
    skipped: int = 0  # held by another evaluator
    events: int = 0
    notifications: int = 0


def evaluate_all(now: datetime | None = None) -> EvaluationSummary:
    """Evaluate every enabled rule (the beat task). Safe to run in several processes."""
    now = now or timezone.now()
    summary = EvaluationSummary()
    rule_ids = list(
        AlertRule.objects.filter(is_enabled=True, task__is_active=True).values_list("pk", flat=True)
    )
    for rule_id in rule_ids:
        with transaction.atomic():
            rule = (
                AlertRule.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("task")
                .filter(pk=rule_id)
                .first()
            )
            if rule is None:
                summary.skipped += 1
                continue
            try:
                findings = evaluation.evaluate(rule, now)
            except Exception:
                # One broken rule must not keep every other rule from being evaluated.
                log.exception("alert rule %s could not be evaluated", rule_id)
                continue
            events, notes = apply(rule, findings, now)
            summary.rules += 1
            summary.events += events
            summary.notifications += notes
    return summary


def _region_ids(finding: Finding | None, alert: Alert, slugs: dict[str, int]) -> set[int]:
    ids = {slugs[s] for s in (finding.facts.get("regions", []) if finding else []) if s in slugs}
    ids |= {slugs[s] for s in alert.facts.get("regions", []) if s in slugs}
    if alert.region_id is not None:
        ids.add(alert.region_id)
    return ids


def quiet_reason(rule: AlertRule, alert: Alert, region_ids: set[int], now: datetime) -> str:
    """Why nobody is told now ("" when they are): a matching silence or maintenance window."""
    route = Route.objects.filter(pk=alert.route_id).first() if alert.route_id else None
    silences = Silence.objects.filter(starts_at__lte=now, ends_at__gt=now).filter(
        Q(rule__isnull=True) | Q(rule=rule),
        Q(task__isnull=True) | Q(task_id=rule.task_id),
        Q(route__isnull=True) | Q(route_id=alert.route_id),
    )
    for silence in silences:
        if silence.region_id is None or silence.region_id in region_ids:
            return f"silenced until {silence.ends_at:%Y-%m-%d %H:%M} UTC: {silence.reason}"
    for window in MaintenanceWindow.objects.filter(is_active=True):
        if window.covers(now) and window.matches(rule.task_id, route, region_ids):
            return f"maintenance window {window.name!r}"
    return ""


def _event(
    alert: Alert, kind: str, now: datetime, *, note: str = "", facts: dict[str, Any] | None = None
) -> AlertEvent:
    return AlertEvent.objects.create(
        alert=alert, at=now, kind=kind, note=note[:500], facts=facts or dict(alert.facts)
    )


def _notify(event: AlertEvent, channels: list[AlertChannel], now: datetime) -> int:
    rows = [
        AlertNotification(event=event, channel=c, next_attempt_at=now)
        for c in channels
        if c.is_active
    ]
    AlertNotification.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def apply(rule: AlertRule, findings: list[Finding], now: datetime) -> tuple[int, int]:
    """Move the rule's alerts on by its findings at `now`; (events, notifications) written.
    The caller holds the rule's row lock (evaluate_all)."""
    channels = list(rule.channels.filter(is_active=True))
    escalation = list(rule.escalation_channels.filter(is_active=True))
    slugs = dict(Region.objects.values_list("slug", "pk"))
    events = notes = 0
    open_alerts = {a.subject: a for a in rule.alerts.exclude(state=STATE_RESOLVED)}

    def tell(alert: Alert, kind: str, finding: Finding | None, note: str = "") -> None:
        nonlocal events, notes
        quiet = quiet_reason(rule, alert, _region_ids(finding, alert, slugs), now)
        told = channels if kind != EVENT_ESCALATED else escalation
        if kind == EVENT_RESOLVED and not _was_told(alert):
            quiet = quiet or "nobody was told it fired"
        event = _event(
            alert,
            kind,
            now,
            note=(f"not notified: {quiet}" if quiet else note),
            facts=_resolved_facts(alert) if kind == EVENT_RESOLVED else None,
        )
        events += 1
        if not quiet:
            notes += _notify(event, told, now)

    for finding in findings:
        if rule.is_event:
            if Alert.objects.filter(rule=rule, subject=finding.subject).exists():
                continue
            alert = _open(rule, finding, now, state=STATE_RESOLVED)
            alert.fired_at = alert.resolved_at = now
            alert.save(update_fields=["fired_at", "resolved_at"])
            tell(alert, EVENT_FIRED, finding)
            continue
        held = open_alerts.pop(finding.subject, None)
        if held is None:
            alert = _open(rule, finding, now, state=STATE_PENDING)
            _event(alert, EVENT_PENDING, now, note=_since_note(alert) + finding.summary)
            events += 1
        else:
            alert = held
            alert.summary, alert.facts, alert.evaluated_at = (
                finding.summary[:300],
                dict(finding.facts),
                now,
            )
            alert.save(update_fields=["summary", "facts", "evaluated_at"])
        if alert.state == STATE_PENDING and now - alert.since >= rule.hold_for():
            alert.state, alert.fired_at = STATE_FIRING, now
            alert.save(update_fields=["state", "fired_at"])
            tell(alert, EVENT_FIRED, finding)
        elif alert.state == STATE_FIRING and alert.acked_at is None:
            _remind_or_escalate(rule, alert, finding, now, tell)
    for alert in open_alerts.values():
        was = alert.state
        alert.state, alert.resolved_at, alert.evaluated_at = STATE_RESOLVED, now, now
        alert.save(update_fields=["state", "resolved_at", "evaluated_at"])
        if was == STATE_PENDING:
            _event(alert, EVENT_RESOLVED, now, note="cleared before its minimum duration")
            events += 1
        else:
            tell(alert, EVENT_RESOLVED, None, note="no longer breached")
    return events, notes


def onset_for(rule: AlertRule, finding: Finding, now: datetime) -> datetime:
    """When the breach `finding` reports began, in data time (monitor.alerts.onset): from
    the raw results in the rule's window, never before the subject's last resolution; `now`
    for findings without evidence (decision, health, money) or without raw results."""
    if finding.evidence is None:
        return now
    floor = now - rule.window()
    last = (
        Alert.objects.filter(rule=rule, subject=finding.subject, resolved_at__isnull=False)
        .order_by("-resolved_at")
        .values_list("resolved_at", flat=True)
        .first()
    )
    if last is not None and last > floor:
        floor = last
    found = onset.live(finding.evidence, rule.task_id, floor, now)
    return min(found, now) if found is not None else now


def _open(rule: AlertRule, finding: Finding, now: datetime, *, state: str) -> Alert:
    return Alert.objects.create(
        rule=rule,
        subject=finding.subject,
        route_id=finding.route_id,
        region_id=finding.region_id,
        state=state,
        started_at=now,
        onset_at=onset_for(rule, finding, now) if state == STATE_PENDING else now,
        evaluated_at=now,
        summary=finding.summary[:300],
        facts=dict(finding.facts),
    )


def _since_note(alert: Alert) -> str:
    """The pending event's lead, "slow since 10:02:13 UTC, confident since 10:03:01: ", when
    the evidence began before the first confident evaluation."""
    if alert.onset_at is None or alert.onset_at >= alert.started_at:
        return ""
    return f"{alert.since_text()}: "


def _resolved_facts(alert: Alert) -> dict[str, Any]:
    """A resolution carries the figures that last breached (what was wrong), saying so: its
    summary and why must not read as if it still were."""
    facts = dict(alert.facts)
    summary = str(facts.get("summary") or alert.summary)
    facts["summary"] = f"resolved: {summary}"[:300]
    last = str(facts.get("why", ""))
    facts["why"] = "resolved: the rule no longer finds this breached" + (
        f". When it last did: {last}" if last else ""
    )
    return facts


def _was_told(alert: Alert) -> bool:
    return AlertNotification.objects.filter(event__alert=alert, event__kind=EVENT_FIRED).exists()


def _remind_or_escalate(
    rule: AlertRule, alert: Alert, finding: Finding, now: datetime, tell: Any
) -> None:
    assert alert.fired_at is not None
    snoozed = alert.snoozed_until is not None and alert.snoozed_until > now
    if (
        rule.escalate_after_minutes
        and alert.escalated_at is None
        and not snoozed
        and now - alert.fired_at >= timedelta(minutes=rule.escalate_after_minutes)
    ):
        alert.escalated_at = now
        alert.save(update_fields=["escalated_at"])
        tell(alert, EVENT_ESCALATED, finding, note="not acknowledged")
        return
    if rule.remind_every_minutes and not snoozed:
        last = alert.reminded_at or alert.fired_at
        if now - last >= timedelta(minutes=rule.remind_every_minutes):
            alert.reminded_at = now
            alert.save(update_fields=["reminded_at"])
            tell(alert, EVENT_REMINDER, finding, note="still firing")


def acknowledge(alert_id: int, now: datetime, by: str = "") -> bool:
    """Stop reminders and escalation of a firing alert; True if it changed."""
    with transaction.atomic():
        changed = Alert.objects.filter(
            pk=alert_id, state=STATE_FIRING, acked_at__isnull=True
        ).update(acked_at=now)
        if changed:
            alert = Alert.objects.get(pk=alert_id)
            _event(alert, EVENT_ACKED, now, note=f"acknowledged{f' by {by}' if by else ''}")
    return changed == 1


def snooze(alert_id: int, until: datetime, now: datetime, by: str = "") -> bool:
    """No reminders or escalation until `until`; True if the alert is open."""
    with transaction.atomic():
        changed = (
            Alert.objects.filter(pk=alert_id)
            .exclude(state=STATE_RESOLVED)
            .update(snoozed_until=until)
        )
        if changed:
            alert = Alert.objects.get(pk=alert_id)
            note = f"snoozed until {until:%Y-%m-%d %H:%M} UTC{f' by {by}' if by else ''}"
            _event(alert, EVENT_SNOOZED, now, note=note)
    return changed == 1
