from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise

import pytest

from monitor.models import ProbeSlot, ScenarioStep
from monitor.pipeline.beat import scheduling, slots
from monitor.pipeline.ingest import results as ingest
from monitor.stats import spend
from tests.monitor import factories as f

NOW = datetime(2026, 11, 2, 10, 0, 30, tzinfo=UTC)


@pytest.fixture
def world(db: None):
    p = f.provider()
    routes = [f.route(p, f"m{i}") for i in range(3)]
    regions = [f.region(s) for s in ("eu-west", "us-east")]
    t = f.task("qa", routes, regions, probe_interval_s=60)
    return t, routes, regions


def test_each_slot_is_claimed_once_even_by_two_schedulers(world) -> None:
    slots = scheduling.due_slots(NOW)
    assert len(slots) == 6
    first = scheduling.claim(slots)
    second = scheduling.claim(scheduling.due_slots(NOW))
    assert len(first) == 6
    assert second == []
    assert ProbeSlot.objects.count() == 6


def test_starts_are_spread_across_the_interval(world) -> None:
    slots = scheduling.due_slots(NOW)
    offsets = {s.slot_at.second + s.slot_at.microsecond / 1e6 for s in slots}
    assert len(offsets) == 6  # six different phases, not one burst


def test_frequent_ticks_make_exactly_one_slot_per_interval(world) -> None:
    for second in range(0, 61, 5):
        scheduling.claim(scheduling.due_slots(NOW + timedelta(seconds=second)))
    # By NOW+60 every (task, route, region) has its slot of this interval and of the next one.
    assert ProbeSlot.objects.count() == 12
    for key in {(s.task_id, s.route_id, s.region_id) for s in ProbeSlot.objects.all()}:
        times = sorted(
            ProbeSlot.objects.filter(task_id=key[0], route_id=key[1], region_id=key[2]).values_list(
                "slot_at", flat=True
            )
        )
        assert times[1] - times[0] == timedelta(seconds=60)


def test_probe_slots_are_claimed_ahead_of_their_time_once_and_a_scenarios_only_when_due(
    world,
) -> None:
    t, routes, regions = world
    t.probe_interval_s = 10
    t.save()
    agent = f.task("agent", routes[:1], regions[:1], probe_interval_s=10)
    ScenarioStep.objects.create(task=agent, order=0, prompt_template="Act.", max_tokens=20)
    ahead = timedelta(seconds=20)
    for second in range(0, 31, 5):  # ticks every 5 s, each claiming 20 s ahead
        at = NOW + timedelta(seconds=second)
        claimed = scheduling.claim(scheduling.due_slots(at, ahead_s=20))
        assert all(s.slot_at <= at + ahead for s in claimed)
        assert all(s.slot_at <= at for s in claimed if s.task == agent)
    # Every probe combination has each of its slots up to NOW + 50, every 10 s, once; the
    # scenario's only up to NOW + 30.
    for key in {(s.task_id, s.route_id, s.region_id) for s in ProbeSlot.objects.all()}:
        times = sorted(
            ProbeSlot.objects.filter(task_id=key[0], route_id=key[1], region_id=key[2]).values_list(
                "slot_at", flat=True
            )
        )
        assert all(b - a == timedelta(seconds=10) for a, b in pairwise(times))
        horizon = NOW + timedelta(seconds=30) + (ahead if key[0] == t.pk else timedelta(0))
        assert horizon - timedelta(seconds=10) < times[-1] <= horizon


def test_slots_skipped_while_the_scheduler_was_down_become_missed(world) -> None:
    scheduling.claim(scheduling.due_slots(NOW))
    later = NOW + timedelta(minutes=10)
    caught_up = scheduling.claim(scheduling.due_slots(later))
    assert len(caught_up) == 6 * 10
    ingest.sweep_missed(now=later + timedelta(minutes=5))
    assert ProbeSlot.objects.filter(status="missed").count() >= 6 * 8


def test_a_new_schedule_starts_with_a_slot_it_can_still_make(world, settings) -> None:
    settings.SLOT_GRACE_SECONDS, settings.TICK_SECONDS = 3, 1
    t, _, _ = world
    t.probe_interval_s, t.probe_timeout_s = 60, 5
    t.save()
    # Each (route, region) has its own phase in the minute: at NOW, the current slots more
    # than the 3 s grace in the past are not created (they could not get their whole 5 s
    # probe deadline); the next ones are, by one of the ticks that follow (one a second).
    grace = timedelta(seconds=3)
    first = scheduling.claim(scheduling.due_slots(NOW))
    assert all(NOW - s.slot_at <= grace for s in first)
    assert len(first) < 6  # six phases spread over 60 s: some are more than 3 s old
    for second in range(1, 61):
        at = NOW + timedelta(seconds=second)
        assert all(at - s.slot_at <= grace for s in scheduling.claim(scheduling.due_slots(at)))
    combos = {(s.task_id, s.route_id, s.region_id) for s in ProbeSlot.objects.all()}
    assert len(combos) == 6  # every combination has begun within one interval
    # Once begun, a gap is still caught up and recorded missed, never silently absent.
    much_later = NOW + timedelta(minutes=6)
    caught_up = scheduling.claim(scheduling.due_slots(much_later))
    assert len(caught_up) >= 6 * 4
    ingest.sweep_missed(now=much_later + timedelta(seconds=10))
    assert ProbeSlot.objects.filter(status="missed").count() >= 6 * 4


def test_with_ticks_rarer_than_the_grace_a_late_first_slot_is_created_all_the_same(
    world, settings
) -> None:
    settings.SLOT_GRACE_SECONDS, settings.TICK_SECONDS = 3, 30
    t, _, _ = world
    t.probe_interval_s, t.probe_timeout_s = 60, 5
    t.save()
    # Ticks 30 s apart cannot be sure to catch a slot within its 3 s grace: skipping could
    # mean a schedule that never starts, so every first slot is created (late ones go missed).
    assert len(scheduling.claim(scheduling.due_slots(NOW))) == 6


def test_a_spend_cap_stops_probing_a_route(world) -> None:
    t, routes, _ = world
    t.monthly_spend_cap_usd = Decimal("0.01")
    t.save()
    cost = spend.probe_estimate_usd(t, routes[0])
    assert not spend.would_pass_cap(t, {}, cost)
    assert spend.would_pass_cap(t, {t.pk: Decimal("0.01")}, cost)
    assert not spend.would_pass_cap(t, {t.pk: Decimal("0.01") - cost}, cost)
    # A month of spend in the rollups: the scheduler skips the task's routes.
    ingest.ingest(
        [f.payload(t, routes[0], t.regions.first(), NOW - timedelta(minutes=i)) for i in range(10)]
    )
    assert scheduling.due_slots(NOW) == []


def test_a_probe_message_carries_no_plaintext_key(world) -> None:
    t, routes, regions = world
    slot = slots.Slot(t, routes[0], regions[0], NOW)
    message = slots.probe_message(slot, [])
    assert "sk-acme-secret" not in str(message)  # the factory's key, in the clear
    assert message["provider"]["api_key_token"]
    assert message["slot"]["slot_at"] == NOW.isoformat()


def test_options_a_provider_cannot_take_are_never_sent_to_it(db: None) -> None:
    plain = f.provider("plain")
    capable = f.provider("capable", http2=True, accepts_msgpack=True)
    routes = [f.route(plain, "chat"), f.route(capable, "chat")]
    g = f.region("eu-west")
    t = f.task(
        "qa",
        routes,
        [g],
        http_versions=["1.1", "2"],
        body_encodings=["json", "msgpack-gzip"],
    )
    sent: dict[str, set[tuple[bool, str]]] = {"plain": set(), "capable": set()}
    for n in range(8):  # two full cycles of the four combinations
        for route in routes:
            message = slots.probe_message(slots.Slot(t, route, g, NOW), [], n=n)
            sent[route.provider.slug].add((message["http2"], message["body_encoding"]))
    assert sent["plain"] == {(False, "json")}
    assert sent["capable"] == {
        (False, "json"),
        (False, "msgpack-gzip"),
        (True, "json"),
        (True, "msgpack-gzip"),
    }


def test_a_probe_message_carries_the_routes_request_settings_with_headers_encrypted(
    db: None,
) -> None:
    r = f.route(
        f.provider(),
        "gpt-5.5",
        token_limit_param="max_completion_tokens",
        reasoning_effort="low",
        service_tier="flex",
        extra_body={"response_format": {"type": "json_object"}},
    )
    r.set_secret_headers({"x-gateway-key": "gw-secret-0123456789"})
    r.save()
    g = f.region("eu-west")
    t = f.task("qa", [r], [g])
    message = slots.probe_message(slots.Slot(t, r, g, NOW), [], n=0)
    request = message["request"]
    assert request["token_limit_param"] == "max_completion_tokens"
    assert request["reasoning_effort"] == "low"
    assert request["service_tier"] == "flex"
    assert request["temperature"] is None  # not sent
    assert request["thinking_budget_tokens"] is None
    assert request["extra_body"] == {"response_format": {"type": "json_object"}}
    assert request["secret_headers_token"] == r.secret_headers_encrypted
    assert "gw-secret-0123456789" not in repr(message)


def test_reasoning_routes_get_room_to_reason_on_top_of_the_answer_bound(db: None) -> None:
    p = f.provider()
    chat = f.route(p, "chat")
    reasoning = f.route(p, "gpt-5.5", token_limit_param="max_completion_tokens")
    claude = f.route(
        f.provider("claude", wire_format="anthropic"), "claude", thinking_budget_tokens=2048
    )
    g = f.region("eu-west")
    t = f.task("qa", [chat, reasoning, claude], [g], max_tokens=300)
    sent = {
        r.model_id: slots.probe_message(slots.Slot(t, r, g, NOW), [], n=0)["max_tokens"]
        for r in (chat, reasoning, claude)
    }
    # Anthropic counts thinking within max_tokens, which must exceed the budget; OpenAI
    # reasoning models count hidden reasoning within max_completion_tokens.
    assert sent == {"chat": 300, "gpt-5.5": 300 + 25_000, "claude": 300 + 2048}


def _spend_reads(world, now: datetime) -> list[str]:
    """The statements a tick's plan ran that read rollups or open slots' costs."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        dispatches = scheduling.plan(now)
    assert dispatches, "the tick sent nothing"
    return [
        q["sql"]
        for q in queries.captured_queries
        if "monitor_rollup" in q["sql"] or "COUNT(" in q["sql"].upper()
    ]


def test_a_tick_reads_no_spend_when_no_task_has_a_cap(world) -> None:
    """Spent, in-flight and recent usage are read only to check a cap: three reads a tick over
    the month's rollups and every open slot, for nothing, when no task has one."""
    task, routes, regions = world
    ingest.ingest([f.payload(task, routes[0], regions[0], NOW - timedelta(minutes=5))])
    assert _spend_reads(world, NOW) == []

    task.monthly_spend_cap_usd = Decimal("100")
    task.save()
    assert _spend_reads(world, NOW + timedelta(minutes=1))  # the cap is checked
