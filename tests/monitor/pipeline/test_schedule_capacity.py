"""A region keeps its schedule at real-world latency: routes as slow as reasoning models (a
minute to the first token), scenarios of many calls, and a worker killed with hundreds of
probes in flight. Real processes: beat, an ingest worker, a region worker on the threads pool
(monitor.limits.region_worker_args), Redis, PostgreSQL and the simulator."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from devstack.stack import SERVER_ONLY_SECRETS
from monitor import tasks
from monitor.models import (
    ProbeResult,
    ProbeSlot,
    Provider,
    RegionKey,
    ScenarioResult,
    ScenarioStep,
    Task,
)
from monitor.pipeline.beat import scenarios, scheduling
from monitor.pipeline.beat.slots import Slot, probe_message
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.messages import ProbeBatch, probe_batch_to_json
from monitor.pipeline.region import liveness, worker
from monitor.stats import health
from simulator.testing import CONFIGS, SimulatorProcess
from tests import support
from tests.monitor import factories as f
from tests.processes import ProcessStack, running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.fault]

REGION = "r-slow"
SLOW_KEY = "sk-test-slowlane-0123456789"
FAST_KEY = "sk-test-fastchip-0123456789"
FAST_MODELS = ("fast-small", "mid-think", "slow-large")


def _providers(
    sim: SimulatorProcess, slug: str, n: int, key: str, name: str = ""
) -> list[Provider]:
    """n providers on one simulated provider (a route is one provider's model)."""
    out = []
    for i in range(n):
        p = f.provider(f"{name or slug}{i}", base_url=f"{sim.base_url}/{slug}/v1")
        p.set_api_key(key)
        p.save()
        out.append(p)
    return out


def _region_keys() -> tuple[Any, str]:
    region = f.region(REGION)
    region.keys.update(is_active=False)
    key, secret = RegionKey.issue(region)
    return region, f"{key.key_id}:{secret}"


def _region_env(keys: str) -> dict[str, str]:
    return {
        **dict.fromkeys(SERVER_ONLY_SECRETS, ""),
        "RW_WORKER_ONLY": "true",
        "RW_REGION": REGION,
        "RW_REGION_KEYS": keys,
        "DATABASE_URL": "",
    }


def _fresh() -> None:
    connection.close()


def _one_row_per_slot() -> bool:
    per_slot = (
        ProbeResult.objects.filter(slot_at__isnull=False)
        .values("task_id", "route_id", "region_id", "slot_at")
        .annotate(n=Count("id"))
    )
    return all(row["n"] == 1 for row in per_slot)


# --- a slow route and a slow scenario beside fast routes --------------------------------------


@pytest.fixture
def slow_and_fast(tmp_path: Path) -> Iterator[tuple[ProcessStack, dict[str, Task], datetime]]:
    """Beat ticking every second; one task with a route that takes a minute to answer and 20
    fast routes, every 10 s; a 10-call scenario on a route that takes 5 s a call."""
    with SimulatorProcess(CONFIGS / "test.toml") as sim:
        region, keys = _region_keys()
        slow = f.route(_providers(sim, "slowlane", 1, SLOW_KEY)[0], "reasoner-60s")
        fast = [
            f.route(p, model)
            for p in _providers(sim, "fastchip", 7, FAST_KEY)
            for model in FAST_MODELS
        ][:20]
        mixed = f.task("mixed", [slow, *fast], [region], probe_interval_s=10, probe_timeout_s=120)
        agent_route = f.route(_providers(sim, "slowlane", 1, SLOW_KEY, "agentic")[0], "reasoner-5s")
        # Its schedule's first slot could be up to an interval away: the test plans one now.
        agent = f.task("agent", [agent_route], [region], probe_interval_s=3600, probe_timeout_s=300)
        for i in range(10):
            ScenarioStep.objects.create(
                task=agent, order=i, prompt_template=f"Step {i}: act.", max_tokens=20
            )
        env = support.child_env(
            connection.settings_dict,
            TICK_SECONDS="1",
            # Room for a tick delayed by a busy machine: a late tick is not what this tests.
            SLOT_GRACE_SECONDS="30",
            PROVIDER_ALLOW_PRIVATE_NETWORKS="true",
        )
        with running(ProcessStack(tmp_path, env)) as s:
            s.start("ingest", support.celery("worker", "-Q", "schedule,ingest,default", "-c", "2"))
            s.start("region", support.region_worker(REGION, "rw@%h"), _region_env(keys))
            s.start("beat", support.celery("beat", "-s", str(tmp_path / "beat.schedule")))
            assert support.wait_until(lambda: "ready" in s.log("region"), 30), s.logs()
            slot = Slot(agent, agent_route, region, timezone.now())
            assert scheduling.claim([slot]) == [slot]
            assert tasks.send(scenarios.dispatches([slot], {}, timezone.now())) == {REGION: 1}
            # (Beat may add a slot of its own to the scenario's schedule when its phase falls
            # within the test: the test judges this one.)
            yield s, {"mixed": mixed, "agent": agent}, slot.slot_at


def test_a_minute_long_probe_and_a_long_scenario_delay_no_other_probe(
    slow_and_fast: tuple[ProcessStack, dict[str, Task], datetime],
) -> None:
    stack, world, agent_at = slow_and_fast
    mixed, agent = world["mixed"], world["agent"]
    slow_route = mixed.routes.get(model_id="reasoner-60s")

    def slow_answered() -> bool:
        _fresh()
        return ProbeResult.objects.filter(route=slow_route, outcome="ok").exists()

    def scenario_done() -> bool:
        _fresh()
        return ScenarioResult.objects.filter(task=agent, slot_at=agent_at).exists()

    assert support.wait_until(slow_answered, 150, interval_s=1), stack.logs()
    assert support.wait_until(scenario_done, 90, interval_s=1), stack.logs()
    stack.stop("beat")

    first = ProbeResult.objects.filter(route=slow_route, outcome="ok").earliest("started_at")
    assert first.e2e_ms is not None
    assert first.e2e_ms >= 60_000
    ran_from = first.started_at
    ran_to = ran_from + timedelta(milliseconds=first.e2e_ms)

    # Every fast slot planned while the slow probe ran was probed: none missed, none late,
    # each started while the slow one was still running, its start lag recorded.
    def closed() -> bool:
        _fresh()
        ingest.sweep_missed()
        return (
            not ProbeSlot.objects.filter(task=mixed, slot_at__lte=ran_to, status="dispatched")
            .exclude(route=slow_route)
            .exists()
        )

    assert support.wait_until(closed, 90, interval_s=1), stack.logs()
    # Slots due while it ran (a slot is sent within a tick of its time, and starts within the
    # tick's spread after that: the last seconds' slots may start after it ended).
    during = ProbeResult.objects.filter(
        task=mixed, slot_at__gte=ran_from, slot_at__lte=ran_to - timedelta(seconds=3)
    ).exclude(route=slow_route)
    outcomes = Counter(during.values_list("outcome", flat=True))
    why = sorted(set(during.filter(outcome="missed").values_list("error_detail", flat=True)))
    assert outcomes["missed"] == 0, (outcomes, why)
    assert outcomes["ok"] >= 20 * 5, outcomes  # 20 routes, a slot each every 10 s, 57 s
    assert during.filter(started_at__gte=ran_from, started_at__lte=ran_to).count() == sum(
        outcomes.values()
    )
    assert not during.filter(start_lag_ms__isnull=True).exists()
    missed = ProbeResult.objects.filter(task=mixed, outcome="missed")
    assert not missed.exists(), (
        list(missed.values_list("slot_at", "start_lag_ms", "error_detail")),
        [line for line in stack.log("region").splitlines() if "xpired" in line or "evoked" in line],
    )

    # The scenario ran all its calls to the end, on the same worker, meanwhile.
    scenario = ScenarioResult.objects.get(task=agent, slot_at=agent_at)
    calls = ProbeResult.objects.filter(scenario=scenario).order_by("step")
    assert scenario.outcome == "ok", scenario.error_detail
    assert [c.step for c in calls] == list(range(10))
    assert scenario.app_e2e_ms is not None
    assert scenario.app_e2e_ms >= 50_000
    assert ProbeSlot.objects.get(task=agent, slot_at=agent_at).status == "done"
    overlapping = ProbeResult.objects.filter(
        task=mixed, started_at__gte=scenario.started_at, outcome="ok"
    ).exclude(route=slow_route)
    assert (
        overlapping.filter(
            started_at__lte=scenario.started_at + timedelta(milliseconds=scenario.app_e2e_ms)
        ).count()
        >= 20 * 4
    )

    # The region's health agrees with the raw rows: every live slot counted once.
    _fresh()
    schedule = health.schedules(ran_from + timedelta(hours=1), timedelta(hours=2))[
        mixed.regions.get().pk
    ]
    results = ProbeResult.objects.filter(slot_at__isnull=False, generated=False)
    scenarios = ScenarioResult.objects.count()
    assert schedule.probed == results.exclude(outcome="missed").count() + scenarios
    assert schedule.missed == results.filter(outcome="missed").count()
    assert (
        schedule.lag_samples
        == results.filter(start_lag_ms__isnull=False, outcome__in=["ok", "error"]).count()
    )
    print(
        f"\n[figure] slow route: {sum(outcomes.values())} fast slots during its "
        f"{first.e2e_ms / 1000:.0f} s probe, 0 missed; scenario {scenario.app_e2e_ms / 1000:.0f} s "
        f"over 10 calls; start lag p50 {schedule.lag_ms(50)} ms, p99 {schedule.lag_ms(99)} ms"
    )


# --- a worker killed with hundreds of probes in flight -----------------------------------------


def test_a_worker_killed_with_hundreds_of_probes_in_flight_keeps_what_ended_and_nothing_twice(
    tmp_path: Path, settings: Any
) -> None:
    """300 probes of 20 s and 45 fast ones in one batch; the whole worker is SIGKILLed while the
    slow ones are in flight. The fast results it had already sent are kept, every other slot
    is recorded missed at its deadline, no slot has two rows, and a new worker carries on."""
    # This process plans the slots (scheduling.plan): every probe of the batch starts within
    # 2 s, and each slot's current time (up to an interval ago) is still in time.
    settings.SLOT_GRACE_SECONDS = 25
    settings.TICK_SECONDS = 2
    with SimulatorProcess(CONFIGS / "test.toml") as sim:
        region, keys = _region_keys()
        slow = [f.route(p, "reasoner-20s") for p in _providers(sim, "slowlane", 20, SLOW_KEY)]
        fast_provider = _providers(sim, "fastchip", 1, FAST_KEY)[0]
        fast = [f.route(fast_provider, m) for m in FAST_MODELS]
        for t in range(15):
            f.task(f"load-{t}", [*slow, *fast], [region], probe_interval_s=20, probe_timeout_s=30)
        env = support.child_env(
            connection.settings_dict, TICK_SECONDS="2", PROVIDER_ALLOW_PRIVATE_NETWORKS="true"
        )
        with running(ProcessStack(tmp_path, env)) as s:
            s.start("ingest", support.celery("worker", "-Q", "schedule,ingest,default", "-c", "2"))
            s.start("region", support.region_worker(REGION, "rw@%h"), _region_env(keys))
            assert support.wait_until(lambda: "ready" in s.log("region"), 30), s.logs()
            # Only the slots whose time has come (none claimed ahead): all in flight at once.
            sent = tasks.send(scheduling.plan(ahead_s=0))
            assert sent.get(REGION) == 15 * 23, sent

            def carrying() -> int:
                beacons = (liveness.live_workers() or {}).get(REGION, [])
                return max((b["in_flight"] for b in beacons), default=0)

            def fast_ones_stored() -> bool:
                _fresh()
                return ProbeResult.objects.filter(outcome="ok").count() >= 45

            assert support.wait_until(fast_ones_stored, 20, interval_s=0.2), s.logs()
            assert support.wait_until(lambda: carrying() >= 250, 10, interval_s=0.2), s.logs()
            in_flight = carrying()
            kept_before = set(
                ProbeResult.objects.filter(outcome="ok").values_list("route_id", "task_id")
            )
            os.killpg(s.procs["region"].pid, signal.SIGKILL)
            s.procs["region"].wait()
            killed = time.monotonic()
            s.restart("region")  # a new worker: the killed one's batch is not run again

            def closed() -> bool:
                _fresh()
                ingest.sweep_missed()
                return not ProbeSlot.objects.filter(status="dispatched").exists()

            assert support.wait_until(closed, 60, interval_s=0.5), s.logs()
            recovery_s = time.monotonic() - killed
            statuses = Counter(ProbeSlot.objects.values_list("status", flat=True))
            outcomes = Counter(ProbeResult.objects.values_list("outcome", flat=True))
            kept_after = set(
                ProbeResult.objects.filter(outcome="ok").values_list("route_id", "task_id")
            )
            assert kept_before <= kept_after  # nothing stored before the kill was lost
            assert _one_row_per_slot()
            assert ProbeResult.objects.count() == ProbeSlot.objects.count() == 15 * 23
            assert set(statuses) <= {"done", "missed"}
            # The slow probes were cut off mid-flight: their slots are missed, not duplicated.
            assert outcomes["ok"] >= 45, outcomes
            assert outcomes["missed"] >= 200, outcomes
            print(
                f"\n[figure] worker SIGKILL with {in_flight} probes in flight: "
                f"{outcomes['ok']} results kept, {outcomes['missed']} slots missed, 0 duplicates; "
                f"all {sum(statuses.values())} slots closed {recovery_s:.1f} s after the kill"
            )


# --- a probe too late to count -----------------------------------------------------------------


@pytest.mark.django_db
def test_a_probe_past_its_start_bound_is_not_sent_and_its_slot_is_missed_with_its_lag() -> None:
    """A batch that reaches its worker 30 s after the tick planned it (a backed-up queue): the
    worker sends nothing for it, and ingest records its slot missed, with the lag, as late."""
    g, _ = _region_keys()
    p = f.provider("nowhere", base_url="http://127.0.0.1:9/nowhere/v1")  # never connected to
    r = f.route(p, "m1")
    t = f.task("late", [r], [g], probe_timeout_s=60)
    slot = Slot(t, r, g, timezone.now())
    scheduling.claim([slot])
    batch: ProbeBatch = {
        "region": g.slug,
        "probes": [probe_message(slot, [])],
        "planned_at": time.time() - 30,
        "window_s": 0.0,
    }
    (sent,) = worker.run_batch(probe_batch_to_json(batch))
    assert sent["outcome"] == "missed"
    assert (sent.get("start_lag_ms") or 0) >= 30_000
    assert sent.get("error_detail", "").startswith("started late: 30.")
    assert worker.LOAD.late >= 1
    assert ingest.ingest([sent]) == 1
    assert ProbeSlot.objects.get(task=t).status == "missed"
    schedule = health.schedules(timezone.now(), timedelta(hours=1))[g.pk]
    assert (schedule.probed, schedule.missed, schedule.late) == (0, 1, 1)


# --- slots claimed ahead, a batch that comes late ----------------------------------------------


def test_a_probe_claimed_ahead_starts_at_its_slots_time_however_late_its_batch_comes(
    settings: Any,
) -> None:
    """The tick claims slots ahead of their time; this batch reaches the worker 3 s after the
    tick planned it (a slow tick, a queue's wait). A probe whose slot's time was still to come
    starts at that time, never before it, with its lag measured from it; one whose time came
    while the batch waited has the wait as its lag; one already due when the tick planned the
    batch starts from then. Every slot ends with its result, none missed."""
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = True
    with SimulatorProcess(CONFIGS / "test.toml") as sim:
        g, _ = _region_keys()
        p = _providers(sim, "fastchip", 1, FAST_KEY)[0]
        r = f.route(p, "fast-small")
        t = f.task("ahead", [r], [g], probe_interval_s=60, probe_timeout_s=30)
        planned_at = time.time()
        at = [
            timezone.now() + timedelta(seconds=s) for s in (-2, 1, 4, 5.5, 7)
        ]  # due, due while waiting, three to come
        claimed = [Slot(t, r, g, a) for a in at]
        assert scheduling.claim(claimed) == claimed
        batch: ProbeBatch = {
            "region": g.slug,
            "probes": [probe_message(s, []) for s in claimed],
            "planned_at": planned_at,
            "window_s": 2.0,
            "at_slots": True,
        }
        time.sleep(max(0.0, planned_at + 3 - time.time()))
        came_at = time.time()
        sent = worker.run_batch(probe_batch_to_json(batch))
    assert [s["outcome"] for s in sent] == ["ok"] * 5, sent
    by_slot = {s["slot_at"]: s for s in sent}
    for when in at:
        out = by_slot[when.isoformat()]
        slot_s = when.timestamp()
        started_s = datetime.fromisoformat(out["started_at"]).timestamp()
        lag_s = (out.get("start_lag_ms") or 0) / 1000
        if slot_s > came_at:  # to come: started at its time, not on arrival
            assert started_s >= slot_s - 0.01, (when, started_s - slot_s)
            assert lag_s == pytest.approx(started_s - slot_s, abs=0.1)
        elif slot_s >= planned_at:  # came while the batch waited: the wait is its lag
            assert lag_s >= came_at - slot_s - 0.01
        else:  # already due when planned: from the tick's plan, first of the spread
            assert lag_s >= came_at - planned_at - 0.01
    assert ingest.ingest(sent) == 5
    assert set(ProbeSlot.objects.filter(task=t).values_list("status", flat=True)) == {"done"}
