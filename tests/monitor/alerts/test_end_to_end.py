"""The alerts as deployed: Celery beat schedules `monitor.tasks.evaluate_alerts`, a worker on
the `default` queue runs it, and a webhook receiver on loopback gets one signed notification
when a route fails in two regions of three, then one resolution when the failures stop.
Results go through the real ingest path (the probing itself has end-to-end tests of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from monitor.alerts.models import KIND_AVAILABILITY, AlertRule
from tests import support
from tests.monitor.alerts.conftest import (
    Receiver,
    assert_fired_then_resolved_once,
    make_setup,
    probes,
    webhook,
    write,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_beat_and_a_default_worker_fire_once_and_resolve_once_at_a_real_receiver(
    receiver: Receiver, tmp_path: Path
) -> None:
    s = make_setup()
    us, eu, ap = s.regions
    now = timezone.now()
    for region in (us, eu):
        write(probes(s, s.other, region, now, 20, outcome="error", error_kind="http_5xx"))
    write(probes(s, s.other, ap, now, 20))
    rule = AlertRule.objects.create(
        task=s.task, kind=KIND_AVAILABILITY, error_ceiling=0.2, for_minutes=0, is_enabled=True
    )
    rule.channels.set([webhook(receiver)])
    env = support.child_env(
        connection.settings_dict,
        ALERT_EVALUATION_SECONDS="1",
        DASHBOARD_REFRESH_SECONDS="3600",
        TICK_SECONDS="3600",
    )
    worker = support.start(
        support.celery("worker", "--queues", "default", "--pool", "solo", "--loglevel", "INFO"),
        env,
        tmp_path / "worker.log",
    )
    beat = support.start(
        support.celery("beat", "--schedule", str(tmp_path / "beat-schedule"), "--loglevel", "INFO"),
        env,
        tmp_path / "beat.log",
    )

    def logs() -> str:
        return (tmp_path / "worker.log").read_text()[-3000:] + (tmp_path / "beat.log").read_text()[
            -1500:
        ]

    try:
        assert support.wait_until(lambda: len(receiver.requests) >= 1, timeout_s=60), logs()
        fired = receiver.requests[0]
        assert fired.signature_ok()
        assert fired.json["event"] == "fired"
        assert fired.json["regions"] == ["eu-west", "us-east"]

        # The failures stop: enough successes that the error rate is no longer surely high.
        later = timezone.now()
        for region in (us, eu):
            write(probes(s, s.other, region, later, 100, slot=False))  # ad-hoc: new rows
        assert support.wait_until(lambda: len(receiver.requests) >= 2, timeout_s=60), logs()
    finally:
        support.stop(beat)
        support.stop(worker)
    resolved = receiver.requests[1]
    assert resolved.signature_ok()
    assert resolved.json["event"] == "resolved"
    assert len(receiver.requests) == 2
    assert_fired_then_resolved_once()
