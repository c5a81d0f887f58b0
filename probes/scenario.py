"""A scenario: several calls the way an application makes them, timed as a whole.

An application's user waits for the whole sequence, not one call: ten sequential calls of an
agent loop, a fan-out whose merge waits for its slowest branch, then the check that the final
answer is usable. `await run_scenario(scenario)` runs the steps in order on the process's warm
clients (one pooled client per endpoint, as an application holds one, so later calls reuse the
first call's connection), a fan-out step's calls in parallel, then the validation, and never
raises (cancellation aside): a failing call ends the scenario with that step named.

Times (time.perf_counter()):
- t0 is taken before the first request is prepared (the user's action);
- app_e2e_ms runs from t0 to the end of validation (the validated result);
- each call keeps its own Measurement (its t0 is the engine's: just before the request is
  handed to the HTTP client) and `offset_ms`, its t0 after the scenario's t0;
- gaps_ms[i] is the time before step i's first call starts, after the previous step's last
  call returned (for step 0, after t0): the application's work between calls (building the
  next prompt, the engine preparing the request); with validation, one more gap precedes it. The time between a call's measured end and
  its return (closing the stream, counting tokens) is in no gap and no call: it is the
  engine's overhead, and tests hold it under a few milliseconds per call.

Bounds: the scenario has a total deadline; each call has its own (the step's, cut to what is
left of the scenario's), so a stalled call ends in time and is reported as that call's
timeout. A step that would start with less than MIN_CALL_S left is not sent.

Prompts: each call's user message is the conversation so far (when the step carries context:
every earlier step's prompt and answer, in order) followed by the step's prompt, whose
`{previous}` is the previous step's answer (a fan-out's answers joined by blank lines, each
being the text after "ANSWER:" when there is one, the whole text otherwise), `{step}` its
1-based number and `{branch}` the fan-out branch's. The step's `input_tokens` is a document
of stable padding put before the conversation, the same text in every step, so consecutive
calls share their prefix and a provider's prompt cache can serve it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from probes.engine import probe
from probes.errors import Kind
from probes.graders import GraderError, answer_of
from probes.model import ERROR, OK, Measurement, ProbeSpec
from probes.redact import redact
from probes.tokenizer import count_tokens

SEQUENTIAL = "sequential"
FAN_OUT = "fan-out"
STEP_KINDS = (SEQUENTIAL, FAN_OUT)
MAX_FAN_OUT = 32
MIN_CALL_S = 0.05
DETAIL_LIMIT = 500
_FRAMING_TOKENS = 8  # probes.prompts.build's allowance for message framing


@dataclass(frozen=True)
class Step:
    prompt: str  # template: {previous}, {step}, {branch}
    kind: str = SEQUENTIAL
    fan_out: int = 1  # calls in parallel (fan-out steps)
    input_tokens: int = 0  # the stable document before the conversation
    max_tokens: int = 256
    carry_context: bool = True  # send the conversation so far before the prompt
    timeout_s: float | None = None  # this step's per-call deadline (None: the scenario's)
    extra_headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Scenario:
    """`base` says where and how every call goes (endpoint, model, key, request settings, the
    options probed); its prompts, sizes and deadlines are the steps' and the scenario's."""

    base: ProbeSpec
    steps: list[Step]
    total_timeout_s: float = 300.0
    # The final answer's check (the task's grader): True/False, or None when nothing grades.
    validate: Callable[[str], bool | None] | None = None


@dataclass
class Call:
    step: int  # 0-based
    branch: int  # 0-based within a fan-out, else 0
    offset_ms: float  # the call's t0 after the scenario's t0
    result: Measurement


@dataclass
class ScenarioMeasurement:
    outcome: str = OK
    error_kind: str = ""
    error_detail: str = ""
    failed_step: int | None = None  # 0-based
    app_e2e_ms: float | None = None
    gaps_ms: list[float] = field(default_factory=list)
    validation_ms: float | None = None
    validation_pass: bool | None = None
    final_text: str = ""
    calls: list[Call] = field(default_factory=list)
    t0_perf: float | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    @property
    def calls_e2e_ms(self) -> float:
        return sum(c.result.e2e_ms or 0.0 for c in self.calls)


def check(steps: list[Step]) -> str | None:
    """Why these steps cannot run as a scenario, or None."""
    if not steps:
        return "a scenario needs at least one step"
    for i, step in enumerate(steps, 1):
        if step.kind not in STEP_KINDS:
            return f"step {i}: unknown kind {step.kind!r}"
        if step.kind == FAN_OUT and not 1 <= step.fan_out <= MAX_FAN_OUT:
            return f"step {i}: a fan-out takes 1 to {MAX_FAN_OUT} calls, not {step.fan_out}"
        if step.max_tokens < 1:
            return f"step {i}: max_tokens must be at least 1"
        try:
            step.prompt.format(previous="", step=i, branch=1)
        except (KeyError, IndexError, ValueError) as exc:
            return f"step {i}: the prompt template is not usable ({exc.__class__.__name__}: {exc})"
    return None


def _answer(texts: list[str]) -> str:
    return "\n\n".join(answer_of(t) for t in texts)


def _spec(
    base: ProbeSpec, step: Step, user: str, remaining_s: float, branch_headers: Mapping[str, str]
) -> ProbeSpec:
    per_call = remaining_s if step.timeout_s is None else min(step.timeout_s, remaining_s)
    # The document is exactly step.input_tokens of stable padding: probes.prompts.build pads
    # to a target total, so the target is the document plus what the prompt already holds.
    target = 0
    if step.input_tokens > 0:
        target = step.input_tokens + count_tokens(base.system_prompt + user) + _FRAMING_TOKENS
    return replace(
        base,
        user_prompt=user,
        input_tokens=target,
        max_tokens=step.max_tokens,
        fresh_prefix=False,
        cold=False,
        total_timeout_s=per_call,
        first_token_timeout_s=min(base.first_token_timeout_s, per_call),
        extra_headers={**base.extra_headers, **branch_headers},
    )


async def run_scenario(scenario: Scenario) -> ScenarioMeasurement:
    """Run the scenario. Never raises except on cancellation."""
    out = ScenarioMeasurement()
    t0 = out.t0_perf = time.perf_counter()
    try:
        await _run(scenario, out, t0)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the last line of defence: a scenario never raises
        out.outcome, out.error_kind = ERROR, Kind.ENGINE.value
        detail = f"scenario engine failure: {exc.__class__.__name__}: {exc}"
        out.error_detail = redact(detail, scenario.base.secrets())[:DETAIL_LIMIT]
    # Kept for failures too (the time until the scenario failed); only successes rank.
    out.app_e2e_ms = (time.perf_counter() - t0) * 1000.0
    return out


async def _run(scenario: Scenario, out: ScenarioMeasurement, t0: float) -> None:
    problem = check(scenario.steps)
    if problem is not None:
        out.outcome, out.error_kind, out.error_detail = ERROR, Kind.CONFIG.value, problem
        return
    deadline = t0 + scenario.total_timeout_s
    context = ""
    previous = ""
    texts: list[str] = []
    returned = t0
    for index, step in enumerate(scenario.steps):
        n = step.fan_out if step.kind == FAN_OUT else 1
        prompts = [
            step.prompt.format(previous=previous, step=index + 1, branch=b + 1) for b in range(n)
        ]
        remaining = deadline - time.perf_counter()
        if remaining < MIN_CALL_S:
            _fail(out, index, Kind.TIMEOUT_TOTAL.value, _late(scenario, index))
            return
        specs = [
            _spec(
                scenario.base,
                step,
                (context if step.carry_context else "") + text,
                remaining,
                step.extra_headers,
            )
            for text in prompts
        ]
        # Bounded twice: each call by its own deadline, the whole step by the scenario's (a
        # call that overran its own would still be stopped here).
        try:
            async with asyncio.timeout(remaining + 1.0):
                results = await asyncio.gather(*(probe(spec) for spec in specs))
        except TimeoutError:
            _fail(out, index, Kind.TIMEOUT_TOTAL.value, _late(scenario, index))
            return
        started = min((r.t0_perf for r in results if r.t0_perf is not None), default=None)
        out.gaps_ms.append(((started if started is not None else returned) - returned) * 1000.0)
        # A gap runs from the step's last answer byte (a call's end), not from when this
        # coroutine resumed: on a process carrying many probes the loop may take a while to
        # come back here, and that wait is the application's time between calls.
        returned = max(
            (
                r.t0_perf + r.e2e_ms / 1000.0
                for r in results
                if r.t0_perf is not None and r.e2e_ms is not None
            ),
            default=time.perf_counter(),
        )
        for branch, result in enumerate(results):
            offset = (result.t0_perf - t0) * 1000.0 if result.t0_perf is not None else 0.0
            out.calls.append(Call(index, branch, offset, result))
        failed = next((r for r in results if not r.ok), None)
        if failed is not None:
            where = f" (call {results.index(failed) + 1} of {n})" if n > 1 else ""
            _fail(
                out,
                index,
                failed.error_kind,
                f"step {index + 1}{where} failed: {failed.error_detail}",
            )
            return
        texts = [r.text for r in results]
        previous = _answer(texts)
        if step.carry_context:
            context += "".join(f"{p}\n\n" for p in prompts[:1]) + "\n\n".join(texts) + "\n\n"
    out.final_text = "\n\n".join(texts)
    if scenario.validate is not None:
        started = time.perf_counter()
        try:
            out.validation_pass = scenario.validate(out.final_text)
        except GraderError:
            out.validation_pass = None  # an unusable eval case grades nothing
        out.validation_ms = (time.perf_counter() - started) * 1000.0
        out.gaps_ms.append((started - returned) * 1000.0)


def _late(scenario: Scenario, index: int) -> str:
    return (
        f"step {index + 1} did not finish within the scenario's deadline of "
        f"{scenario.total_timeout_s:g} s"
    )


def _fail(out: ScenarioMeasurement, index: int, kind: str, detail: str) -> None:
    out.outcome = ERROR
    out.failed_step = index
    out.error_kind = kind or Kind.ENGINE.value
    out.error_detail = detail[:DETAIL_LIMIT]
