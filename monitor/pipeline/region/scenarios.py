"""The region worker's side of scenarios (monitor.pipeline.beat.scenarios tells the whole
story): every step of a scenario slot run on one route with probes.scenario, the final answer
validated, one ScenarioPayload out.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.conf import settings

import probes
from monitor.models import (
    STEP_FAN_OUT,
)
from monitor.pipeline.messages import (
    ContractError,
    EvalSpec,
    ResultPayload,
    ScenarioMessage,
    ScenarioPayload,
    ScenarioStepSpec,
    scenario_message_from_json,
)
from monitor.pipeline.region import worker
from probes.errors import Kind
from probes.graders import GraderError
from probes.scenario import FAN_OUT, SEQUENTIAL, Scenario, Step, run_scenario

log = logging.getLogger(__name__)


def _step(spec: ScenarioStepSpec) -> Step:
    return Step(
        prompt=spec["prompt"],
        kind=FAN_OUT if spec["kind"] == STEP_FAN_OUT else SEQUENTIAL,
        fan_out=spec["fan_out"],
        input_tokens=spec["input_tokens"],
        max_tokens=spec["max_tokens"],
        carry_context=spec["carry_context"],
        timeout_s=spec["timeout_s"],
    )


def _validator(case: EvalSpec | None) -> Any:
    if case is None:
        return None

    def validate(text: str) -> bool | None:
        try:
            return probes.grade(
                case["grader"],
                text,
                case["expected"] or "",
                case["json_schema"],
                float(case["tolerance"] or 0.0),
            )
        except GraderError:
            return None

    return validate


def _failed(message: ScenarioMessage, kind: str, detail: str) -> ScenarioPayload:
    probe = message["probe"]
    return {
        "slot": probe["slot"],
        "started_at": datetime.now(UTC).isoformat(),
        "outcome": "error",
        "error_kind": kind,
        "error_detail": detail[:500],
        "failed_step": None,
        "app_e2e_ms": None,
        "calls_e2e_ms": None,
        "gaps_ms": [],
        "validation_ms": None,
        "validation_pass": None,
        "eval_case_id": probe["eval"]["id"] if probe["eval"] else None,
        "calls": [],
    }


def run(data: object) -> ScenarioPayload | None:
    """Run one scenario (a ScenarioMessage as JSON) on this worker's probe loop; None for a
    message that does not match the contract (logged; its slot is recorded missed)."""
    try:
        message = scenario_message_from_json(data)
    except ContractError as exc:
        log.error("rejected a scenario message: %s", exc)
        return None
    probe = message["probe"]
    try:
        base = worker.spec_for(probe, worker.connect_to_map(settings.CONNECT_TO))
    except worker.Unusable as exc:
        return _failed(message, Kind.CONFIG, str(exc))
    base = dataclasses.replace(base, max_response_bytes=worker.MAX_RESPONSE_BYTES)
    scenario = Scenario(
        base=base,
        steps=[_step(s) for s in message["steps"]],
        total_timeout_s=message["timeout_s"],
        validate=_validator(probe["eval"]),
    )

    async def carried() -> probes.scenario.ScenarioMeasurement:
        async with worker.carrying():  # in flight, one of the worker's load (worker.LOAD)
            return await run_scenario(scenario)

    result = worker.run_on_loop(carried(), message["timeout_s"] + 60)
    # One pair of clocks for every call: their start times keep their offsets exactly.
    perf_now, wall_now = probes_clock()
    started = wall_now - timedelta(seconds=perf_now - (result.t0_perf or perf_now))
    calls: list[ResultPayload] = []
    for call in result.calls:
        t0 = call.result.t0_perf
        at = wall_now - timedelta(seconds=perf_now - t0) if t0 is not None else started
        payload = worker.payload(probe, call.result, at)
        payload.update(
            {
                "slot_at": None,
                "max_tokens": message["steps"][call.step]["max_tokens"],
                "eval_case_id": None,
                "quality_pass": None,
            }
        )
        calls.append(cast(ResultPayload, {**payload, "step": call.step}))
    return {
        "slot": probe["slot"],
        "started_at": started.isoformat(),
        "outcome": result.outcome,
        "error_kind": result.error_kind,
        "error_detail": result.error_detail,
        "failed_step": result.failed_step,
        "app_e2e_ms": result.app_e2e_ms,
        "calls_e2e_ms": result.calls_e2e_ms,
        "gaps_ms": result.gaps_ms,
        "validation_ms": result.validation_ms,
        "validation_pass": result.validation_pass,
        "eval_case_id": probe["eval"]["id"] if probe["eval"] else None,
        "calls": calls,
    }


def probes_clock() -> tuple[float, datetime]:
    return time.perf_counter(), datetime.now(UTC)
