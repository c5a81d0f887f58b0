"""Scenarios through the real engine against the simulator (probes/scenario.py).

Every figure is held against something measured apart from it: the scenario's own clock
against the calls' and gaps' sums, the simulator's prefill rate against the TTFT drop of
cached calls, the calls' offsets against the slowest branch's end.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from probes import ProbeSpec, grade
from probes.scenario import FAN_OUT, Scenario, ScenarioMeasurement, Step, run_scenario
from probes.transport import warm_clients
from simulator.testing import SimulatorProcess
from tests.sim_fixtures import OPENAI_KEY

# fast-small in simulator/configs/test.toml: 20 ms queue, 50,000 prefill tokens/s, no jitter.
QUEUE_MS = 20.0
PREFILL_TOKENS_PER_S = 50_000.0


def _base(sim: SimulatorProcess, **kwargs: object) -> ProbeSpec:
    return ProbeSpec(
        base_url=f"{sim.base_url}/fastchip/v1",
        format="openai",
        model="fast-small",
        api_key=OPENAI_KEY,
        **kwargs,  # type: ignore[arg-type]
    )


def _run(scenario: Scenario) -> ScenarioMeasurement:
    async def go() -> ScenarioMeasurement:
        try:
            return await run_scenario(scenario)
        finally:
            await warm_clients.aclose()

    return asyncio.run(go())


def _agent_loop(calls: int, document_tokens: int) -> list[Step]:
    return [
        Step(
            prompt=f"Step {{step}}: look at the last result and decide the next action ({i}).",
            input_tokens=document_tokens,
            max_tokens=40,
        )
        for i in range(calls)
    ]


def test_ten_sequential_calls_add_up_to_the_app_e2e(sim: SimulatorProcess) -> None:
    scenario = Scenario(
        _base(sim),
        _agent_loop(10, 2000),
        total_timeout_s=60,
        validate=lambda text: grade("regex", text, r"\w"),
    )
    out = _run(scenario)

    assert out.ok, out.error_detail
    assert len(out.calls) == 10
    assert [c.step for c in out.calls] == list(range(10))
    assert out.app_e2e_ms is not None
    assert out.validation_ms is not None
    assert out.validation_pass is True
    # Nothing unaccounted for: the scenario's own clock is the calls, the gaps between them
    # (the application's work: building the next prompt) and the validation, within 5 ms per
    # call (the engine's time between a stream's end and its return).
    accounted = out.calls_e2e_ms + sum(out.gaps_ms) + out.validation_ms
    assert accounted <= out.app_e2e_ms + 0.5
    assert out.app_e2e_ms - accounted <= 5.0 * len(out.calls)
    # Sequential: each call starts after the previous one ended.
    for before, after in zip(out.calls, out.calls[1:], strict=False):
        assert before.result.e2e_ms is not None
        assert after.offset_ms >= before.offset_ms + before.result.e2e_ms
    # One warm client, as an application holds one: every call after the first reuses it.
    assert [c.result.connection_reused for c in out.calls[1:]] == [True] * 9


def test_later_calls_of_an_agent_loop_hit_the_cache_and_their_ttft_drops(
    sim: SimulatorProcess,
) -> None:
    # A document of its own, so no other test warmed the cache for the first call.
    base = _base(sim, system_prompt=f"Agent {time.time_ns()}.")
    out = _run(Scenario(base, _agent_loop(6, 8000), total_timeout_s=60))

    assert out.ok, out.error_detail
    first, later = out.calls[0].result, [c.result for c in out.calls[1:]]
    assert first.cached_tokens == 0
    for call in later:
        assert call.cached_tokens is not None
        assert call.input_tokens is not None
        # The previous call's prompt is this one's prefix: all but its last block is cached.
        assert call.cached_tokens >= 8000 - 256
    cached = [c.cached_tokens or 0 for c in later]
    assert cached == sorted(cached)  # the context grows, and so does the cached prefix
    # TTFT drops as the simulator's prefill says: queue + uncached tokens / prefill rate.
    for call in [first, *later]:
        assert call.ttft_ms is not None
        assert call.input_tokens is not None
        uncached = call.input_tokens - (call.cached_tokens or 0)
        expected = QUEUE_MS + uncached / PREFILL_TOKENS_PER_S * 1000.0
        assert abs(call.ttft_ms - expected) < 15.0, (call.ttft_ms, expected)
    assert first.ttft_ms is not None
    assert max(c.ttft_ms or 0.0 for c in later) < first.ttft_ms - 100.0


def test_a_fan_out_of_five_waits_for_its_slowest_branch(sim: SimulatorProcess) -> None:
    steps = [
        # Branch b is queued b x 100 ms longer: branch 5 is the slow one.
        Step(
            prompt="Summarise part {branch}. [sim-delay-ms: {branch}00]",
            kind=FAN_OUT,
            fan_out=5,
            max_tokens=20,
            carry_context=False,
        ),
        Step(prompt="Merge these summaries: {previous}", max_tokens=20, carry_context=False),
    ]
    out = _run(Scenario(_base(sim), steps, total_timeout_s=30))

    assert out.ok, out.error_detail
    branches = [c for c in out.calls if c.step == 0]
    merge = next(c for c in out.calls if c.step == 1)
    assert len(branches) == 5
    starts = [b.offset_ms for b in branches]
    ends = {b.branch: b.offset_ms + (b.result.e2e_ms or 0.0) for b in branches}
    # In parallel: every branch started before the quickest one had finished.
    assert max(starts) < min(ends.values())
    assert max(ends, key=lambda k: ends[k]) == 4  # branch 5 finished last...
    assert ends[4] - ends[0] > 300.0  # ...clearly last
    # The merge waited for it, and the time between is the step's recorded gap: what an
    # application would spend there, not a wait of the engine's own.
    assert merge.offset_ms >= ends[4]
    assert out.gaps_ms[1] == pytest.approx(merge.offset_ms - ends[4], abs=0.01)
    # Nowhere near a deadline (30 s): it went on from the last answer, not from a timer.
    assert merge.offset_ms - ends[4] < 1000.0
    # The merge call got every branch's answer.
    assert out.app_e2e_ms is not None
    assert out.app_e2e_ms >= ends[4]


def test_answers_are_usable_by_the_next_step_and_validation_is_timed(
    sim: SimulatorProcess,
) -> None:
    steps = [
        Step(prompt="What is 12 * 3?", max_tokens=80),
        Step(prompt="What is {previous} * 2?", max_tokens=80),
    ]
    out = _run(
        Scenario(
            _base(sim),
            steps,
            total_timeout_s=30,
            validate=lambda text: grade("numeric", text, "72"),
        )
    )

    assert out.ok, out.error_detail
    assert out.calls[0].result.text.rstrip().endswith("ANSWER: 36")
    assert out.final_text.rstrip().endswith("ANSWER: 72")
    assert out.validation_pass is True
    assert out.validation_ms is not None
    assert out.validation_ms > 0


def test_a_failing_step_ends_the_scenario_with_that_step_named(sim: SimulatorProcess) -> None:
    steps = [
        Step(prompt="Plan the work.", max_tokens=20),
        Step(prompt="Call the tool.", max_tokens=20),
        Step(prompt="Read the tool's answer. [sim-fault: http_500]", max_tokens=20),
        Step(prompt="Answer the user.", max_tokens=20),
    ]
    out = _run(Scenario(_base(sim), steps, total_timeout_s=30))

    assert not out.ok
    assert out.failed_step == 2
    assert out.error_kind == "http_5xx"
    assert out.error_detail.startswith("step 3 failed: HTTP 500")
    assert [c.step for c in out.calls] == [0, 1, 2]  # step 4 was never sent
    assert out.calls[2].result.error_kind == "http_5xx"


def test_a_stalled_step_ends_within_the_scenario_deadline(sim: SimulatorProcess) -> None:
    steps = [
        Step(prompt="Plan the work.", max_tokens=20),
        Step(prompt="Call the tool. [sim-fault: stall_headers]", max_tokens=20),
        Step(prompt="Answer the user.", max_tokens=20),
    ]
    started = time.perf_counter()
    out = _run(Scenario(_base(sim), steps, total_timeout_s=1.5))
    elapsed_s = time.perf_counter() - started

    assert not out.ok
    assert out.failed_step == 1
    assert out.error_kind == "timeout_headers"
    # Stopped by the scenario's 1.5 s deadline, not by the call's own first-token timeout
    # (60 s): the upper bounds leave a loaded machine's stalls room, far short of that.
    assert elapsed_s < 1.5 + 1.5
    assert out.app_e2e_ms is not None
    assert 1400 < out.app_e2e_ms < 2500


def test_a_step_deadline_shorter_than_the_scenarios_ends_the_call_first(
    sim: SimulatorProcess,
) -> None:
    steps = [Step(prompt="Wait. [sim-fault: stall_headers]", max_tokens=20, timeout_s=0.5)]
    out = _run(Scenario(_base(sim), steps, total_timeout_s=10))

    assert out.failed_step == 0
    assert out.error_kind == "timeout_headers"
    assert out.app_e2e_ms is not None
    # The step's 0.5 s, not the scenario's 10 s (room left for a loaded machine's stalls).
    assert 450 < out.app_e2e_ms < 3000


def test_an_unusable_template_is_ours_and_sends_nothing(sim: SimulatorProcess) -> None:
    out = _run(Scenario(_base(sim), [Step(prompt="Use {nothing}.")], total_timeout_s=5))

    assert out.error_kind == "config"
    assert out.calls == []
    assert "step 1" in out.error_detail
