"""Scenario slots: what the beat sends, what a region worker runs, what ingest stores.

A task with steps (monitor.models.ScenarioStep) is a scenario task. Its (task, route, region)
slots are ordinary ProbeSlots, claimed the same way (monitor.pipeline.scheduling), but each is
sent as one ScenarioMessage instead of a probe: the region worker runs every step on that
route with probes.scenario (one warm client, total and per-call deadlines, validation of the
final answer by the slot's eval case, timed), and ingest stores one ScenarioResult with its
calls as ProbeResult rows linked to it (slot_at null, `step` set). Scenarios always run the
task's reference options: app e2e ranks routes, there is nothing else to compare.

Rollups: the scenario folds in once per slot (counts, errors, validation as graded/passed,
tokens and cost of all its calls, app e2e into app_e2e_hist); its calls are stored for the
waterfall and the probe log but not folded in one by one, so a scenario task's counts and
availability are per scenario, as its user experiences them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

import probes
from monitor.models import (
    CONN_WARM,
    HTTP_2,
    OUTCOME_OK,
    SLOT_DISPATCHED,
    SLOT_DONE,
    SLOT_MISSED,
    STEP_FAN_OUT,
    EvalCase,
    ProbeResult,
    ProbeSlot,
    Route,
    ScenarioResult,
    ScenarioStep,
)
from monitor.pipeline import ingest, signing, worker
from monitor.pipeline.messages import (
    RUN_SCENARIO,
    ContractError,
    Dispatch,
    EvalSpec,
    ResultPayload,
    ScenarioMessage,
    ScenarioPayload,
    ScenarioStepSpec,
    scenario_message_from_json,
    scenario_message_to_json,
    scenario_payload_from_json,
)
from monitor.pipeline.slots import Slot, expires_at, probe_message
from monitor.stats import health, rollups
from monitor.stats.rollups import ResultRow
from probes.errors import Kind
from probes.graders import GraderError
from probes.scenario import FAN_OUT, SEQUENTIAL, Scenario, Step, run_scenario

log = logging.getLogger(__name__)

# --- the beat's side --------------------------------------------------------------------------


def _escaped(text: str) -> str:
    """An eval case's input inside a step template: its braces are text, not fields."""
    return text.replace("{", "{{").replace("}", "}}")


def scenario_message(
    slot: Slot, steps: Sequence[ScenarioStep], eval_cases: list[EvalCase]
) -> ScenarioMessage:
    """What a region worker needs for one scenario slot: the slot's probe message (its eval
    case picked by the slot's number, like a probe's) with the reference options, and the
    steps with the case's input put in."""
    probe = probe_message(slot, eval_cases)
    http, body, connection_mode, prefix = slot.task.reference(slot.route.provider)
    probe.update(
        {
            "http2": http == HTTP_2,
            "body_encoding": body,
            "cold": connection_mode != CONN_WARM,
            "prefix_mode": prefix,
        }
    )
    case = next((c for c in eval_cases if probe["eval"] and c.pk == probe["eval"]["id"]), None)
    case_input = _escaped(case.input) if case else ""
    return {
        "probe": probe,
        "steps": [
            {
                "kind": step.kind,
                "fan_out": step.fan_out if step.kind == STEP_FAN_OUT else 1,
                "prompt": step.prompt_template.replace("{input}", case_input),
                "input_tokens": step.input_tokens,
                "max_tokens": slot.route.token_limit(step.max_tokens),
                "carry_context": step.carry_context,
                "timeout_s": float(step.timeout_s) if step.timeout_s else None,
            }
            for step in steps
        ],
        "timeout_s": float(slot.task.probe_timeout_s),
    }


def dispatches(
    slots: Sequence[Slot], eval_cases: dict[int, list[EvalCase]], now: datetime
) -> list[Dispatch]:
    """One message per scenario slot (a scenario is a whole application run, not a probe to
    batch with others)."""
    out = []
    for slot in slots:
        steps = list(slot.task.steps.all())
        message = scenario_message(slot, steps, eval_cases.get(slot.task.pk, []))
        out.append(
            Dispatch(
                task_name=RUN_SCENARIO,
                queue=slot.region.queue_name,
                message=scenario_message_to_json(message),
                expires=expires_at(slot.slot_at, now),
                tally_key=slot.region.slug,
                tally=1,
            )
        )
    return out


# --- the region worker's side -----------------------------------------------------------------


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

    async def carried() -> probes.scenario.ScenarioResult:
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


# --- ingest's side ----------------------------------------------------------------------------


def _open_slot(payload: ScenarioPayload, region_id: int | None, now: datetime) -> ProbeSlot | None:
    """The payload's slot, locked, if it is still open (and of the region that signed it)."""
    key = payload["slot"]
    if region_id is not None and key["region_id"] != region_id:
        log.warning("rejected a scenario result: sent by another region's worker")
        return None
    try:
        slot_at = datetime.fromisoformat(key["slot_at"])
    except ValueError:
        log.warning("rejected a scenario result: its slot time is not a time")
        return None
    slot = (
        ProbeSlot.objects.select_for_update()
        .filter(
            task_id=key["task_id"],
            route_id=key["route_id"],
            region_id=key["region_id"],
            slot_at=slot_at,
        )
        .first()
    )
    if slot is None or slot.status not in (SLOT_DISPATCHED, SLOT_MISSED):
        log.warning("rejected a scenario result: no open slot for it")
        return None
    if region_id is not None and now > slot.deadline_at:
        log.warning("rejected a scenario result: sent after its slot's deadline")
        return None
    if slot.status == SLOT_MISSED and _ended_at(payload, now) > slot.deadline_at:
        log.warning("rejected a scenario result: its slot was missed and it ended after")
        return None
    return slot


def _ended_at(payload: ScenarioPayload, default: datetime) -> datetime:
    """When the scenario ended: its start plus its app e2e time (to the failure, for a failed
    one; its start when it has none)."""
    took_ms = _finite(payload["app_e2e_ms"]) or 0.0
    return _time(payload["started_at"], default) + timedelta(milliseconds=took_ms)


def ingest_signed(envelope: object) -> bool:
    """A scenario result as a region worker sends it (signed, monitor.pipeline.signing)."""
    try:
        opened = signing.open_results(envelope, signing.KIND_SCENARIO_RESULT)
    except signing.Refused as exc:
        log.warning("refused a scenario result: %s", exc)
        ingest.count_rejected(1)
        return False
    stored = ingest_scenario(opened.body, from_region=opened.region_id, sealed_at=opened.sealed_at)
    return stored is not None


def ingest_scenario(
    data: object, *, from_region: int | None = None, sealed_at: datetime | None = None
) -> ScenarioResult | None:
    """Store one scenario result and its calls, fold it into the rollups, close its slot.
    `from_region`: the region whose key signed it (then only that region's open slots), and
    `sealed_at` when it signed it: one sealed after its slot's deadline is refused."""
    now = sealed_at or timezone.now()
    try:
        payload = scenario_payload_from_json(data)
    except ContractError as exc:
        log.warning("rejected a scenario result: %s", exc)
        ingest.count_rejected(1)
        return None
    with transaction.atomic():
        slot = _open_slot(payload, from_region, now)
        if slot is None:
            ingest.count_rejected(1)
            return None
        route = Route.objects.select_related("provider").get(pk=slot.route_id)
        case_id = payload["eval_case_id"]
        if case_id is not None and not EvalCase.objects.filter(pk=case_id).exists():
            case_id = None
        started_at = _time(payload["started_at"], now)
        scenario = ScenarioResult.objects.create(
            task_id=slot.task_id,
            route_id=slot.route_id,
            region_id=slot.region_id,
            slot_at=slot.slot_at,
            started_at=started_at,
            app_e2e_ms=_finite(payload["app_e2e_ms"]),
            calls_e2e_ms=_finite(payload["calls_e2e_ms"]),
            gaps_ms=[g for g in payload["gaps_ms"] if _finite(g) is not None],
            outcome=OUTCOME_OK if payload["outcome"] == OUTCOME_OK else "error",
            failed_step=payload["failed_step"],
            error_kind=payload["error_kind"][:30],
            error_detail=payload["error_detail"][:500],
            validation_ms=_finite(payload["validation_ms"]),
            validation_pass=payload["validation_pass"],
            eval_case_id=case_id,
            call_count=len(payload["calls"]),
        )
        rows = []
        for call in payload["calls"]:
            fixed: dict[str, Any] = {
                **call,
                "task_id": slot.task_id,
                "route_id": slot.route_id,
                "region_id": slot.region_id,
                "slot_at": None,
                "scenario_id": scenario.pk,
                "reference": False,
                "eval_case_id": None,
            }
            try:
                rows.append(ingest.row_from_payload(fixed, {route.pk: route}, now))
            except ingest.BadPayload as exc:
                log.warning("rejected a scenario call: %s", exc)
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        ingest.insert_rows(rows)
        totals = ProbeResult.objects.filter(scenario=scenario).aggregate(
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            cached_tokens=Sum("cached_tokens"),
            cost_usd=Sum("cost_usd"),
        )
        scenario.input_tokens = totals["input_tokens"] or 0
        scenario.output_tokens = totals["output_tokens"] or 0
        scenario.cached_tokens = totals["cached_tokens"]
        scenario.cost_usd = totals["cost_usd"] or Decimal("0")
        scenario.save(update_fields=["input_tokens", "output_tokens", "cached_tokens", "cost_usd"])
        if slot.status == SLOT_MISSED:
            # Recorded missed while the result was on its way (broker or ingest down), but
            # measured in time: the real result replaces the missed one, in the rollups too.
            ingest.take_back_missed((slot.task_id, slot.route_id, slot.region_id, slot.slot_at))
        ProbeSlot.objects.filter(pk=slot.pk).update(status=SLOT_DONE)
        rollups.apply([rollup_row(scenario)])
        if from_region is not None:  # a live slot of the schedule (monitor.stats.health)
            health.count([rollup_row(scenario)])
    return scenario


def rollup_row(scenario: ScenarioResult) -> ResultRow:
    """A scenario as rollups fold it: one result per slot, its app e2e, no single-call
    latencies (its calls are not the task's probes)."""
    return ResultRow(
        task_id=scenario.task_id,
        route_id=scenario.route_id,
        region_id=scenario.region_id,
        slot_at=scenario.slot_at,
        started_at=scenario.started_at,
        outcome=scenario.outcome,
        error_kind=scenario.error_kind,
        ttft_ms=None,
        ttfat_ms=None,
        e2e_ms=None,
        tps=None,
        reference=True,
        quality_pass=scenario.validation_pass,
        cached_tokens=scenario.cached_tokens,
        input_tokens=scenario.input_tokens,
        output_tokens=scenario.output_tokens,
        cost_usd=scenario.cost_usd,
        app_e2e_ms=scenario.app_e2e_ms if scenario.outcome == OUTCOME_OK else None,
    )


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _time(value: str, default: datetime) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return default
