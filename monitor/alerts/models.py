"""Alerts: rules per task, the alerts they raise, every state change, and each notification
to each channel (an outbox row, sent exactly once under a lease: monitor.alerts.delivery).

Imported by monitor.models (one line), so Django finds these models under the `monitor` app.
"""

from __future__ import annotations

import datetime as dt
import math
import zoneinfo
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from monitor.crypto import decrypt_secret, encrypt_secret

# --- rule kinds: one registry (the admin's choices and the evaluator read it) ---------------
KIND_LATENCY = "latency"
KIND_AVAILABILITY = "availability"
KIND_NO_WINNER = "no_winner"
KIND_WINNER_CHANGED = "winner_changed"
KIND_QUALITY = "quality"
KIND_SERVED_MODEL = "served_model"
KIND_STALE = "stale"
KIND_MISSED_SLOTS = "missed_slots"
KIND_SPEND_CAP = "spend_cap"
KIND_RATE_LIMIT = "rate_limit"
RULE_KINDS = [
    (KIND_LATENCY, "latency regression (interval's lower bound past the line)"),
    (KIND_AVAILABILITY, "availability (error rate above the ceiling with confidence)"),
    (KIND_NO_WINNER, "decision: no route qualifies"),
    (KIND_WINNER_CHANGED, "decision: the winner changed (after hysteresis)"),
    (KIND_QUALITY, "decision: a route fell below the quality bar"),
    (KIND_SERVED_MODEL, "decision: the served model changed"),
    (KIND_STALE, "health: figures stale (no probe for the task's stale time)"),
    (KIND_MISSED_SLOTS, "health: a region misses slots"),
    (KIND_SPEND_CAP, "money: monthly spend cap reached"),
    (KIND_RATE_LIMIT, "limits: rate-limit headroom low"),
]
# Kinds that are one-off events (notified once, resolved at once), not conditions.
EVENT_KINDS = frozenset({KIND_WINNER_CHANGED, KIND_SERVED_MODEL})

METRIC_RANKING = ""  # the task's ranking metric (Task.ranking_metric)
ALERT_METRICS = [
    (METRIC_RANKING, "the task's ranking metric"),
    ("ttft_p50", "TTFT p50"),
    ("ttft_p95", "TTFT p95"),
    ("ttfat_p50", "time to first answer token p50"),
    ("ttfat_p95", "time to first answer token p95"),
    ("e2e_p50", "e2e p50"),
    ("e2e_p95", "e2e p95"),
    ("app_e2e_p50", "app e2e p50 (scenario tasks)"),
    ("app_e2e_p95", "app e2e p95 (scenario tasks)"),
    ("tps_p50", "speed (tokens/s) p50: fires when it falls"),
]

# How long a condition must hold before it fires, by latency class (minutes): an interactive
# task's users notice sooner.
FOR_MINUTES_BY_CLASS = {"interactive": 5, "async": 10, "batch": 30}
WINDOW_MINUTES_BY_CLASS = {"interactive": 60, "async": 60, "batch": 180}
# A latency rule's default window: the time for this many probes at the task's interval, in
# whole minutes (below the form's floor of 10 for a window typed in: a task probed every 10 s
# gets 2 minutes, so that a slowdown shows in 10 probes, not in the 39 of 60 a 10-minute
# window would need). A window of n probes that were all fast needs
# n - l + 1 slow ones before the 95% lower bound of its percentile (the l-th sample,
# monitor.stats.confidence.rank_bounds) is slow: 9 of 10 for a median, 4 of 20 for a p95
# (whose point value needs 20, hist.MIN_SAMPLES). A longer window only makes a real slowdown
# wait longer: 39 of 60 for a median.
WINDOW_PROBES_BY_PERCENTILE = {50: 10, 95: 20}


class AlertRule(models.Model):
    """What to watch on one task, and whom to tell. Empty fields take the task's values (its
    budgets, error ceiling) or its latency class's defaults, as the Task's own fields do."""

    task = models.ForeignKey("monitor.Task", on_delete=models.CASCADE, related_name="alert_rules")
    name = models.CharField(max_length=100, blank=True)
    kind = models.CharField(max_length=20, choices=RULE_KINDS, default=KIND_LATENCY)
    metric = models.CharField(max_length=20, choices=ALERT_METRICS, blank=True, default="")
    threshold_ms = models.FloatField(
        "absolute budget (ms, or tokens/s for speed)",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0)],
        help_text="Latency: fires when the 95% interval's lower bound is above this (speed: "
        "when its upper bound is below it). Empty: the task's budget for the metric, if any.",
    )
    baseline_ratio = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1.0)],
        help_text="Latency: fires when the lower bound is above this many times the route's "
        "own figure over the same hours last week (e.g. 1.5). Either this or a budget.",
    )
    error_ceiling = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Availability: fires when the whole 95% interval of the error rate is above "
        "it. Empty: the task's ceiling. Missed slots: the share of slots missed (default 10%). "
        "Rate limit: the share of the limit left (default 10%).",
    )
    window_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Figures over exactly this trailing window. Empty: a latency rule takes the "
        "time for 10 probes at the task's interval (20 for a p95); other kinds 60 minutes "
        "(batch 180). Docs: Alerts, 'The window'.",
    )
    min_regions = models.PositiveIntegerField(
        "regions that must agree (K)",
        default=2,
        validators=[MinValueValidator(1)],
        help_text="K of the N regions the task probes from must see it; with fewer regions "
        "than K, all of them.",
    )
    for_minutes = models.PositiveIntegerField(
        "minimum duration (min)",
        null=True,
        blank=True,
        help_text="Pending this long before it fires. Empty: interactive 5, async 10, batch 30.",
    )
    remind_every_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Remind while firing and not acknowledged. Empty: never."
    )
    escalate_after_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Not acknowledged this long after firing: tell the escalation channels too.",
    )
    channels = models.ManyToManyField("monitor.AlertChannel", related_name="rules", blank=True)
    escalation_channels = models.ManyToManyField(
        "monitor.AlertChannel", related_name="escalation_rules", blank=True
    )
    is_enabled = models.BooleanField(
        default=False, help_text="Look at its backtest (below) before enabling it."
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        app_label = "monitor"
        ordering = ["task__name", "kind", "pk"]

    def __str__(self) -> str:
        return self.name or f"{self.task}: {self.get_kind_display()}"

    def clean(self) -> None:
        if self.kind == KIND_LATENCY and self.baseline_ratio is None and self.threshold_ms is None:
            task = getattr(self, "task", None)
            if task is None or task.budget_ms(self.effective_metric()) is None:
                raise ValidationError(
                    "A latency rule needs a budget (here or on the task, for this metric) or a "
                    "ratio to the route's baseline."
                )

    def effective_metric(self) -> str:
        if self.metric:
            return self.metric
        task = getattr(self, "task", None)
        return task.ranking_metric() if task is not None else "e2e_p50"

    def effective_threshold(self) -> float | None:
        if self.threshold_ms is not None:
            return self.threshold_ms
        budget = self.task.budget_ms(self.effective_metric())
        return float(budget) if budget is not None else None

    def effective_ceiling(self) -> float:
        if self.error_ceiling is not None:
            return self.error_ceiling
        if self.kind in (KIND_MISSED_SLOTS, KIND_RATE_LIMIT):
            return 0.10
        return self.task.error_ceiling()

    def window(self) -> dt.timedelta:
        if self.window_minutes:
            return dt.timedelta(minutes=self.window_minutes)
        if self.kind == KIND_LATENCY:
            q = int(self.effective_metric().rpartition("_p")[2])
            probes = WINDOW_PROBES_BY_PERCENTILE.get(q, 20) * self.task.probe_interval_s
            return dt.timedelta(minutes=math.ceil(probes / 60))
        minutes = WINDOW_MINUTES_BY_CLASS.get(self.task.latency_class, 60)
        return dt.timedelta(minutes=minutes)

    def hold_for(self) -> dt.timedelta:
        minutes = self.for_minutes
        if minutes is None:
            minutes = FOR_MINUTES_BY_CLASS.get(self.task.latency_class, 5)
        return dt.timedelta(minutes=minutes)

    @property
    def is_event(self) -> bool:
        return self.kind in EVENT_KINDS


def default_rules(task: Any) -> list[AlertRule]:
    """A starting set of rules for a task, unsaved and disabled (look at each backtest, then
    enable): its latency on the ranking metric against the task's budget for it (or 1.5x the
    route's own figure last week when the metric has no budget), availability, no route
    qualifying, stale figures, missed slots, and the spend cap when it has one. Every line is
    left empty, so it follows the task's own values and its latency class's defaults."""
    metric = task.ranking_metric()
    rules = [
        AlertRule(
            task=task,
            kind=KIND_LATENCY,
            baseline_ratio=None if task.budget_ms(metric) is not None else 1.5,
        ),
        AlertRule(task=task, kind=KIND_AVAILABILITY),
        AlertRule(task=task, kind=KIND_NO_WINNER),
        AlertRule(task=task, kind=KIND_STALE, min_regions=1),
        AlertRule(task=task, kind=KIND_MISSED_SLOTS, min_regions=1),
    ]
    if task.monthly_spend_cap_usd is not None:
        rules.append(AlertRule(task=task, kind=KIND_SPEND_CAP, min_regions=1))
    return rules


CHANNEL_EMAIL = "email"
CHANNEL_WEBHOOK = "webhook"
CHANNEL_SLACK = "slack"
CHANNEL_TEAMS = "teams"
CHANNEL_DISCORD = "discord"
CHANNEL_PAGERDUTY = "pagerduty"
CHANNEL_OPSGENIE = "opsgenie"
CHANNEL_KINDS = [
    (CHANNEL_EMAIL, "e-mail (the SMTP settings)"),
    (CHANNEL_WEBHOOK, "webhook (JSON, signed with HMAC-SHA256)"),
    (CHANNEL_SLACK, "Slack"),
    (CHANNEL_TEAMS, "Microsoft Teams"),
    (CHANNEL_DISCORD, "Discord"),
    (CHANNEL_PAGERDUTY, "PagerDuty (trigger and resolve by dedup key)"),
    (CHANNEL_OPSGENIE, "Opsgenie"),
]


class AlertChannel(models.Model):
    """Where notifications go. The URL (with the tokens it carries) and the webhook's signing
    secret are stored encrypted like API keys (monitor.crypto) and never shown again."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=20, choices=CHANNEL_KINDS, default=CHANNEL_WEBHOOK)
    email = models.EmailField(blank=True, help_text="E-mail channels: the address.")
    target_encrypted = models.TextField(blank=True, default="", editable=False)
    secret_encrypted = models.TextField(blank=True, default="", editable=False)
    # The host the target reaches, for people (the URL's tokens are secret, its host is not).
    target_host = models.CharField(max_length=255, blank=True, default="", editable=False)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        app_label = "monitor"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def set_target(self, url: str) -> None:
        self.target_encrypted = encrypt_secret(url) if url else ""

    def target(self) -> str:
        return decrypt_secret(self.target_encrypted) if self.target_encrypted else ""

    def set_secret(self, secret: str) -> None:
        self.secret_encrypted = encrypt_secret(secret) if secret else ""

    def secret(self) -> str:
        return decrypt_secret(self.secret_encrypted) if self.secret_encrypted else ""

    @property
    def has_target(self) -> bool:
        return bool(self.target_encrypted) or bool(self.email)


STATE_PENDING = "pending"
STATE_FIRING = "firing"
STATE_RESOLVED = "resolved"
ALERT_STATES = [(STATE_PENDING, "pending"), (STATE_FIRING, "firing"), (STATE_RESOLVED, "resolved")]


class Alert(models.Model):
    """One rule's condition on one subject (a route, a region, the task), from its first
    breach to its resolution. At most one open (not resolved) alert per (rule, subject)."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    subject = models.CharField(max_length=60)  # "route:12", "region:3", "task"
    route = models.ForeignKey("monitor.Route", on_delete=models.CASCADE, null=True, blank=True)
    region = models.ForeignKey("monitor.Region", on_delete=models.CASCADE, null=True, blank=True)
    state = models.CharField(max_length=10, choices=ALERT_STATES, default=STATE_PENDING)
    started_at = models.DateTimeField()  # first confident evaluation ("confident since")
    # When the breach's evidence began, in data time (monitor.alerts.onset): the minimum
    # duration counts from here. Null: alerts from before it was kept (count from started_at).
    onset_at = models.DateTimeField(null=True, blank=True)
    fired_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    evaluated_at = models.DateTimeField()
    summary = models.CharField(max_length=300)
    facts = models.JSONField(default=dict)  # the latest evaluation's figures (AlertFacts)
    acked_at = models.DateTimeField(null=True, blank=True)
    snoozed_until = models.DateTimeField(null=True, blank=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "monitor"
        ordering = ["-started_at", "-pk"]
        constraints = [
            # Two evaluators at once: the second's insert of the same open alert fails.
            models.UniqueConstraint(
                fields=["rule", "subject"],
                condition=~Q(state=STATE_RESOLVED),
                name="alert_one_open_per_subject",
            )
        ]
        indexes = [
            # The history page and /metrics: the latest alerts, open ones first.
            models.Index(fields=["state", "-started_at"], name="alert_state_started"),
        ]

    def __str__(self) -> str:
        return f"{self.rule}: {self.summary}"

    @property
    def since(self) -> dt.datetime:
        """Where the minimum duration counts from: the onset, or the first confident
        evaluation for an alert that has none."""
        return self.onset_at or self.started_at

    def since_text(self) -> str:
        """For people: when the breach began and when the rule became sure of it ("slow since
        10:02:13 UTC, confident since 10:03:01")."""
        began, sure = self.onset_at, self.started_at
        if began is None or began >= sure:
            return f"confident since {sure:%H:%M:%S} UTC"
        word = {KIND_LATENCY: "slow", KIND_AVAILABILITY: "failing", KIND_RATE_LIMIT: "rate limited"}
        day = "%Y-%m-%d " if began.date() != sure.date() else ""
        return (
            f"{word.get(self.rule.kind, 'breached')} since {began.strftime(day + '%H:%M:%S')} "
            f"UTC, confident since {sure:%H:%M:%S}"
        )

    @property
    def dedup_key(self) -> str:
        """PagerDuty's dedup key (and the webhook's alert id): one per alert."""
        return f"routewatch-alert-{self.pk}"


EVENT_PENDING = "pending"
EVENT_FIRED = "fired"
EVENT_RESOLVED = "resolved"
EVENT_REMINDER = "reminder"
EVENT_ESCALATED = "escalated"
EVENT_ACKED = "acknowledged"
EVENT_SNOOZED = "snoozed"
EVENT_SUPPRESSED = "suppressed"  # fired or resolved during a silence or maintenance window
EVENT_CHOICES = [
    (k, k)
    for k in (
        EVENT_PENDING,
        EVENT_FIRED,
        EVENT_RESOLVED,
        EVENT_REMINDER,
        EVENT_ESCALATED,
        EVENT_ACKED,
        EVENT_SNOOZED,
        EVENT_SUPPRESSED,
    )
]
# Events that notify the rule's channels (escalations go to the escalation channels).
NOTIFYING_EVENTS = frozenset({EVENT_FIRED, EVENT_RESOLVED, EVENT_REMINDER, EVENT_ESCALATED})


class AlertEvent(models.Model):
    """Every state change of an alert, kept (the history page)."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    kind = models.CharField(max_length=20, choices=EVENT_CHOICES)
    note = models.CharField(max_length=500, blank=True)
    facts = models.JSONField(default=dict)

    class Meta:
        app_label = "monitor"
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M} {self.kind}"


SEND_PENDING = "pending"
SEND_SENT = "sent"
SEND_FAILED = "failed"  # given up after its retries
SEND_STATUSES = [(SEND_PENDING, "pending"), (SEND_SENT, "sent"), (SEND_FAILED, "given up")]


class AlertNotification(models.Model):
    """One event told to one channel: an outbox row written with the event, in its
    transaction, so no event is lost; sent under a lease, so none is sent twice
    (monitor.alerts.delivery)."""

    event = models.ForeignKey(
        AlertEvent, on_delete=models.CASCADE, related_name="notifications", null=True
    )
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=10, choices=SEND_STATUSES, default=SEND_PENDING)
    # Due at; while a sender holds it, the end of its lease.
    next_attempt_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # A test send from the admin has no event: its message is in `message`.
    message = models.JSONField(default=dict)

    class Meta:
        app_label = "monitor"
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(fields=["event", "channel"], name="notification_once"),
        ]
        indexes = [
            # The sender's scan: due rows still to send.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status=SEND_PENDING),
                name="notification_due",
            )
        ]

    def __str__(self) -> str:
        return f"{self.channel} #{self.pk} {self.status}"

    @property
    def delivery_id(self) -> str:
        """Fixed per notification: a receiver that sees it twice (a retry after the sender
        died between the receiver's 2xx and our record of it) drops the copy."""
        return f"rwn-{self.pk}"


class Silence(models.Model):
    """No notifications for matching alerts until it expires (the alerts still change state,
    and the history says they were silenced). A reason and an expiry are required."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, null=True, blank=True)
    task = models.ForeignKey("monitor.Task", on_delete=models.CASCADE, null=True, blank=True)
    route = models.ForeignKey("monitor.Route", on_delete=models.CASCADE, null=True, blank=True)
    region = models.ForeignKey("monitor.Region", on_delete=models.CASCADE, null=True, blank=True)
    reason = models.CharField(max_length=300)
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    created_by = models.CharField(max_length=150, blank=True)

    class Meta:
        app_label = "monitor"
        ordering = ["-ends_at"]

    def __str__(self) -> str:
        return f"silence until {self.ends_at:%Y-%m-%d %H:%M}: {self.reason}"

    def clean(self) -> None:
        if not self.reason.strip():
            raise ValidationError({"reason": "Say why."})
        if self.ends_at and self.starts_at and self.ends_at <= self.starts_at:
            raise ValidationError({"ends_at": "The expiry must be after the start."})


WEEKDAY_CHOICES = [
    (i, name) for i, name in enumerate(("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"))
]


class MaintenanceWindow(models.Model):
    """Planned work on a task, route, provider or region (empty: everything): probing goes
    on and the data is marked, but nobody is notified. One-off (starts_at to ends_at) or
    recurring (weekly on a weekday, or daily, from start_time for duration_minutes, local to
    time_zone)."""

    name = models.CharField(max_length=100)
    task = models.ForeignKey("monitor.Task", on_delete=models.CASCADE, null=True, blank=True)
    route = models.ForeignKey("monitor.Route", on_delete=models.CASCADE, null=True, blank=True)
    provider = models.ForeignKey(
        "monitor.Provider", on_delete=models.CASCADE, null=True, blank=True
    )
    region = models.ForeignKey("monitor.Region", on_delete=models.CASCADE, null=True, blank=True)
    starts_at = models.DateTimeField(null=True, blank=True, help_text="One-off: from.")
    ends_at = models.DateTimeField(null=True, blank=True, help_text="One-off: until.")
    weekday = models.PositiveSmallIntegerField(
        choices=WEEKDAY_CHOICES, null=True, blank=True, help_text="Recurring: empty is daily."
    )
    start_time = models.TimeField(null=True, blank=True, help_text="Recurring: local start.")
    duration_minutes = models.PositiveIntegerField(null=True, blank=True)
    time_zone = models.CharField(max_length=64, default="UTC")
    is_active = models.BooleanField(default=True)

    class Meta:
        app_label = "monitor"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def recurring(self) -> bool:
        return self.start_time is not None

    def clean(self) -> None:
        try:
            zoneinfo.ZoneInfo(self.time_zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValidationError(
                {"time_zone": "Not a time zone name (e.g. Europe/Paris)."}
            ) from None
        if self.recurring:
            if not self.duration_minutes:
                raise ValidationError({"duration_minutes": "A recurring window needs a duration."})
        elif not (self.starts_at and self.ends_at and self.ends_at > self.starts_at):
            raise ValidationError("Give a start and a later end, or a recurring start time.")

    def covers(self, when: dt.datetime) -> bool:
        """Is `when` inside this window (any of its occurrences)?"""
        if not self.is_active:
            return False
        if not self.recurring:
            return bool(self.starts_at and self.ends_at and self.starts_at <= when < self.ends_at)
        assert self.start_time is not None
        assert self.duration_minutes
        zone = zoneinfo.ZoneInfo(self.time_zone)
        local = when.astimezone(zone)
        length = dt.timedelta(minutes=self.duration_minutes)
        # An occurrence that started today or on one of the days before may still run.
        for back in range(0, length.days + 2):
            day = local.date() - dt.timedelta(days=back)
            if self.weekday is not None and day.weekday() != self.weekday:
                continue
            start = dt.datetime.combine(day, self.start_time, tzinfo=zone)
            if start <= local < start + length:
                return True
        return False

    def matches(self, task_id: int, route: Any | None, region_ids: set[int]) -> bool:
        """Does it apply to an alert on this task, route (or None) and regions (those that
        agree, or the alert's own)?"""
        if self.task_id is not None and self.task_id != task_id:
            return False
        if self.route_id is not None and (route is None or route.pk != self.route_id):
            return False
        if self.provider_id is not None and (
            route is None or route.provider_id != self.provider_id
        ):
            return False
        return self.region_id is None or self.region_id in region_ids


def site_url(path: str) -> str:
    return settings.SITE_URL.rstrip("/") + path
