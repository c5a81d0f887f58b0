"""Scheduled races: dispatched once, run against real routes of the simulator, stored once,
missed when no result arrives, paid for in the task's monthly spend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from monitor.models import EvalCase, RaceRun
from monitor.pipeline.beat import races, scheduling
from monitor.pipeline.ingest import races as ingest_races
from monitor.pipeline.messages import RUN_PROBE_BATCH, RUN_RACE
from monitor.pipeline.region import worker
from simulator.testing import SimulatorProcess
from tests.monitor import factories as f
from tests.sim_fixtures import OPENAI_KEY, sim  # noqa: F401 (fixture)

NOW = datetime(2026, 11, 2, 10, 0, 30, tzinfo=UTC)


def _world(settings):
    # A grace as long as the race interval: a new schedule's current race is never too late
    # to start (monitor.pipeline.beat.slots.starts_later), whatever its phase.
    settings.SLOT_GRACE_SECONDS = 300
    p = f.provider()
    routes = [f.route(p, f"m{i}") for i in range(3)]
    regions = [f.region(s) for s in ("eu-west", "us-east")]
    t = f.task("qa", routes, regions, probe_interval_s=60, race_interval_s=300)
    return t, routes, regions


@pytest.fixture
def world(db: None, settings):
    return _world(settings)


def test_a_race_is_dispatched_once_per_region_even_by_two_schedulers(world) -> None:
    first = races.claim(races.due_races(NOW, {}))
    second = races.claim(races.due_races(NOW, {}))
    assert len(first) == 2  # one per region
    assert second == []
    assert RaceRun.objects.filter(status="dispatched").count() == 2


def test_the_next_race_comes_one_interval_later(world) -> None:
    first = races.claim(races.due_races(NOW, {}))
    assert len(first) == 2
    # Each region's race has its own phase; the next comes 300 s after each one.
    earliest = min(at for _, _, at in first)
    latest = max(at for _, _, at in first)
    assert races.claim(races.due_races(earliest + timedelta(seconds=299), {})) == []
    later = races.claim(races.due_races(latest + timedelta(seconds=301), {}))
    assert len(later) == 2
    per_region = sorted(
        RaceRun.objects.filter(region=later[0][1]).values_list("slot_at", flat=True)
    )
    assert per_region[1] - per_region[0] == timedelta(seconds=300)


def test_a_task_without_a_race_interval_or_with_one_route_does_not_race(world) -> None:
    t, routes, _ = world
    t.routes.set(routes[:1])
    assert races.due_races(NOW, {}) == []
    t.routes.set(routes)
    t.race_interval_s = None
    t.save()
    assert races.due_races(NOW, {}) == []


def test_every_lane_of_a_race_sends_the_same_request(world) -> None:
    t, routes, regions = world
    EvalCase.objects.create(task=t, name="a", input="What is 12 * 12?", expected="144")
    EvalCase.objects.create(task=t, name="b", input="What is 13 * 13?", expected="169")
    cases = list(t.eval_cases.order_by("pk"))
    message = races.race_message(t, regions[0], NOW, cases, NOW)
    lanes = list(message["lanes"].values())
    assert set(message["lanes"]) == {str(r.pk) for r in routes}
    assert len({lane["user_prompt"] for lane in lanes}) == 1
    assert len({(lane["eval"] or {}).get("id") for lane in lanes}) == 1
    assert lanes[0]["eval"] is not None
    assert len({(lane["http2"], lane["body_encoding"], lane["cold"]) for lane in lanes}) == 1
    # The API key travels encrypted, never in the clear.
    assert all("secret" not in str(lane["provider"]["api_key_token"]) for lane in lanes)


def test_a_race_past_its_deadline_is_recorded_missed(world) -> None:
    t, _, _ = world
    claimed = races.claim(races.due_races(NOW, {}))
    # The deadline is the race's own slot time plus the probe deadline and the grace.
    last_deadline = max(races.deadline(t, at) for _, _, at in claimed)
    assert set(RaceRun.objects.values_list("deadline_at", flat=True)) == {
        races.deadline(t, at) for _, _, at in claimed
    }
    first_deadline = min(races.deadline(t, at) for _, _, at in claimed)
    assert ingest_races.sweep_missed(first_deadline - timedelta(seconds=1)) == 0
    assert ingest_races.sweep_missed(last_deadline + timedelta(seconds=1)) == 2
    assert set(RaceRun.objects.values_list("status", flat=True)) == {"missed"}


def test_a_spend_cap_stops_races_that_would_pass_it(world) -> None:
    t, _, _ = world
    t.monthly_spend_cap_usd = Decimal("0.01")
    t.save()
    estimate = races.race_cost_estimate(t, list(t.routes.all()))
    assert races.due_races(NOW, {t.pk: Decimal("0.01") - estimate / 2}) == []
    assert len(races.due_races(NOW, {t.pk: Decimal("0")})) == 2


@pytest.mark.django_db(transaction=True)
def test_a_race_against_real_routes_is_won_by_the_fastest_valid_answer_and_stored_once(
    sim: SimulatorProcess,  # noqa: F811
    client: Client,
    teammate: User,
) -> None:
    p = f.provider("fastchip", base_url=f"{sim.base_url}/fastchip/v1")
    p.set_api_key(OPENAI_KEY)
    p.save()
    fast = f.route(p, "fast-small")
    slow = f.route(p, "slow-large")
    region = f.region("local")
    t = f.task(
        "race", [fast, slow], [region], race_interval_s=60, max_tokens=100, probe_timeout_s=20
    )
    EvalCase.objects.create(
        task=t, name="m", input="What is 12 * 12?", grader="contains", expected="144"
    )
    t.user_template = "{input}"
    t.save()
    now = timezone.now()
    (claimed,) = races.claim(races.due_races(now, {}))
    message = races.race_message(*claimed, list(t.eval_cases.all()), now)

    result = worker.run_race(message)  # real HTTP to the simulator, as a region worker does
    assert result is not None

    assert result["winner_route_id"] == str(fast.pk), result
    lanes = result["lanes"]
    assert lanes[str(fast.pk)]["outcome"] == "ok"
    assert lanes[str(slow.pk)]["cancelled"] is True
    assert ingest_races.ingest(result) is True
    assert ingest_races.ingest(result) is False  # a redelivered result changes nothing
    run = RaceRun.objects.get()
    assert run.status == "done"
    assert run.winner == fast
    assert run.winner_ms is not None
    assert 0 < run.winner_ms < 5000
    assert run.cost_usd > 0
    assert run.cost_usd >= run.loser_cost_usd
    assert run.lanes[str(slow.pk)]["tokens_paid"] == run.loser_tokens
    # Races count toward the month's probe spend.
    assert scheduling.month_spend_by_task(now)[t.pk] == run.cost_usd
    # The races page calls the cancelled loser cancelled, never failed.
    client.force_login(teammate)
    body = client.get(reverse("rw-races"), {"task": "race"}).content.decode()
    slow_row = body[body.index(f'<tr data-route="{slow.pk}">') :].split("</tr>")[0]
    assert '<td class="num" data-cancelled>1</td>' in slow_row
    assert '<td class="num" data-failed>0</td>' in slow_row


def test_a_batchs_planned_start_is_stamped_after_the_races_are_planned(
    transactional_db: None, settings
) -> None:
    """What the tick does after stamping a batch's planned start is start lag for its first
    probes: races (claimed in the database) are planned before the batches are stamped. (Each
    claim its own transaction, so a race's started_at, now(), is when it was claimed.)"""
    _world(settings)
    dispatches = scheduling.plan(timezone.now())
    batches = [d.message for d in dispatches if d.task_name == RUN_PROBE_BATCH]
    raced = list(RaceRun.objects.values_list("started_at", flat=True))
    assert len(batches) == 2  # one per region
    assert len(raced) == 2
    assert all(b["planned_at"] >= max(raced).timestamp() for b in batches)
    # Still sent batches first, then the races.
    assert [d.task_name for d in dispatches] == [RUN_PROBE_BATCH] * 2 + [RUN_RACE] * 2
