"""Spend that cannot burst: after an outage the first tick sends nothing past its deadline, and
the monthly cap holds within a tick and across ticks, in-flight probes counted."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from monitor.models import STEP_FAN_OUT, ProbeResult, ProbeSlot, ScenarioStep, Task
from monitor.pipeline.beat import scheduling
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.messages import RUN_PROBE_BATCH
from monitor.stats import spend
from tests.monitor import factories as f

NOW = datetime(2026, 11, 2, 10, 0, 30, tzinfo=UTC)


@pytest.fixture
def world(db: None, settings):
    settings.SLOT_GRACE_SECONDS, settings.TICK_SECONDS = 3, 1
    p = f.provider()
    routes = [f.route(p, f"m{i}") for i in range(3)]
    regions = [f.region(s) for s in ("eu-west", "us-east")]
    # The estimate of one probe (1000 tokens in at $1/M, 200 out at $2/M) is what a result
    # from factories.payload costs: $0.0014.
    t = f.task(
        "qa",
        routes,
        regions,
        probe_interval_s=10,
        probe_timeout_s=5,
        input_tokens=1000,
        max_tokens=200,
    )
    return t, routes, regions


def _sent(dispatches) -> list[dict]:
    return [
        probe for d in dispatches if d.task_name == RUN_PROBE_BATCH for probe in d.message["probes"]
    ]


def test_after_a_two_hour_outage_the_first_tick_sends_nothing_past_its_deadline(
    world, settings
) -> None:
    t, _, _ = world
    for second in range(0, 11):  # the ticks before the outage: every schedule has begun
        scheduling.plan(NOW - timedelta(seconds=second))
    ProbeSlot.objects.update(status="done")
    later = NOW + timedelta(hours=2)
    sent = _sent(scheduling.plan(later))
    grace = timedelta(seconds=3)
    # Each sent probe can still finish by its slot's deadline; nothing older went out. (Whether
    # the first tick has any in time depends on the combinations' phases: the ticks of the
    # next interval send each combination's first slot it can still make.)
    assert all(later - datetime.fromisoformat(p["slot"]["slot_at"]) <= grace for p in sent)
    # At most one slot per (route, region) whose time has come; the rest are claimed ahead.
    assert len([p for p in sent if datetime.fromisoformat(p["slot"]["slot_at"]) <= later]) <= 6
    ahead = timedelta(seconds=settings.SCHEDULE_AHEAD_SECONDS)
    assert all(datetime.fromisoformat(p["slot"]["slot_at"]) <= later + ahead for p in sent)
    after = []
    for second in range(1, 11):
        at = later + timedelta(seconds=second)
        tick = _sent(scheduling.plan(at))
        assert all(at - datetime.fromisoformat(p["slot"]["slot_at"]) <= grace for p in tick)
        after += tick
    assert len(sent) + len(after) >= 6  # every (route, region) is probing again
    ProbeSlot.objects.filter(slot_at__gt=later).delete()  # judge the outage tick's slots only
    # The outage's slots exist, recorded missed without being sent (never silently absent).
    # (Those after the ticks before the outage, which claimed up to `ahead` beyond NOW.)
    created = ProbeSlot.objects.filter(slot_at__gt=NOW + ahead + timedelta(seconds=10))
    statuses = Counter(created.values_list("status", flat=True))
    assert statuses["missed"] >= 6 * (2 * 360 - 4)  # 720 intervals per (route, region), minus edges
    now_due = [p for p in sent if datetime.fromisoformat(p["slot"]["slot_at"]) <= later]
    assert statuses["dispatched"] == len(now_due)
    missed = ProbeResult.objects.filter(outcome="missed")
    assert missed.count() == ProbeSlot.objects.filter(status="missed").count()
    assert all("not sent" in detail for detail in missed.values_list("error_detail", flat=True))
    # Not sent, not paid for: the month's spend is only the in-flight estimate of what went out.
    assert spend.committed_by_task(later)[t.pk] == Decimal("0.0014") * len(now_due)


def test_the_cap_is_summed_within_a_tick(world) -> None:
    t, _, _ = world
    # Caps are whole cents: room for 7 probes ($0.0098) of the 12 due in these 20 s.
    t.monthly_spend_cap_usd = Decimal("0.01")
    t.save()
    sent = []
    for second in range(0, 21):
        sent += _sent(scheduling.plan(NOW + timedelta(seconds=second)))
    assert ProbeSlot.objects.count() == 7
    assert len(sent) == 7
    assert spend.committed_by_task(NOW)[t.pk] == Decimal("0.0098")


def test_spend_never_passes_the_cap_across_ticks_with_probes_in_flight(world) -> None:
    t, routes, _ = world
    t.monthly_spend_cap_usd = Decimal("0.05")  # 35.7 probes' worth
    t.save()
    estimate = spend.probe_estimate_usd(t, routes[0])
    sent_total = 0
    for tick in range(0, 120):
        now = NOW + timedelta(seconds=tick)
        sent_total += len(_sent(scheduling.plan(now)))
        # Results come back two ticks after dispatch, each costing its estimate.
        for slot in ProbeSlot.objects.filter(
            status="dispatched", slot_at__lte=now - timedelta(seconds=2)
        ):
            ingest.ingest([f.payload(t, slot.route, slot.region, slot.slot_at)])
        committed = spend.committed_by_task(now).get(t.pk, Decimal("0"))
        assert committed <= t.monthly_spend_cap_usd, (tick, committed)
    ingest.sweep_missed(NOW + timedelta(minutes=10))
    spent = spend.spent_by_task(NOW)[t.pk]
    assert spent <= t.monthly_spend_cap_usd
    assert t.monthly_spend_cap_usd - spent < estimate  # it used the room it had
    assert sent_total == 35
    # Every page can say why probing stopped.
    state = spend.cap_states([t], NOW + timedelta(minutes=10))[t.pk]
    assert state.stopped
    assert "Probing stopped: monthly spend cap $0.05 reached" in state.reason


def test_a_route_whose_next_probe_fits_is_not_reported_paused(world) -> None:
    t, _, _ = world
    t.monthly_spend_cap_usd = Decimal("1.00")
    t.save()
    assert spend.cap_states([t], NOW) == {}


def test_a_scenario_slot_is_estimated_at_every_call_of_its_steps(world) -> None:
    t, routes, _ = world
    route = routes[0]  # $1/M input, $2/M output
    single = spend.probe_estimate_usd(t, route)
    assert single == Decimal("0.0014")  # 1000 in, 200 out
    ScenarioStep.objects.create(task=t, order=0, prompt_template="a", max_tokens=100)
    ScenarioStep.objects.create(
        task=t,
        order=1,
        kind=STEP_FAN_OUT,
        fan_out=3,
        prompt_template="b {previous}",
        max_tokens=50,
    )
    t = Task.objects.get(pk=t.pk)
    # Step 0: 1000 in, 100 out. Step 1: three calls of 1000 + 100 carried in, 50 out each.
    expected = (Decimal(1000) * 1 + 100 * 2 + 3 * (1100 * 1 + 50 * 2)) / Decimal(1_000_000)
    assert spend.probe_estimate_usd(t, route) == expected


def test_in_flight_spend_costs_the_same_few_queries_however_many_slots_are_open(
    world, django_assert_max_num_queries
) -> None:
    """The tick reads it every time: at 10,800 combinations a minute, 1,800 open slots made
    1,800 queries (one "has it steps?" each) and 2 s of a 3 s tick."""
    t, routes, regions = world
    for i in range(30):
        at = NOW + timedelta(seconds=i)
        for route in routes:
            ProbeSlot.objects.create(
                task=t, route=route, region=regions[0], slot_at=at, deadline_at=at
            )
    with django_assert_max_num_queries(8):
        in_flight = spend.in_flight_by_task()
    assert in_flight == {t.pk: Decimal("0.0014") * 90}
