"""The weekly digest: one subscription per user, when it goes out in their time zone."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db import models
from django.utils import timezone

from monitor.models.tasks import Task

MONDAY, TUESDAY, WEDNESDAY, THURSDAY, FRIDAY, SATURDAY, SUNDAY = range(7)
WEEKDAYS = [
    (MONDAY, "Monday"),
    (TUESDAY, "Tuesday"),
    (WEDNESDAY, "Wednesday"),
    (THURSDAY, "Thursday"),
    (FRIDAY, "Friday"),
    (SATURDAY, "Saturday"),
    (SUNDAY, "Sunday"),
]


def validate_time_zone(value: str) -> None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValidationError(f"{value!r} is not an IANA time zone (e.g. Europe/Paris).") from None


# The fields that say when a digest goes out (Subscription.reschedule_if_changed).
SCHEDULE_FIELDS = frozenset({"is_active", "weekday", "hour", "time_zone"})


class Subscription(models.Model):
    """One user's weekly digest: which tasks (none = all), when in their own time zone."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="digest_subscription"
    )
    tasks = models.ManyToManyField(
        Task, blank=True, related_name="subscriptions", help_text="None selected: all tasks."
    )
    weekday = models.PositiveSmallIntegerField(choices=WEEKDAYS, default=MONDAY)
    hour = models.PositiveSmallIntegerField(
        default=8, validators=[MaxValueValidator(23)], help_text="Local hour, 0 to 23."
    )
    time_zone = models.CharField(
        max_length=64, default="UTC", validators=[validate_time_zone], help_text="IANA name."
    )
    is_active = models.BooleanField(default=True)
    # When the next digest (or a retry of a failed one) is due; null while inactive. A sender
    # claims a digest by moving this forward (optimistic lock, monitor.digest.sending.send_due).
    next_send_at = models.DateTimeField(null=True, blank=True)
    last_sent_at = models.DateTimeField(null=True, blank=True)
    # Attempts at the current digest; reset once it is sent or given up.
    send_attempts = models.PositiveSmallIntegerField(default=0, editable=False)
    last_error = models.CharField(max_length=300, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        indexes = [
            # The beat task: active subscriptions whose next send time has come.
            models.Index(
                fields=["next_send_at"],
                name="subscription_due",
                condition=models.Q(is_active=True),
            ),
        ]

    def __str__(self) -> str:
        return f"digest for {self.user}"

    def choose_next_send(self, now: dt.datetime) -> dt.datetime:
        """The first local `weekday` at `hour` strictly after `now`, as an aware UTC time.

        Computed on local wall-clock dates, then localised: a week that crosses a DST change
        still lands at the chosen local hour. An hour that does not exist that day (spring
        forward) is taken with fold=0, which zoneinfo maps to the hour after the gap; an hour
        that happens twice (fall back) is taken the first time."""
        from zoneinfo import ZoneInfo

        zone = ZoneInfo(self.time_zone)
        local_now = now.astimezone(zone)
        days_ahead = (self.weekday - local_now.weekday()) % 7
        for extra_weeks in (0, 1):
            day = local_now.date() + dt.timedelta(days=days_ahead + 7 * extra_weeks)
            naive = dt.datetime.combine(day, dt.time(self.hour))
            candidate = naive.replace(tzinfo=zone).astimezone(dt.UTC)
            if candidate > now:
                return candidate
        raise AssertionError("unreachable: a week later is always after now")

    def previous_slot(self, now: dt.datetime) -> dt.datetime:
        """The last local `weekday` at `hour` at or before `now`: where a digest's week ends."""
        from zoneinfo import ZoneInfo

        zone = ZoneInfo(self.time_zone)
        local_now = now.astimezone(zone)
        days_back = (local_now.weekday() - self.weekday) % 7
        for extra_weeks in (0, 1):
            day = local_now.date() - dt.timedelta(days=days_back + 7 * extra_weeks)
            naive = dt.datetime.combine(day, dt.time(self.hour))
            candidate = naive.replace(tzinfo=zone).astimezone(dt.UTC)
            if candidate <= now:
                return candidate
        raise AssertionError("unreachable: a week earlier is always before now")

    def reschedule(self, now: dt.datetime) -> None:
        """After a change of schedule or of the active flag (not saved here)."""
        self.next_send_at = self.choose_next_send(now) if self.is_active else None
        self.send_attempts = 0

    def reschedule_if_changed(self, changed_fields: Iterable[str], now: dt.datetime) -> None:
        """After an edit (not saved here): a new subscription, a new schedule or switching it
        on or off sets the next send time; other edits keep it, and a pending retry with it."""
        if self.pk is None or SCHEDULE_FIELDS & set(changed_fields):
            self.reschedule(now)
