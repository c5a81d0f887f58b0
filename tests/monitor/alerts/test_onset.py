"""A rule's minimum duration counts from the onset of its evidence in data time (the first
probe of the stretch past the line: monitor.alerts.onset), not from the first evaluation
that is confident: a route slow from T0 fires at T0 + duration + at most one tick, however
long the interval took to become sure. On results written through the real ingest path and
read back from PostgreSQL, evaluated tick by tick by the live lifecycle."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from monitor.alerts import backtest, delivery, evaluation, lifecycle
from monitor.alerts.models import (
    KIND_AVAILABILITY,
    KIND_RATE_LIMIT,
    STATE_FIRING,
    STATE_RESOLVED,
    Alert,
    AlertNotification,
    AlertRule,
)
from monitor.models import Region, Route
from tests.monitor import factories as f
from tests.monitor.alerts.conftest import NOW, Receiver, Setup, latency_rule, webhook, write

STEP = timedelta(seconds=10)  # one probe every 10 s per region
TICK = timedelta(seconds=30)  # ALERT_EVALUATION_SECONDS
T0 = NOW - timedelta(minutes=10) + timedelta(seconds=7)  # the slowdown (not on a tick)


def _every(s: Setup, route: Route, region: Region, start: datetime, end: datetime, **kw: Any):  # type: ignore[no-untyped-def]
    at, rows = start, []
    while at < end:
        rows.append(f.payload(s.task, route, region, at, slot=False, **kw))
        at += STEP
    return rows


def _slowdown(s: Setup, start: datetime = T0, **slow: Any) -> None:
    """Fast probes for ten minutes before `start` in all three regions; from it on, slow
    ones (or `slow`) in us-east and eu-west until NOW."""
    us, eu, ap = s.regions
    rows = []
    for region in (us, eu, ap):
        rows += _every(s, s.fast, region, start - timedelta(minutes=10), start, e2e_ms=900.0)
    for region in (us, eu):
        rows += _every(s, s.fast, region, start, NOW, **(slow or {"e2e_ms": 6000.0}))
    rows += _every(s, s.fast, ap, start, NOW, e2e_ms=900.0)
    write(rows)


def _kinds(alert: Alert) -> list[str]:
    return list(alert.events.order_by("at", "pk").values_list("kind", flat=True))


def test_a_slowdown_fires_at_its_onset_plus_the_minimum_duration_plus_at_most_one_tick(
    setup: Setup, receiver: Receiver
) -> None:
    s = setup
    s.task.probe_interval_s = 10
    s.task.save()
    _slowdown(s)
    # Every rule field at its default but the line: window 2 minutes (10 probes at 10 s),
    # minimum duration 5 minutes (interactive), 2 regions of 3.
    rule = latency_rule(s, webhook(receiver), for_minutes=None, window_minutes=None)
    assert (rule.window(), rule.hold_for()) == (timedelta(minutes=2), timedelta(minutes=5))

    at = T0 - TICK
    while at <= T0 + timedelta(minutes=8):
        lifecycle.evaluate_all(at)
        at += TICK
    alert = Alert.objects.get(rule=rule)
    assert alert.state == STATE_FIRING
    assert _kinds(alert) == ["pending", "fired"]
    # Fired at the slowdown + the minimum duration + at most one tick ...
    assert alert.fired_at is not None
    assert rule.hold_for() <= alert.fired_at - T0 < rule.hold_for() + TICK
    # ... because the onset is the first slow probe: the interval was sure only some ticks
    # later (the window needed 10 slow probes of 12), and that wait is not added.
    assert alert.onset_at == T0
    assert alert.started_at - T0 >= timedelta(seconds=90)
    pending = alert.events.get(kind="pending")
    assert pending.note.startswith(
        f"slow since {T0:%H:%M:%S} UTC, confident since {alert.started_at:%H:%M:%S}: "
    )

    delivery.send_due(alert.fired_at)
    [fired] = receiver.requests
    body = fired.json
    assert body["event"] == "fired"
    assert body["onset_at"] == T0.isoformat()
    assert body["confident_at"] == alert.started_at.isoformat()
    assert body["since"] == (
        f"slow since {T0:%H:%M:%S} UTC, confident since {alert.started_at:%H:%M:%S}"
    )
    assert AlertNotification.objects.get().status == "sent"


def test_a_stray_slow_probe_before_the_slowdown_does_not_pull_its_onset_back(
    setup: Setup,
) -> None:
    s = setup
    s.task.probe_interval_s = 10
    s.task.save()
    us, eu, _ = s.regions
    _slowdown(s)
    # One slow probe 25 s before the slowdown in both regions, then two fast ones.
    stray = T0 - timedelta(seconds=25)
    write([f.payload(s.task, s.fast, g, stray, slot=False, e2e_ms=7000.0) for g in (us, eu)])
    rule = latency_rule(s, for_minutes=None, window_minutes=None)
    # Alone, it is noise: never sure, never an alert.
    assert evaluation.evaluate(rule, T0) == []
    # The first moment the rule is sure, the window (2 minutes) still holds the stray probe.
    now = T0
    while not (found := evaluation.evaluate(rule, now)):
        now += timedelta(seconds=5)
    assert now - rule.window() <= stray
    [finding] = found
    # "The earliest slow probe in the window" would be the stray one.
    assert lifecycle.onset_for(rule, finding, now) == T0


def test_an_availability_onset_is_the_first_failure_and_never_before_the_last_resolution(
    setup: Setup,
) -> None:
    s = setup
    _slowdown(s, outcome="error", error_kind="http_5xx")
    rule = AlertRule.objects.create(
        task=s.task, kind=KIND_AVAILABILITY, error_ceiling=0.05, window_minutes=10, is_enabled=True
    )
    now = T0 + timedelta(minutes=2)
    [finding] = evaluation.evaluate(rule, now)
    assert finding.subject == f"route:{s.fast.pk}"
    assert lifecycle.onset_for(rule, finding, now) == T0
    # The same subject resolved 45 s into the failures: a new breach counts from there.
    resolved = T0 + timedelta(seconds=45)
    Alert.objects.create(
        rule=rule,
        subject=finding.subject,
        route=s.fast,
        state=STATE_RESOLVED,
        started_at=T0,
        evaluated_at=resolved,
        resolved_at=resolved,
        summary="before",
    )
    assert lifecycle.onset_for(rule, finding, now) == T0 + timedelta(seconds=50)


def test_the_backtest_counts_the_minimum_duration_from_the_onset_too(setup: Setup) -> None:
    """A batch-like rule (3-hour window, 90-minute duration): the first hour has three slow
    probes, too few for a median's interval; the next two are all slow. Live, the breach
    began with those three; the backtest's hourly replay says the same, so it fires at its
    first sure evaluation (the onset 2 hours back), not 90 minutes after it."""
    s = setup
    us, eu, _ = s.regions
    start = NOW.replace(minute=0) - timedelta(days=3)
    rows = []
    for region in (us, eu):
        rows += [
            f.payload(s.task, s.fast, region, start + timedelta(minutes=m), e2e_ms=6000.0)
            for m in (57, 58, 59)
        ]
        rows += [
            f.payload(s.task, s.fast, region, start + timedelta(minutes=m), e2e_ms=6000.0)
            for m in range(60, 180)
        ]
    write(rows)
    rule = latency_rule(s, window_minutes=180, for_minutes=90)

    result = backtest.run(rule, NOW)

    [firing] = result.firings
    # Evaluated hourly: first sure at start + 2 h (the first hour alone is not), onset at
    # start, so 2 h >= 90 min at once.
    assert firing.at == start + timedelta(hours=2)


def test_an_alerts_onset_is_when_k_regions_were_past_the_line_at_once(setup: Setup) -> None:
    s = setup
    us, eu, ap = s.regions
    later = T0 + timedelta(minutes=1)
    rows = []
    for region, slow_from in ((us, T0), (eu, later), (ap, NOW)):
        rows += _every(s, s.fast, region, T0 - timedelta(minutes=10), slow_from, e2e_ms=900.0)
        rows += _every(s, s.fast, region, slow_from, NOW, e2e_ms=6000.0)
    write(rows)
    now = T0 + timedelta(minutes=5)  # the window (5 minutes) starts at T0
    two = latency_rule(s, window_minutes=5, min_regions=2)
    [finding] = evaluation.evaluate(two, now)
    assert finding.facts["regions"] == ["eu-west", "us-east"]
    # us-east alone from T0; both (K = 2) from eu-west's first slow probe.
    assert lifecycle.onset_for(two, finding, now) == later
    one = latency_rule(s, window_minutes=5, min_regions=1)
    [finding] = evaluation.evaluate(one, now)
    assert lifecycle.onset_for(one, finding, now) == T0


def test_a_rate_limit_onset_is_the_first_429(setup: Setup) -> None:
    s = setup
    _slowdown(s, outcome="error", error_kind="http_429")
    rule = AlertRule.objects.create(
        task=s.task, kind=KIND_RATE_LIMIT, window_minutes=10, is_enabled=True
    )
    now = T0 + timedelta(minutes=2)
    [finding] = evaluation.evaluate(rule, now)
    assert lifecycle.onset_for(rule, finding, now) == T0


def test_a_speed_onset_is_the_first_slow_stream_and_a_stray_one_stays_out(setup: Setup) -> None:
    """Speed falls instead of rising: the onset of a tokens/s p50 rule is the first probe
    under the line, and one stray slow stream earlier (followed by fast ones) is not it."""
    s = setup
    s.task.probe_interval_s = 10
    s.task.save()
    us, eu, _ = s.regions
    _slowdown(s, tps=20.0)  # 100 tok/s before T0, 20 from it in us-east and eu-west
    stray = T0 - timedelta(seconds=25)
    write([f.payload(s.task, s.fast, g, stray, slot=False, tps=15.0) for g in (us, eu)])
    rule = latency_rule(s, metric="tps_p50", threshold_ms=50, window_minutes=5)
    # The window (5 minutes) holds three fast probes, the stray one and 27 slow ones.
    now = T0 + timedelta(minutes=4, seconds=30)
    assert now - rule.window() < stray
    [finding] = evaluation.evaluate(rule, now)
    assert finding.facts["regions"] == ["eu-west", "us-east"]
    assert lifecycle.onset_for(rule, finding, now) == T0
