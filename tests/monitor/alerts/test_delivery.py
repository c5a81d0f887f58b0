"""Delivery to real receivers: the webhook's HMAC, retries with back-off, e-mail over the
digest tests' SMTP server, Slack's and PagerDuty's payloads through Apprise, and a real Celery
worker killed (-9) while the receiver holds its request: no duplicate kept, none lost."""

from __future__ import annotations

import os
import signal
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection

from monitor.alerts import delivery, lifecycle
from monitor.alerts.models import (
    CHANNEL_EMAIL,
    CHANNEL_PAGERDUTY,
    CHANNEL_SLACK,
    SEND_PENDING,
    SEND_SENT,
    AlertChannel,
    AlertNotification,
)
from monitor.tasks import deliver_alerts
from tests import support
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
from tests.monitor.digest.conftest import Inbox, text_of


def _slow(s: Setup) -> None:
    us, eu, _ = s.regions
    write(probes(s, s.fast, us, NOW, 30, e2e_ms=6000) + probes(s, s.fast, eu, NOW, 30, e2e_ms=7000))


def test_a_refused_webhook_is_retried_with_back_off_under_the_same_delivery_id(
    setup: Setup, receiver: Receiver
) -> None:
    _slow(setup)
    latency_rule(setup, webhook(receiver))
    lifecycle.evaluate_all(NOW)
    receiver.statuses = [500, 503]

    assert delivery.send_due(NOW) == delivery.DeliverySummary(failed=1)
    n = AlertNotification.objects.get()
    assert n.status == SEND_PENDING
    assert n.attempts == 1
    assert n.next_attempt_at == NOW + delivery.RETRY_DELAYS[0]
    assert n.last_error == "the receiver answered HTTP 500"

    assert delivery.send_due(NOW + timedelta(seconds=10)) == delivery.DeliverySummary()
    retry = NOW + delivery.RETRY_DELAYS[0]
    assert delivery.send_due(retry) == delivery.DeliverySummary(failed=1)
    assert delivery.send_due(retry + delivery.RETRY_DELAYS[1]).sent == 1
    n.refresh_from_db()
    assert (n.status, n.attempts, n.last_error) == (SEND_SENT, 3, "")
    assert len(receiver.requests) == 3
    assert len(receiver.deliveries) == 1  # one notification, retried
    assert all(r.signature_ok() for r in receiver.requests)


def test_a_channel_that_keeps_refusing_is_given_up_and_says_why(
    setup: Setup, receiver: Receiver
) -> None:
    _slow(setup)
    latency_rule(setup, webhook(receiver))
    lifecycle.evaluate_all(NOW)
    receiver.statuses = [500] * 10
    when = NOW
    for _ in range(delivery.MAX_ATTEMPTS):
        delivery.send_due(when)
        when += timedelta(hours=1)
    n = AlertNotification.objects.get()
    assert n.status == "failed"
    assert (
        n.last_error
        == f"gave up after {delivery.MAX_ATTEMPTS} attempts: the receiver answered HTTP 500"
    )
    assert delivery.send_due(when + timedelta(days=1)) == delivery.DeliverySummary()


def test_an_email_channel_sends_the_figure_its_interval_the_regions_and_why_over_smtp(
    setup: Setup, smtp: Inbox
) -> None:
    _slow(setup)
    channel = AlertChannel.objects.create(
        name="ops mail", kind=CHANNEL_EMAIL, email="ops@example.com"
    )
    latency_rule(setup, channel)
    lifecycle.evaluate_all(NOW)
    assert delivery.send_due(NOW).sent == 1

    [message] = smtp.to("ops@example.com")
    assert message["Subject"].startswith("[Routewatch FIRING] Support:")
    text = text_of(message)
    assert "95% interval" in text
    assert "30 samples" in text
    assert "Threshold: 3000 (the budget)" in text
    assert "Regions that agree: eu-west, us-east (2 of 3, 2 needed)" in text
    assert f"/routes/{setup.fast.pk}/?task=support" in text
    assert "Acknowledge: http" in text
    # Its first slow probe was 30 minutes back; the rule was sure at NOW.
    since = f"Since: slow since {NOW - timedelta(minutes=30):%H:%M:%S} UTC, confident since"
    assert f"{since} {NOW:%H:%M:%S}" in text
    assert message["Message-ID"].startswith("<alert-rwn-")


def _apprise_to(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Apprise's Slack and PagerDuty plugins post to their services' fixed hosts (no custom
    host in their URL schemes): the test points those constants of the library at the
    loopback receiver."""
    from apprise.plugins import pagerduty, slack

    monkeypatch.setattr(slack.NotifySlack, "webhook_url", receiver.url("/services"))
    monkeypatch.setitem(pagerduty.PAGERDUTY_API_LOOKUP, "us", receiver.url("/v2/enqueue"))


def test_slack_gets_its_webhook_payload_through_apprise(
    setup: Setup, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _apprise_to(receiver, monkeypatch)
    _slow(setup)
    slack = AlertChannel(name="slack", kind=CHANNEL_SLACK)
    slack.set_target("slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7")
    slack.save()
    latency_rule(setup, slack)
    lifecycle.evaluate_all(NOW)
    assert delivery.send_due(NOW).sent == 1

    [request] = receiver.requests
    assert request.path == "/services/T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7"
    body = request.json
    assert "attachments" in body or "blocks" in body
    flat = str(body)
    assert "[Routewatch FIRING] Support" in flat
    assert "eu-west, us-east" in flat


def test_pagerduty_is_triggered_then_resolved_by_the_alerts_dedup_key(
    setup: Setup, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _apprise_to(receiver, monkeypatch)
    _slow(setup)
    pd = AlertChannel(name="pagerduty", kind=CHANNEL_PAGERDUTY)
    pd.set_target("pagerduty://integration0key0123456789@api0key0123456789")
    pd.save()
    rule = latency_rule(setup, pd)
    lifecycle.evaluate_all(NOW)
    delivery.send_due(NOW)
    lifecycle.evaluate_all(NOW + timedelta(hours=2))
    delivery.send_due(NOW + timedelta(hours=2))

    trigger, resolve = (r.json for r in receiver.requests)
    dedup = rule.alerts.get().dedup_key
    assert trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == dedup
    assert trigger["routing_key"] == "integration0key0123456789"
    assert trigger["payload"]["severity"] in ("critical", "error")
    assert "slower on e2e p50" in trigger["payload"]["summary"]
    assert resolve == {
        "routing_key": "integration0key0123456789",
        "event_action": "resolve",
        "dedup_key": dedup,
    }


@pytest.mark.django_db(transaction=True)
def test_a_sender_killed_mid_delivery_neither_loses_nor_duplicates_the_notification(
    receiver: Receiver, tmp_path: Path
) -> None:
    s = make_setup()
    _slow(s)
    latency_rule(s, webhook(receiver))
    lifecycle.evaluate_all(NOW)
    [n] = AlertNotification.objects.all()
    queue = f"alerts-kill-{uuid.uuid4().hex[:8]}"
    env = support.child_env(connection.settings_dict)
    worker = support.start(
        support.celery("worker", "--queues", queue, "--pool", "solo", "--loglevel", "INFO"),
        env,
        tmp_path / "worker.log",
    )
    receiver.hold = True  # the receiver has the request; the worker waits for the answer
    try:
        deliver_alerts.apply_async(queue=queue)
        assert receiver.arrived.wait(60), (tmp_path / "worker.log").read_text()[-3000:]
        os.killpg(worker.pid, signal.SIGKILL)  # kill -9, at the moment of sending
        worker.wait(10)
    finally:
        support.stop(worker)
        receiver.hold = False
        receiver.release.set()
    n.refresh_from_db()
    assert (n.status, n.attempts) == (SEND_PENDING, 1)  # claimed, never recorded as sent
    lease_end = n.next_attempt_at

    # Within the lease, nobody sends it again; after it, the next run does, once.
    assert delivery.send_due(lease_end - timedelta(seconds=1)) == delivery.DeliverySummary()
    assert delivery.send_due(lease_end).sent == 1
    assert delivery.send_due(lease_end + timedelta(hours=1)) == delivery.DeliverySummary()
    n.refresh_from_db()
    assert (n.status, n.attempts) == (SEND_SENT, 2)
    assert len(receiver.requests) == 2  # the same notification, retried after the kill
    assert receiver.deliveries == {n.delivery_id}  # a receiver that keeps one keeps it once
    assert all(r.signature_ok() for r in receiver.requests)
