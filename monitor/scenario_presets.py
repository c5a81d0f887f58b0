"""Scenario presets: the step lists the admin can give a task in one action (TaskAdmin).

Each uses the task's own sizes: its input_tokens as the document, its max_tokens as each
call's bound, and its eval case's input (`{input}`) in the last step, so the task's graders
validate the final answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from monitor.models import STEP_FAN_OUT, STEP_SEQUENTIAL, ScenarioStep, Task


@dataclass(frozen=True)
class StepPreset:
    prompt: str
    kind: str = STEP_SEQUENTIAL
    fan_out: int = 1
    document: bool = True  # the task's input_tokens of stable document, else none
    carry_context: bool = True


def agent_loop(calls: int = 10) -> list[StepPreset]:
    """N sequential calls with a growing context that reuses the prefix (each call sends the
    same document and every earlier turn first, so a prompt cache serves all but the newest)."""
    return [
        StepPreset("Step {step}: read the last result and decide the next action.")
        for _ in range(calls - 1)
    ] + [StepPreset("Give the final answer to: {input}")]


def fan_out_and_merge(branches: int = 5) -> list[StepPreset]:
    """N parallel calls on parts of the work, then one merge call that waits for them all."""
    return [
        StepPreset(
            "Work on part {branch} of: {input}",
            kind=STEP_FAN_OUT,
            fan_out=branches,
            carry_context=False,
        ),
        StepPreset(
            "Merge these partial results:\n{previous}\nThen answer: {input}",
            document=False,
            carry_context=False,
        ),
    ]


def retrieve_then_answer() -> list[StepPreset]:
    """A short call that decides what to look up, then the answer over the retrieved document."""
    return [
        StepPreset("Say what to look up to answer: {input}", document=False),
        StepPreset("Using what was found ({previous}), answer: {input}", carry_context=False),
    ]


PRESETS: dict[str, tuple[str, Callable[[], list[StepPreset]]]] = {
    "agent-loop": ("agent loop (10 sequential calls, growing context)", agent_loop),
    "fan-out-merge": ("fan-out and merge (5 parallel calls, then a merge)", fan_out_and_merge),
    "retrieve-answer": ("retrieve then answer (2 calls)", retrieve_then_answer),
}


@transaction.atomic
def apply(task: Task, preset: str) -> list[ScenarioStep]:
    """Replace the task's steps with the preset's."""
    _, make = PRESETS[preset]
    task.steps.all().delete()
    return [
        ScenarioStep.objects.create(
            task=task,
            order=i,
            kind=p.kind,
            fan_out=p.fan_out,
            prompt_template=p.prompt,
            input_tokens=task.input_tokens if p.document else 0,
            max_tokens=task.max_tokens,
            carry_context=p.carry_context,
        )
        for i, p in enumerate(make())
    ]
