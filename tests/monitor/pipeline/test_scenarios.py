"""Scenario tasks for real: the scheduler's messages, signed, through Redis to a region worker
process that has only the broker and its region key, which runs them with the engine against
the simulator; results signed back to an ingest worker process that stores them in PostgreSQL
and folds them into the rollups."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from monitor import tasks
from monitor.models import (
    GRAIN_HOUR,
    STEP_FAN_OUT,
    EvalCase,
    ProbeResult,
    ProbeSlot,
    RegionKey,
    Rollup,
    ScenarioResult,
    ScenarioStep,
    Task,
)
from monitor.pipeline.beat import scheduling
from simulator.testing import CONFIGS, SimulatorProcess
from tests import support
from tests.monitor import factories as f
from tests.sim_fixtures import OPENAI_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REGION = "r-scen"
Results = dict[int, ScenarioResult]


@dataclass
class World:
    loop: Task
    fan: Task
    failing: Task
    stalled: Task


def _world(sim: SimulatorProcess) -> tuple[World, str]:
    p = f.provider("fastchip", base_url=f"{sim.base_url}/fastchip/v1")
    p.set_api_key(OPENAI_KEY)
    p.save()
    route = f.route(p, "fast-small")
    region = f.region(REGION)
    region.keys.update(is_active=False)
    key, secret = RegionKey.issue(region)

    def _scenario(slug: str, steps: list[dict[str, Any]], **kw: Any) -> Task:
        t = f.task(slug, [route], [region], probe_interval_s=30, **kw)
        for i, step in enumerate(steps):
            ScenarioStep.objects.create(task=t, order=i, **step)
        return t

    loop = _scenario(
        "agent-loop",
        [
            {
                "prompt_template": f"Step {{step}}: read the result and act ({i}).",
                "input_tokens": 3000,
                "max_tokens": 30,
            }
            for i in range(9)
        ]
        + [{"prompt_template": "{input}", "max_tokens": 80}],
        probe_timeout_s=60,
    )
    EvalCase.objects.create(
        task=loop, name="m", input="What is 12 * 3?", grader="numeric", expected="36"
    )
    fan = _scenario(
        "fan-merge",
        [
            {
                "prompt_template": "Part {branch}. [sim-delay-ms: {branch}00]",
                "kind": STEP_FAN_OUT,
                "fan_out": 5,
                "max_tokens": 20,
                "carry_context": False,
            },
            {"prompt_template": "Merge: {previous}", "max_tokens": 20, "carry_context": False},
        ],
        probe_timeout_s=30,
    )
    failing = _scenario(
        "failing",
        [
            {"prompt_template": "Plan.", "max_tokens": 20},
            {"prompt_template": "Call the tool.", "max_tokens": 20},
            {"prompt_template": "Read it. [sim-fault: http_500]", "max_tokens": 20},
            {"prompt_template": "Answer.", "max_tokens": 20},
        ],
        probe_timeout_s=30,
    )
    stalled = _scenario(
        "stalled",
        [
            {"prompt_template": "Plan.", "max_tokens": 20},
            {"prompt_template": "Wait. [sim-fault: stall_headers]", "max_tokens": 20},
            {"prompt_template": "Answer.", "max_tokens": 20},
        ],
        probe_timeout_s=5,
    )
    return World(loop, fan, failing, stalled), f"{key.key_id}:{secret}"


def _worker_env(keys: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE", "EMAIL"))}
    for name in ("SECRET_KEY", "FIELD_ENCRYPTION_KEYS", "DATABASE_URL", "EMAIL_HOST_PASSWORD"):
        env.pop(name, None)
        env.pop(f"{name}_FILE", None)
    env.update(
        RW_WORKER_ONLY="true",
        RW_REGION=REGION,
        RW_REGION_KEYS=keys,
        PROVIDER_ALLOW_PRIVATE_NETWORKS="true",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def ran(tmp_path: Path) -> Iterator[tuple[World, Results]]:
    """Every scenario task's slot planned by the scheduler, run and ingested for real."""
    with SimulatorProcess(CONFIGS / "test.toml") as sim:
        world, keys = _world(sim)
        procs = [
            support.start(
                support.celery(
                    "worker", "-Q", "ingest,default", "-c", "2", "-n", "in@%h", "-l", "INFO"
                ),
                support.child_env(connection.settings_dict),
                tmp_path / "ingest.log",
            ),
            support.start(
                support.region_worker(REGION, "rw@%h"),
                _worker_env(keys),
                tmp_path / "region.log",
            ),
        ]
        try:
            sent = tasks.send(scheduling.plan(timezone.now()))
            assert sent == {REGION: 4}

            def done() -> bool:
                connection.close()
                return ScenarioResult.objects.count() == 4

            logs = lambda: "\n".join(p.read_text()[-3000:] for p in tmp_path.glob("*.log"))  # noqa: E731
            assert support.wait_until(done, 90, interval_s=0.5), logs()
            yield world, {r.task_id: r for r in ScenarioResult.objects.all()}
        finally:
            for proc in procs:
                support.stop(proc)


def _ten_sequential_calls_are_stored_and_add_up(world: World, results: Results) -> None:
    loop = results[world.loop.pk]
    calls = list(ProbeResult.objects.filter(scenario=loop).order_by("step"))

    assert loop.outcome == "ok", loop.error_detail
    assert [c.step for c in calls] == list(range(10))
    assert all(c.slot_at is None and not c.reference for c in calls)
    assert loop.call_count == 10
    # The app e2e is the calls' e2e plus the measured gaps and the validation, within 5 ms per
    # call, as stored.
    assert loop.app_e2e_ms is not None
    assert loop.validation_ms is not None
    accounted = sum(c.e2e_ms or 0 for c in calls) + sum(loop.gaps_ms) + loop.validation_ms
    assert abs(loop.app_e2e_ms - accounted) <= 5.0 * len(calls)
    # The final step answered the eval case's question, and validation passed.
    assert loop.validation_pass is True
    assert calls[-1].text.rstrip().endswith("ANSWER: 36")
    # Later calls read the earlier ones' prefix from the cache, and start sooner.
    assert calls[0].cached_tokens == 0
    assert all((c.cached_tokens or 0) >= 3000 - 256 for c in calls[1:9])
    assert calls[0].ttft_ms is not None
    assert max(c.ttft_ms or 0 for c in calls[1:9]) < calls[0].ttft_ms
    # Tokens and cost are the calls' own.
    assert loop.input_tokens == sum(c.input_tokens or 0 for c in calls)
    assert loop.output_tokens == sum(c.output_tokens or 0 for c in calls)
    # The slot is done; the rollup holds one scenario with its app e2e.
    slot = ProbeSlot.objects.get(task=world.loop)
    assert slot.status == "done"
    rollup = Rollup.objects.get(task=world.loop, grain=GRAIN_HOUR, region__isnull=False)
    assert rollup.count_ok == 1
    assert rollup.graded == 1
    assert rollup.passed == 1
    assert sum(rollup.app_e2e_hist[1::2]) == 1
    assert rollup.e2e_hist == []  # calls are not the task's probes


def _a_fan_out_of_five_waits_for_its_slowest_branch(world: World, results: Results) -> None:
    fan = results[world.fan.pk]
    calls = list(ProbeResult.objects.filter(scenario=fan).order_by("step", "started_at"))

    assert fan.outcome == "ok", fan.error_detail
    branches, merge = calls[:5], calls[5]
    ends = [c.started_at.timestamp() * 1000 + (c.e2e_ms or 0) for c in branches]
    starts = [c.started_at.timestamp() * 1000 for c in branches]
    assert max(starts) - min(starts) < 50  # in parallel
    assert max(ends) - min(ends) > 300  # one branch was clearly the slowest
    merge_start = merge.started_at.timestamp() * 1000
    assert merge_start >= max(ends) - 1  # the merge waited for it (microsecond times)
    assert merge_start - max(ends) < 50


def _a_failing_step_ends_the_scenario_with_that_step_named(world: World, results: Results) -> None:
    failing = results[world.failing.pk]

    assert failing.outcome == "error"
    assert failing.failed_step == 2
    assert failing.error_kind == "http_5xx"
    assert failing.error_detail.startswith("step 3 failed")
    assert ProbeResult.objects.filter(scenario=failing).count() == 3
    rollup = Rollup.objects.get(task=world.failing, grain=GRAIN_HOUR, region__isnull=False)
    assert rollup.count_error == 1
    assert rollup.error_kinds == {"http_5xx": 1}
    assert rollup.app_e2e_hist == []


def _a_stalled_step_ends_within_the_scenario_deadline(world: World, results: Results) -> None:
    stalled = results[world.stalled.pk]

    assert stalled.outcome == "error"
    assert stalled.failed_step == 1
    assert stalled.error_kind == "timeout_headers"
    assert stalled.app_e2e_ms is not None
    assert stalled.app_e2e_ms <= 5000 + 100
    # It ended in time: its result was stored, the slot is done, not missed.
    assert ProbeSlot.objects.get(task=world.stalled).status == "done"


def test_scenario_slots_run_on_a_region_worker_and_are_stored_with_their_calls(
    ran: tuple[World, Results],
) -> None:
    # One run of the whole stack (workers take seconds to start) for the four scenarios.
    world, results = ran
    _ten_sequential_calls_are_stored_and_add_up(world, results)
    _a_fan_out_of_five_waits_for_its_slowest_branch(world, results)
    _a_failing_step_ends_the_scenario_with_that_step_named(world, results)
    _a_stalled_step_ends_within_the_scenario_deadline(world, results)
