"""Subscription.choose_next_send: the user's weekday and hour in their own time zone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError

from monitor.models import MONDAY, SUNDAY, Subscription, validate_time_zone


def _sub(weekday: int, hour: int, zone: str) -> Subscription:
    return Subscription(weekday=weekday, hour=hour, time_zone=zone)


def test_it_picks_the_next_chosen_weekday_and_hour_in_utc() -> None:
    sub = _sub(MONDAY, 8, "UTC")
    monday_morning = datetime(2026, 11, 16, 7, 59, tzinfo=UTC)
    assert sub.choose_next_send(monday_morning) == datetime(2026, 11, 16, 8, 0, tzinfo=UTC)
    # At the send time itself (a sender that just claimed it), the next one is a week later.
    sent = datetime(2026, 11, 16, 8, 0, tzinfo=UTC)
    assert sub.choose_next_send(sent) == datetime(2026, 11, 23, 8, 0, tzinfo=UTC)


def test_it_uses_the_users_time_zone_even_across_the_date_line() -> None:
    # Monday 08:00 in Auckland (UTC+13 in November) is Sunday 19:00 UTC.
    sub = _sub(MONDAY, 8, "Pacific/Auckland")
    now = datetime(2026, 11, 15, 12, 0, tzinfo=UTC)  # Sunday noon UTC = Monday 01:00 there
    assert sub.choose_next_send(now) == datetime(2026, 11, 15, 19, 0, tzinfo=UTC)


def test_the_local_hour_holds_across_a_daylight_saving_change() -> None:
    sub = _sub(MONDAY, 9, "Europe/Paris")
    before = sub.choose_next_send(datetime(2026, 3, 24, 0, 0, tzinfo=UTC))
    after = sub.choose_next_send(before)
    assert before == datetime(2026, 3, 30, 7, 0, tzinfo=UTC)  # CEST: 09:00 is 07:00 UTC
    after_dst_end = sub.choose_next_send(datetime(2026, 10, 27, 0, 0, tzinfo=UTC))
    assert after_dst_end == datetime(2026, 11, 2, 8, 0, tzinfo=UTC)  # CET: 09:00 is 08:00 UTC
    assert after - before == timedelta(days=7)
    previous = sub.choose_next_send(datetime(2026, 3, 23, 0, 0, tzinfo=UTC))
    assert previous == datetime(2026, 3, 23, 8, 0, tzinfo=UTC)  # still CET a week earlier
    assert before - previous == timedelta(days=7) - timedelta(hours=1)


def test_an_hour_skipped_by_spring_forward_sends_just_after_the_gap() -> None:
    # Sunday 29 March 2026: Paris clocks jump from 02:00 to 03:00.
    sub = _sub(SUNDAY, 2, "Europe/Paris")
    sent = sub.choose_next_send(datetime(2026, 3, 28, 0, 0, tzinfo=UTC))
    assert sent == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00 CEST
    assert sub.choose_next_send(sent) == datetime(2026, 4, 5, 0, 0, tzinfo=UTC)


def test_an_hour_repeated_by_fall_back_sends_once_the_first_time() -> None:
    # Sunday 25 October 2026: Paris clocks go from 03:00 back to 02:00.
    sub = _sub(SUNDAY, 2, "Europe/Paris")
    first = sub.choose_next_send(datetime(2026, 10, 24, 0, 0, tzinfo=UTC))
    assert first == datetime(2026, 10, 25, 0, 0, tzinfo=UTC)  # 02:00 CEST
    # The second 02:00 (CET, 01:00 UTC) is not another send: the next one is a week on.
    assert sub.choose_next_send(first) == datetime(2026, 11, 1, 1, 0, tzinfo=UTC)


def test_the_previous_slot_ends_the_digests_week() -> None:
    sub = _sub(MONDAY, 8, "UTC")
    assert sub.previous_slot(datetime(2026, 11, 16, 8, 0, tzinfo=UTC)) == datetime(
        2026, 11, 16, 8, 0, tzinfo=UTC
    )
    assert sub.previous_slot(datetime(2026, 11, 16, 7, 59, tzinfo=UTC)) == datetime(
        2026, 11, 9, 8, 0, tzinfo=UTC
    )


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/Argentina/Buenos_Aires", "UTC"])
def test_iana_time_zones_are_accepted(zone: str) -> None:
    validate_time_zone(zone)


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "", "../../etc/passwd", "CEST+2"])
def test_other_time_zone_names_are_refused(zone: str) -> None:
    with pytest.raises(ValidationError):
        validate_time_zone(zone)
