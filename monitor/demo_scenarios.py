"""A scenario task's demo history (monitor.demo_history): whole runs, their steps' calls drawn
one after another on the route as probes.scenario makes them, stored as ingest stores a
scenario (monitor.pipeline.ingest.scenarios) and folded into the rollups a day at a time.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction

from monitor.demo_draws import (
    SCENARIO_INTERVAL_S,
    Draw,
    Simulated,
    draw,
    history_slot_times,
    payload,
    shape_for,
)
from monitor.models import (
    OUTCOME_ERROR,
    OUTCOME_OK,
    PREFIX_STABLE,
    STEP_FAN_OUT,
    EvalCase,
    GeneratedSpan,
    Region,
    Route,
    ScenarioResult,
    Task,
)
from monitor.pipeline.beat.slots import phase_s, slot_number
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.ingest import rows as ingest_rows
from monitor.stats import rollup_writes
from probes.errors import Kind
from probes.scenario import MIN_CALL_S
from simulator.generation import Shape, lognormal_factor

# The application's own time around its calls (ms; probes.scenario): building the next prompt
# before a call (a gap), the engine's return after one (closing the stream, counting tokens),
# grading the final answer. A warm engine's few milliseconds.
GAP_MS = 1.5


RETURN_MS = 1.0


VALIDATION_MS = 0.3


_COLUMN = {name: i for i, name in enumerate(ingest_rows.COLUMNS)}


_TIMEOUTS = {Kind.TIMEOUT_HEADERS.value, Kind.TIMEOUT_FIRST_TOKEN.value, Kind.TIMEOUT_TOTAL.value}


def _tokens(text: str) -> int:
    """About how many tokens a prompt is (four characters a token): the tokenizer takes a
    second to load, and a few tokens more or less of a step's prompt change no figure here."""
    return max(1, round(len(text) / 4))


@dataclass(frozen=True)
class _Step:
    """A scenario step as the route is sent it (monitor.pipeline.beat.scenarios.scenario_message)."""

    calls: int  # 1, or a fan-out's
    document_tokens: int
    prompt: str  # its template, `{input}` the eval case's
    carry_context: bool
    max_tokens: int  # the answer bound (the route's token limit is sent)
    shape: Shape


@dataclass(frozen=True)
class ScenarioRuns:
    """One (scenario task, route, region) run through the history."""

    task: Task
    route: Route
    region: Region
    sim: Simulated
    steps: list[_Step]
    cases: list[EvalCase]
    reference: tuple[str, str, str, str]  # what scenarios run (Task.reference)
    rtt_ms: float
    phase: float
    interval_s: int = SCENARIO_INTERVAL_S

    @classmethod
    def of(
        cls,
        task: Task,
        route: Route,
        region: Region,
        sim: Simulated,
        cases: list[EvalCase],
        rtt: Mapping[str, float],
    ) -> ScenarioRuns:
        steps = [
            _Step(
                calls=s.fan_out if s.kind == STEP_FAN_OUT else 1,
                document_tokens=s.input_tokens,
                prompt=s.prompt_template,
                carry_context=s.carry_context,
                max_tokens=s.max_tokens,
                shape=shape_for(sim, route, s.max_tokens),
            )
            for s in task.steps.all()
        ]
        return cls(
            task=task,
            route=route,
            region=region,
            sim=sim,
            steps=steps,
            cases=cases,
            reference=task.reference(route.provider),
            rtt_ms=rtt.get(region.slug, 0.0),
            phase=phase_s(task.pk, route.pk, region.pk, SCENARIO_INTERVAL_S),
        )

    def last_slots(self, end: datetime) -> list[datetime]:
        """The slots on the task's live schedule in its last interval and deadline: a run as
        long as its deadline allows has ended by now (one started in that interval), so every
        route's last run is fresh (Task.stale_after) however slow the route; and they are the
        runs live probing would have made in that time."""
        interval = self.task.probe_interval_s
        since = end - timedelta(seconds=interval + self.task.probe_timeout_s)
        phase = phase_s(self.task.pk, self.route.pk, self.region.pk, interval)
        hourly = set(history_slot_times(since, end, self.phase, self.interval_s))
        return [at for at in history_slot_times(since, end, phase, interval) if at not in hourly]

    def run(self, at: datetime, rng: random.Random) -> tuple[ScenarioResult, list[dict[str, Any]]]:
        """One scenario from its slot: the result and its calls' payloads (ms after `at`)."""
        task = self.task
        n = slot_number(at, self.phase, self.interval_s)
        case = self.cases[n % len(self.cases)] if self.cases else None
        deadline_ms = task.probe_timeout_s * 1000.0
        # monitor.pipeline.region.worker.spec_for: the first token within 3/4 of the deadline.
        first_token_ms = min(deadline_ms, max(5000.0, deadline_ms * 0.75))
        system_tokens = _tokens(task.system_prompt) + 8  # probes.scenario's framing allowance
        context = 0
        took_ms = 0.0
        gaps: list[float] = []
        calls: list[dict[str, Any]] = []
        failed: tuple[int, str, str] | None = None
        passed: bool | None = None
        for index, step in enumerate(self.steps):
            gap = GAP_MS * lognormal_factor(0.3, rng)
            left = deadline_ms - took_ms - gap
            if left < MIN_CALL_S * 1000.0:
                late = f"step {index + 1} did not finish within the scenario's deadline of "
                failed = (index, Kind.TIMEOUT_TOTAL.value, late + f"{task.probe_timeout_s} s")
                break
            took_ms += gap
            gaps.append(gap)
            prompt = _tokens(step.prompt.replace("{input}", case.input if case else ""))
            input_tokens = system_tokens + step.document_tokens + prompt
            input_tokens += context if step.carry_context else 0
            last = index == len(self.steps) - 1
            graded = last and case is not None
            draws = self._draws(step, input_tokens, graded, left, first_token_ms, rng)
            sent = at + timedelta(milliseconds=took_ms)
            calls += [self._call(d, sent, index, input_tokens) for d, _ in draws]
            took_ms += max(ms for _, ms in draws) + RETURN_MS
            bad = [i for i, (d, _) in enumerate(draws) if not d.ok]
            if bad:
                kind = draws[bad[0]][0].error_kind
                where = f" (call {bad[0] + 1} of {step.calls})" if step.calls > 1 else ""
                failed = (index, kind, f"step {index + 1}{where} failed: a simulated {kind}")
                break
            # The conversation so far: the step's prompt and its answers (probes.scenario).
            context += prompt + sum(d.answer_tokens for d, _ in draws) + 2
            if last and case is not None:
                # The ANSWER line is the answer's last: a cut answer (max_tokens) fails.
                full = self.sim.profile.output_tokens
                passed = any(bool(d.correct) and d.answer_tokens >= full for d, _ in draws)
        validation_ms = None
        if failed is None and case is not None:
            gap = GAP_MS * lognormal_factor(0.3, rng)
            gaps.append(gap)
            validation_ms = VALIDATION_MS
            took_ms += gap + validation_ms
        result = ScenarioResult(
            task=task,
            route=self.route,
            region=self.region,
            slot_at=at,
            started_at=at,
            app_e2e_ms=took_ms,
            calls_e2e_ms=sum(c.get("e2e_ms") or 0.0 for c in calls),
            gaps_ms=gaps,
            outcome=OUTCOME_OK if failed is None else OUTCOME_ERROR,
            failed_step=failed[0] if failed else None,
            error_kind=failed[1] if failed else "",
            error_detail=f"generated demo history: {failed[2]}" if failed else "",
            validation_ms=validation_ms,
            validation_pass=passed if failed is None else None,
            eval_case=case,
            call_count=len(calls),
            generated=True,
        )
        return result, calls

    def _draws(
        self,
        step: _Step,
        input_tokens: int,
        graded: bool,
        left_ms: float,
        first_token_ms: float,
        rng: random.Random,
    ) -> list[tuple[Draw, float]]:
        """One step's calls (its fan-out), each cut to what is left of the deadline."""
        draws = []
        for _ in range(step.calls):
            d = draw(
                self.sim,
                step.shape,
                input_tokens=input_tokens,
                prefix_mode=PREFIX_STABLE,
                graded=graded,
                rtt_ms=self.rtt_ms,
                rng=rng,
            )
            draws.append(_in_time(d, left_ms, min(first_token_ms, left_ms)))
        return draws

    def _call(self, d: Draw, at: datetime, step: int, input_tokens: int) -> dict[str, Any]:
        """A call's payload as monitor.pipeline.region.scenarios.run sends it (no slot of its own)."""
        call = payload(
            d,
            task=self.task,
            route=self.route,
            region=self.region,
            at=at,
            variant=self.reference,
            eval_case_id=None,
            sim=self.sim,
        )
        max_tokens = self.route.token_limit(self.steps[step].max_tokens)
        return {
            **call,
            "slot_at": None,
            "max_tokens": max_tokens,
            "input_tokens": input_tokens,
            "step": step,
            "reference": False,
        }


def _in_time(d: Draw, left_ms: float, first_ms: float) -> tuple[Draw, float]:
    """A call within what is left of the scenario's deadline (`left_ms`, its first token within
    `first_ms`): the draw as the engine reports it, and how long the call took. A fault ends
    the call at its response headers, a stall at its deadline; a call too slow for what is
    left is stopped there (probes.engine's timeouts)."""
    if not d.ok:
        if d.error_kind == Kind.TIMEOUT_HEADERS.value:
            return d, first_ms
        if d.error_kind in _TIMEOUTS:
            return d, left_ms
        return d, min(d.ttfb_ms or 0.0, left_ms)
    if d.e2e_ms is not None and d.e2e_ms <= left_ms:
        return d, d.e2e_ms
    if d.ttfb_ms is not None and d.ttfb_ms > first_ms:
        kind, took, ttfb, ttft = Kind.TIMEOUT_HEADERS, first_ms, None, None
    elif d.ttft_ms is not None and d.ttft_ms > first_ms:
        kind, took, ttfb, ttft = Kind.TIMEOUT_FIRST_TOKEN, first_ms, d.ttfb_ms, None
    else:
        kind, took, ttfb, ttft = Kind.TIMEOUT_TOTAL, left_ms, d.ttfb_ms, d.ttft_ms
    stopped = replace(
        d,
        ok=False,
        error_kind=kind.value,
        ttfb_ms=ttfb,
        ttft_ms=ttft,
        ttfat_ms=None,
        e2e_ms=None,
        answer_tokens=0,
        reasoning_tokens=0,
        hidden_reasoning_tokens=0,
        correct=None,
    )
    return stopped, took


def write_scenarios(
    due: list[tuple[ScenarioRuns, datetime]], end: datetime, rng: random.Random
) -> tuple[int, int]:
    """Run the due scenarios and store them as ingest_scenario does: each ScenarioResult with
    its calls' totals, its calls as ProbeResult rows (not folded in one by one), the scenario
    folded into the rollups by rollup_writes.scenario_row. A run that would end after `end` is still
    running: left out. Returns how many runs and calls were written."""
    made: list[tuple[ScenarioResult, list[tuple[Any, ...]]]] = []
    for runs, at in due:
        result, calls = runs.run(at, rng)
        if at + timedelta(milliseconds=result.app_e2e_ms or 0.0) > end:
            continue
        rows = [ingest_rows.row_from_payload(c, {runs.route.pk: runs.route}, end) for c in calls]
        _add_totals(result, rows)
        made.append((result, rows))
    if not made:
        return 0, 0
    with transaction.atomic():
        stored = _copy_scenarios([result for result, _ in made])
        i = _COLUMN["scenario_id"]
        linked = [
            (*row[:i], result.pk, *row[i + 1 :])
            for result, (_, rows) in zip(stored, made, strict=True)
            for row in rows
        ]
        inserted = ingest.insert_rows(linked)
        started = [row[_COLUMN["started_at"]] for row in linked]
        if started:  # the pages' one-row record of the generated history (as ingest keeps it)
            GeneratedSpan.widen(min(started), max(started))
        rollup_writes.apply([rollup_writes.scenario_row(result) for result in stored])
    return len(stored), len(inserted)


def _copy_scenarios(results: list[ScenarioResult]) -> list[ScenarioResult]:
    """Insert the results with COPY, their ids drawn from the table's sequence first (a
    bulk_create's statement binds every value in Python: seconds for a day of runs)."""
    table = ScenarioResult._meta.db_table
    fields = ScenarioResult._meta.concrete_fields
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [table, len(results)],
        )
        for result, (pk,) in zip(results, cursor.fetchall(), strict=True):
            result.pk = pk
        with (
            connection.wrap_database_errors,
            cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
        ):
            for result in results:
                copy.write_row([getattr(result, f.attname) for f in fields])
    return results


def _add_totals(result: ScenarioResult, rows: list[tuple[Any, ...]]) -> None:
    """The calls' tokens and cost on the scenario, as ingest_scenario sums them."""

    def column(name: str) -> list[Any]:
        return [row[_COLUMN[name]] for row in rows if row[_COLUMN[name]] is not None]

    cached = column("cached_tokens")
    result.input_tokens = sum(column("input_tokens"))
    result.output_tokens = sum(column("output_tokens"))
    result.cached_tokens = sum(cached) if cached else None
    result.cost_usd = sum(column("cost_usd"), Decimal("0"))
