"""pending -> firing -> resolved, told once each to a real webhook receiver on loopback (its
HMAC checked), every change kept; silences and maintenance windows keep everyone quiet;
reminders, one escalation, acknowledging from the signed link; two evaluators at once."""

from __future__ import annotations

import re
import threading
from datetime import time, timedelta

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.urls import reverse

from monitor.alerts import delivery, lifecycle
from monitor.alerts.models import (
    STATE_FIRING,
    STATE_PENDING,
    STATE_RESOLVED,
    Alert,
    AlertEvent,
    AlertNotification,
    MaintenanceWindow,
    Silence,
)
from tests.monitor.alerts.conftest import (
    NOW,
    Receiver,
    Setup,
    latency_rule,
    make_setup,
    probes,
    webhook,
    write,
)


def _slow(s: Setup) -> None:
    us, eu, _ = s.regions
    write(probes(s, s.fast, us, NOW, 30, e2e_ms=6000) + probes(s, s.fast, eu, NOW, 30, e2e_ms=7000))


def _kinds(alert: Alert) -> list[str]:
    return list(alert.events.order_by("at", "pk").values_list("kind", flat=True))


def test_an_alert_fires_once_after_its_minimum_duration_and_resolves_once(
    setup: Setup, receiver: Receiver
) -> None:
    s = setup
    _slow(s)
    # Slow for the last 30 minutes (one probe a minute): the duration counts from the first
    # slow probe (the onset), so 35 minutes fire 5 minutes from now.
    rule = latency_rule(s, webhook(receiver), for_minutes=35)

    lifecycle.evaluate_all(NOW)
    alert = Alert.objects.get(rule=rule)
    assert alert.state == STATE_PENDING
    assert alert.onset_at == NOW - timedelta(minutes=30)
    assert delivery.send_due(NOW).sent == 0

    lifecycle.evaluate_all(NOW + timedelta(minutes=2))
    alert.refresh_from_db()
    assert alert.state == STATE_PENDING  # not held long enough yet

    lifecycle.evaluate_all(NOW + timedelta(minutes=5))
    lifecycle.evaluate_all(NOW + timedelta(minutes=6))  # still firing: nothing new
    assert delivery.send_due(NOW + timedelta(minutes=6)).sent == 1
    alert.refresh_from_db()
    assert alert.state == STATE_FIRING

    # Two hours on, the slow hour is out of the window: resolved, told once.
    later = NOW + timedelta(hours=2)
    lifecycle.evaluate_all(later)
    lifecycle.evaluate_all(later + timedelta(minutes=1))
    assert delivery.send_due(later + timedelta(minutes=1)).sent == 1
    alert.refresh_from_db()
    assert alert.state == STATE_RESOLVED
    assert _kinds(alert) == ["pending", "fired", "resolved"]

    fired, resolved = receiver.requests
    assert fired.signature_ok()
    assert resolved.signature_ok()
    assert not fired.signature_ok("another-secret")
    body = fired.json
    assert body["event"] == "fired"
    assert body["regions"] == ["eu-west", "us-east"]
    assert body["samples"] == 30
    assert body["threshold"] == 3000
    assert body["low"] > 3000
    assert body["url"].endswith(f"/routes/{s.fast.pk}/?task=support")
    assert "lower bound is above 3,000 ms" in body["why"]
    assert body["ack_url"]
    assert resolved.json["event"] == "resolved"
    assert resolved.json["dedup_key"] == body["dedup_key"]
    # It says it is over, then what was wrong (not, as it did, only the breach's own words).
    assert resolved.json["summary"].startswith("resolved: ")
    assert resolved.json["why"].startswith("resolved: the rule no longer finds this breached.")
    assert body["why"] in resolved.json["why"]
    assert fired.headers["X-Routewatch-Delivery"] != resolved.headers["X-Routewatch-Delivery"]


def test_a_breach_that_clears_before_its_minimum_duration_tells_nobody(
    setup: Setup, receiver: Receiver
) -> None:
    s = setup
    _slow(s)
    rule = latency_rule(s, webhook(receiver), for_minutes=60)  # slow for 30 minutes of it
    lifecycle.evaluate_all(NOW)
    lifecycle.evaluate_all(NOW + timedelta(hours=2))
    delivery.send_due(NOW + timedelta(hours=2))
    alert = Alert.objects.get(rule=rule)
    assert alert.state == STATE_RESOLVED
    assert _kinds(alert) == ["pending", "resolved"]
    assert receiver.requests == []


def test_a_maintenance_window_keeps_the_changes_but_notifies_nobody(
    setup: Setup, receiver: Receiver
) -> None:
    s = setup
    _slow(s)
    rule = latency_rule(s, webhook(receiver))
    MaintenanceWindow.objects.create(
        name="provider upgrade",
        provider=s.fast.provider,
        start_time=time(11, 0),
        duration_minutes=120,
        time_zone="UTC",
    )
    lifecycle.evaluate_all(NOW)
    lifecycle.evaluate_all(NOW + timedelta(hours=2, minutes=30))  # resolved after the window
    delivery.send_due(NOW + timedelta(hours=3))

    alert = Alert.objects.get(rule=rule)
    assert _kinds(alert) == ["pending", "fired", "resolved"]
    fired = alert.events.get(kind="fired")
    assert fired.note == "not notified: maintenance window 'provider upgrade'"
    assert "nobody was told it fired" in alert.events.get(kind="resolved").note
    assert receiver.requests == []
    assert not AlertNotification.objects.exists()


def test_a_silence_needs_a_reason_and_an_expiry_and_keeps_matching_alerts_quiet(
    setup: Setup, receiver: Receiver
) -> None:
    s = setup
    _slow(s)
    rule = latency_rule(s, webhook(receiver))
    with pytest.raises(ValidationError):
        Silence(
            route=s.fast, reason=" ", starts_at=NOW, ends_at=NOW + timedelta(hours=1)
        ).full_clean()
    with pytest.raises(ValidationError):
        Silence(route=s.fast, reason="why", starts_at=NOW).full_clean()  # no expiry
    Silence.objects.create(
        route=s.fast,
        reason="known slowness, ticket 42",
        starts_at=NOW - timedelta(hours=1),
        ends_at=NOW + timedelta(hours=1),
    )
    Silence.objects.create(
        route=s.other, reason="other route", starts_at=NOW, ends_at=NOW + timedelta(days=1)
    )
    lifecycle.evaluate_all(NOW)
    delivery.send_due(NOW)
    note = AlertEvent.objects.get(kind="fired").note
    assert note.startswith("not notified: silenced until")
    assert "ticket 42" in note
    assert receiver.requests == []
    assert rule.alerts.get().state == STATE_FIRING


def test_reminders_repeat_until_acknowledged_and_one_escalation_goes_to_its_channels(
    setup: Setup, receiver: Receiver
) -> None:
    s = setup
    _slow(s)
    pager = webhook(receiver, "pager")
    rule = latency_rule(s, webhook(receiver), remind_every_minutes=10, escalate_after_minutes=25)
    rule.escalation_channels.set([pager])
    for minutes in (0, 10, 20, 25, 30, 40):
        lifecycle.evaluate_all(NOW + timedelta(minutes=minutes))
    alert = rule.alerts.get()
    assert _kinds(alert) == [
        "pending",
        "fired",
        "reminder",
        "reminder",
        "escalated",
        "reminder",
        "reminder",
    ]
    escalated = alert.events.get(kind="escalated")
    assert [n.channel.name for n in escalated.notifications.all()] == ["pager"]

    assert lifecycle.acknowledge(alert.pk, NOW + timedelta(minutes=41), "owner")
    assert not lifecycle.acknowledge(alert.pk, NOW + timedelta(minutes=42), "owner")
    lifecycle.evaluate_all(NOW + timedelta(minutes=50))  # still breached: no more reminders
    assert _kinds(alert)[-1] == "acknowledged"


def test_the_signed_link_in_a_notification_shows_a_form_then_acknowledges(
    setup: Setup, receiver: Receiver, owner: User
) -> None:
    s = setup
    _slow(s)
    latency_rule(s, webhook(receiver))
    lifecycle.evaluate_all(NOW)
    delivery.send_due(NOW)
    [request] = receiver.requests
    ack_url = request.json["ack_url"]
    path = re.sub(r"^https?://[^/]+", "", ack_url)
    client = Client(enforce_csrf_checks=True)

    page = client.get(path)  # a mail scanner following the link changes nothing
    assert page.status_code == 200
    alert = Alert.objects.get()
    assert alert.acked_at is None
    token = client.cookies["csrftoken"].value
    done = client.post(path, {"csrfmiddlewaretoken": token})
    assert done.status_code == 200
    assert "Acknowledged" in done.content.decode()
    alert.refresh_from_db()
    assert alert.acked_at is not None

    tampered = client.get(path.replace("ack", "snooze"))
    assert tampered.status_code == 400


def test_two_evaluators_at_once_record_each_change_and_notification_once(
    transactional_db: None, receiver: Receiver
) -> None:
    s = make_setup()
    _slow(s)
    rules = [latency_rule(s, webhook(receiver, f"hook {i}"), min_regions=2) for i in range(6)]
    start = threading.Barrier(2)
    errors: list[BaseException] = []
    summaries: list[lifecycle.EvaluationSummary] = []

    def evaluator() -> None:
        try:
            start.wait()
            summaries.append(lifecycle.evaluate_all(NOW))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=evaluator) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sum(x.rules for x in summaries) >= len(rules)
    assert Alert.objects.count() == len(rules)
    assert AlertEvent.objects.filter(kind="fired").count() == len(rules)
    assert AlertNotification.objects.count() == len(rules)
    delivery.send_due(NOW)
    assert len(receiver.requests) == len(rules)


def test_the_history_page_shows_every_change_and_who_was_told(
    setup: Setup, receiver: Receiver, teammate: User, client: Client
) -> None:
    s = setup
    _slow(s)
    latency_rule(s, webhook(receiver))
    lifecycle.evaluate_all(NOW)
    delivery.send_due(NOW)
    assert client.get(reverse("rw-alerts")).status_code == 302  # login required
    client.force_login(teammate)
    body = client.get(reverse("rw-alerts")).content.decode()
    assert 'data-state="firing"' in body
    assert 'data-event="fired"' in body
    assert "ops hook: sent" in body
    assert "Why:" in body
    # When it began (its first slow probe, 30 minutes back) and when the rule was sure.
    began = NOW - timedelta(minutes=30)
    assert f"slow since {began:%H:%M:%S} UTC, confident since {NOW:%H:%M:%S}" in body
    assert f"slow since {began:%H:%M:%S} UTC, confident since {NOW:%H:%M:%S}: " in (
        AlertEvent.objects.get(kind="pending").note
    )
