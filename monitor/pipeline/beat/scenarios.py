"""Scenario slots: what the beat sends, what a region worker runs, what ingest stores.

A task with steps (monitor.models.ScenarioStep) is a scenario task. Its (task, route, region)
slots are ordinary ProbeSlots, claimed the same way (monitor.pipeline.beat.scheduling), but each is
sent as one ScenarioMessage instead of a probe: the region worker runs every step on that
route with probes.scenario (one warm client, total and per-call deadlines, validation of the
final answer by the slot's eval case, timed), and ingest stores one ScenarioResult with its
calls as ProbeResult rows linked to it (slot_at null, `step` set). Scenarios always run the
task's reference options: app e2e ranks routes, there is nothing else to compare.

Rollups: the scenario folds in once per slot (counts, errors, validation as graded/passed,
tokens and cost of all its calls, app e2e into app_e2e_hist); its calls are stored for the
waterfall and the probe log but not folded in one by one, so a scenario task's counts and
availability are per scenario, as its user experiences them.

This module is the beat's side (a slot's message); the region worker runs it in
monitor.pipeline.region.scenarios, ingest stores it in monitor.pipeline.ingest.scenarios.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from monitor.models import (
    CONN_WARM,
    HTTP_2,
    STEP_FAN_OUT,
    EvalCase,
    ScenarioStep,
)
from monitor.pipeline.beat.slots import Slot, expires_at, probe_message
from monitor.pipeline.messages import (
    RUN_SCENARIO,
    Dispatch,
    ScenarioMessage,
    scenario_message_to_json,
)


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
                expires=expires_at(slot.slot_at),
                tally_key=slot.region.slug,
                tally=1,
            )
        )
    return out
