"""Demo history: a week of results for the simulated routes, so a fresh demo shows every page at
once instead of empty charts for its first hour.

Made up, not measured. Each result is drawn from the simulated route's own model profile (the
simulator's TOML, simulator/configs/demo.toml) the way the simulator draws a response
(simulator.generation.plan): a lognormal queue around queue_ms, the uncached input tokens over
prefill_tokens_per_s, a decode rate with its per-request jitter, reasoning before the answer as
the model profile shapes the request (simulator.profiles), the provider's faults at their
configured rates; plus the region's round trip. Slots, option combinations and eval cases are
the scheduler's own (monitor.pipeline.beat.slots), at a sparser interval, and every result goes
through the real ingest path (monitor.pipeline.ingest.results.ingest), so rollups, hour strips and the
reference flags are what live probes make. Races go through monitor.pipeline.ingest.races.ingest.

A scenario task gets whole runs (hourly, and its last slots on its live schedule): its steps'
calls drawn one after another on the route as probes.scenario makes them (each call's input
the document plus the conversation so far, the step's token limit, the scenario's deadline
stopping a call that would overrun it), stored as monitor.pipeline.ingest.scenarios.ingest_scenario
stores one (a ScenarioResult, its calls as ProbeResult rows through ingest.insert_rows) and
folded into the rollups by its `rollup_row`, a day of them at a time.

Every row is marked `generated` (ProbeResult, RaceRun, ScenarioResult); pages say so and can
leave it out (monitor.pages.common.demo_history). It is never added to a database that holds a
measured result, and never twice. The history runs up to the moment it is made, so the
overview has fresh winners until live probes take over; a reader hiding it sees the rollup
pages from the next hour on (the current hour's rollups hold both).

Longer than our modules should be: the scenario runs (at the end) reuse the draws and payloads
above and are written beside them; they would be the part to move out when it grows.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from monitor import partitions
from monitor.models import (
    CONN_COLD,
    HTTP_2,
    OUTCOME_ERROR,
    OUTCOME_OK,
    PREFIX_STABLE,
    STEP_FAN_OUT,
    EvalCase,
    GeneratedSpan,
    OverviewSnapshot,
    ProbeResult,
    RaceRun,
    Region,
    Route,
    ScenarioResult,
    Task,
)
from monitor.pipeline.beat import races
from monitor.pipeline.beat.scheduling import active_eval_cases
from monitor.pipeline.beat.slots import EPOCH, assignment, options_for, phase_s, slot_number
from monitor.pipeline.ingest import races as ingest_races
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.ingest import rows as ingest_rows
from monitor.pipeline.ingest import scenarios
from monitor.pipeline.messages import (
    LaneResult,
    RaceResult,
    ResultPayload,
    race_result_to_json,
    results_to_json,
)
from monitor.stats import rollups
from probes import prompts
from probes.errors import Kind
from probes.formats import wire_format
from probes.model import ProbeSpec
from probes.scenario import MIN_CALL_S
from simulator.config import Config, Profile
from simulator.config import Provider as SimProvider
from simulator.generation import BLOCK_TOKENS, MIN_CACHEABLE_TOKENS, Shape, lognormal_factor
from simulator.profiles import PROFILES

log = logging.getLogger(__name__)

DAYS = 7
# Sparser than live probing (a week at the live rate would be half a million rows, minutes to
# write) but dense enough for every hourly chart point's median in each region.
PROBE_INTERVAL_S = 600
RACE_INTERVAL_S = 7200
# A scenario is ten calls or so: hourly runs give each route an app e2e figure in every hour of
# the charts (per region) at a tenth of the probes' rows.
SCENARIO_INTERVAL_S = 3600

# The simulator's faults as the probe engine reports them (probes.errors.Kind). Faults that do
# not fail a probe (a missing usage block, a refused stream_options...) are left out.
FAULT_KINDS = {
    "http_500": Kind.HTTP_5XX,
    "http_503": Kind.HTTP_5XX,
    "http_529": Kind.HTTP_5XX,
    "http_429": Kind.HTTP_429,
    "stall_headers": Kind.TIMEOUT_HEADERS,
    "stall_mid": Kind.TIMEOUT_TOTAL,
    "trickle": Kind.TIMEOUT_TOTAL,
    "malformed_chunk": Kind.MALFORMED_STREAM,
    "stream_error": Kind.STREAM_ERROR,
    "huge_response": Kind.TOO_LARGE,
    "huge_line": Kind.TOO_LARGE,
    "truncated": Kind.TRUNCATED,
}
# A failure before any response headers has no time to first byte.
_NO_HEADERS = {Kind.TIMEOUT_HEADERS}


@dataclass(frozen=True)
class Simulated:
    """A route's simulated counterpart: its provider and model profile in the simulator."""

    provider: SimProvider
    profile: Profile


def counterparts(config: Config, routes: list[Route]) -> dict[int, Simulated]:
    """Route id -> its simulated provider and model, as load_demo named them (an Azure
    deployment is a provider of its own, `<slug>-<model>`)."""
    by_slug: dict[tuple[str, str], Simulated] = {}
    for sim in config.providers.values():
        for model in sim.models.values():
            by_slug[(sim.slug, model.id)] = Simulated(sim, model)
            by_slug[(f"{sim.slug}-{model.id}", model.id)] = Simulated(sim, model)
    out = {}
    for route in routes:
        found = by_slug.get((route.provider.slug, route.model_id))
        if route.provider.is_simulated and found is not None:
            out[route.pk] = found
    return out


def request_body(route: Route, answer_tokens: int) -> dict[str, Any]:
    """The body the probe engine sends for this route, in its wire format, for an answer of up
    to `answer_tokens` (a task's or a scenario step's max_tokens): what a profile reads. Built
    by the engine's own format (an empty prompt: profiles read the model parameters)."""
    spec = ProbeSpec(
        base_url="",
        format=route.provider.wire_format,
        model=route.model_id,
        max_tokens=route.token_limit(answer_tokens),
        token_limit_param=route.token_limit_param,
        reasoning_effort=route.reasoning_effort or None,
        thinking_budget_tokens=route.thinking_budget_tokens,
        service_tier=route.service_tier or None,
        temperature=route.temperature,
        extra_body=dict(route.extra_body or {}),
    )
    return wire_format(spec.format).body(spec, prompts.build("", "", 0, False), False)


def shape_for(sim: Simulated, route: Route, answer_tokens: int) -> Shape:
    """How the simulator's model profile reads this route's request."""
    return PROFILES[sim.profile.profile].read(request_body(route, answer_tokens), sim.profile).shape


def cached_tokens(input_tokens: int, prefix_mode: str) -> int:
    """A stable prefix probed every few minutes stays in the simulator's prompt cache (whole
    blocks of BLOCK_TOKENS, from MIN_CACHEABLE_TOKENS); the block holding the question does
    not. A fresh prefix never hits."""
    if prefix_mode != PREFIX_STABLE or input_tokens < MIN_CACHEABLE_TOKENS:
        return 0
    return max(0, (input_tokens // BLOCK_TOKENS - 1) * BLOCK_TOKENS)


@dataclass
class Draw:
    """One simulated response, as the probe engine would measure it (times in ms)."""

    ok: bool
    error_kind: str
    ttfb_ms: float | None
    ttft_ms: float | None
    ttfat_ms: float | None
    e2e_ms: float | None
    tokens_per_s: float
    answer_tokens: int
    reasoning_tokens: int
    hidden_reasoning_tokens: int
    cached_tokens: int
    correct: bool | None


def draw(
    sim: Simulated,
    shape: Shape,
    *,
    input_tokens: int,
    prefix_mode: str,
    graded: bool,
    rtt_ms: float,
    rng: random.Random,
) -> Draw:
    """One response drawn as simulator.generation.plan draws it, without its tokens."""
    profile, provider = sim.profile, sim.provider
    fault = next(
        (
            FAULT_KINDS[name]
            for name, p in provider.faults.items()
            if name in FAULT_KINDS and rng.random() < p
        ),
        None,
    )
    cached = cached_tokens(input_tokens, prefix_mode)
    queue_s = profile.queue_ms / 1000.0 * lognormal_factor(profile.queue_sigma, rng)
    queue_s *= shape.queue_factor
    prefill_s = max(0, input_tokens - cached) / profile.prefill_tokens_per_s
    rate = profile.decode_tokens_per_s * lognormal_factor(profile.decode_sigma, rng)
    rate *= shape.rate_factor
    budget = max(1, shape.max_tokens)
    if shape.reasoning_in_max:
        n_reasoning = min(shape.reasoning_tokens, max(0, budget - shape.answer_room))
        room = budget - n_reasoning
    else:
        n_reasoning, room = shape.reasoning_tokens, budget
    shown = (
        0
        if shape.shown_ratio <= 0 or n_reasoning == 0
        else max(1, round(n_reasoning * shape.shown_ratio))
    )
    shown = min(shown, n_reasoning)
    answer = min(profile.output_tokens, room) if room > 0 else 0
    first_token_s = queue_s + prefill_s
    # The first streamed token: the first shown reasoning token, else the first answer token.
    first_shown_s = first_token_s + (0.0 if shown else n_reasoning / rate)
    first_answer_s = first_token_s + n_reasoning / rate
    end_s = first_token_s + max(0, n_reasoning + answer - 1) / rate
    headers_s = queue_s if provider.headers_after_queue else 0.0
    correct = rng.random() < profile.quality if graded else None
    ms = 1000.0
    if fault is not None:
        return Draw(
            ok=False,
            error_kind=fault.value,
            ttfb_ms=None if fault in _NO_HEADERS else rtt_ms + headers_s * ms,
            ttft_ms=None,
            ttfat_ms=None,
            e2e_ms=None,
            tokens_per_s=rate,
            answer_tokens=0,
            reasoning_tokens=0,
            hidden_reasoning_tokens=0,
            cached_tokens=cached,
            correct=None,
        )
    return Draw(
        ok=True,
        error_kind="",
        ttfb_ms=rtt_ms + headers_s * ms,
        ttft_ms=rtt_ms + first_shown_s * ms,
        ttfat_ms=rtt_ms + first_answer_s * ms if answer else None,
        e2e_ms=rtt_ms + end_s * ms,
        tokens_per_s=rate,
        answer_tokens=answer,
        reasoning_tokens=n_reasoning,
        hidden_reasoning_tokens=n_reasoning - shown,
        cached_tokens=cached,
        correct=correct,
    )


def payload(
    d: Draw,
    *,
    task: Task,
    route: Route,
    region: Region,
    at: datetime,
    variant: tuple[str, str, str, str],
    eval_case_id: int | None,
    sim: Simulated,
) -> ResultPayload:
    http_version, body, connection_mode, prefix = variant
    out: ResultPayload = {
        "task_id": task.pk,
        "route_id": route.pk,
        "region_id": region.pk,
        "slot_at": at.isoformat(),
        "started_at": at.isoformat(),
        "outcome": OUTCOME_OK if d.ok else OUTCOME_ERROR,
        "http2": http_version == HTTP_2,
        "body_encoding": body,
        "cold": connection_mode == CONN_COLD,
        "prefix_mode": prefix,
        "max_tokens": route.token_limit(task.max_tokens),
        "eval_case_id": eval_case_id,
        "quality_pass": d.correct,
        "error_kind": d.error_kind,
        "error_detail": f"generated demo history: a simulated {d.error_kind}" if not d.ok else "",
        "ttfb_ms": d.ttfb_ms,
        "ttft_ms": d.ttft_ms,
        "ttfat_ms": d.ttfat_ms,
        "e2e_ms": d.e2e_ms,
        "input_tokens": task.input_tokens,
        "cached_tokens": d.cached_tokens if d.ok else None,
        "http_version": "HTTP/2" if http_version == HTTP_2 else "HTTP/1.1",
        "text": "",
        "generated": True,
    }
    if d.ok:
        out["output_tokens"] = d.answer_tokens + d.reasoning_tokens
        out["token_source"] = "usage"  # noqa: S105 (a source, not a password)
        if d.answer_tokens > 1:
            out["tps"] = d.tokens_per_s
            out["tpot_ms"] = 1000.0 / d.tokens_per_s
    extra: dict[str, Any] = {
        "served_model": sim.profile.model_name,
        "reasoning_tokens": d.reasoning_tokens if d.ok and d.reasoning_tokens else None,
        "hidden_reasoning_tokens": (
            d.hidden_reasoning_tokens if d.ok and d.reasoning_tokens else None
        ),
        "streamed_output_tokens": d.answer_tokens if d.ok else None,
    }
    # Columns the contract does not list yet flow through ingest as they are (row_from_payload).
    return {**out, **extra}  # type: ignore[typeddict-item]


def _slot_times(
    start: datetime, end: datetime, phase: float, interval_s: int
) -> Iterator[datetime]:
    first = math.ceil(((start - EPOCH).total_seconds() - phase) / interval_s)
    at = EPOCH + timedelta(seconds=phase + first * interval_s)
    step = timedelta(seconds=interval_s)
    while at < end:
        yield at
        at += step


@dataclass(frozen=True)
class _Series:
    """One (task, route, region) probed through the history, as the scheduler would."""

    task: Task
    route: Route
    region: Region
    sim: Simulated
    shape: Shape
    variants: list[tuple[str, str, str, str]]
    reference: tuple[str, str, str, str]
    phase: float
    case_ids: list[int]

    @classmethod
    def of(
        cls, task: Task, route: Route, region: Region, sim: Simulated, cases: list[EvalCase]
    ) -> _Series:
        return cls(
            task=task,
            route=route,
            region=region,
            sim=sim,
            shape=shape_for(sim, route, task.max_tokens),
            variants=options_for(task, route.provider),
            reference=task.reference(route.provider),
            phase=phase_s(task.pk, route.pk, region.pk, PROBE_INTERVAL_S),
            case_ids=[c.pk for c in cases],
        )

    def payload_at(self, at: datetime, rtt_ms: float, rng: random.Random) -> ResultPayload:
        n = slot_number(at, self.phase, PROBE_INTERVAL_S)
        variant, case_index = assignment(n, self.variants, self.reference, len(self.case_ids))
        case_id = self.case_ids[case_index] if self.case_ids else None
        d = draw(
            self.sim,
            self.shape,
            input_tokens=self.task.input_tokens,
            prefix_mode=variant[3],
            graded=case_id is not None,
            rtt_ms=rtt_ms,
            rng=rng,
        )
        return payload(
            d,
            task=self.task,
            route=self.route,
            region=self.region,
            at=at,
            variant=variant,
            eval_case_id=case_id,
            sim=self.sim,
        )


def has_real_data() -> bool:
    return (
        ProbeResult.objects.filter(generated=False).exists()
        or RaceRun.objects.filter(generated=False).exists()
        or ScenarioResult.objects.filter(generated=False).exists()
    )


def generate(
    config: Config,
    *,
    rtt_ms: Mapping[str, float] | None = None,
    now: datetime | None = None,
    days: int = DAYS,
    seed: int = 1,
) -> int:
    """Add `days` of demo history up to now; returns how many results were written (0: the database holds measured results, or history already)."""
    if has_real_data():
        log.info("demo history not added: the database holds measured results")
        return 0
    if ProbeResult.objects.filter(generated=True).exists():
        log.info("demo history not added: it is there already")
        return 0
    end = (now or timezone.now()).replace(microsecond=0)
    start = end - timedelta(days=days)
    rng = random.Random(seed)
    tasks = list(
        Task.objects.filter(is_active=True)
        .prefetch_related("routes__provider", "regions", "steps")
        .order_by("pk")
    )
    cases = active_eval_cases()
    rtt = rtt_ms or {}
    series = []
    runs: list[_Runs] = []  # a scenario task's: whole runs, not single probes
    for task in tasks:
        routes = [r for r in task.routes.all() if r.is_active and r.provider.is_active]
        sims = counterparts(config, routes)
        for region in task.regions.filter(is_active=True).order_by("pk"):
            for route in routes:
                if route.pk not in sims:  # not a simulated route: no profile to draw from
                    continue
                sim, case_list = sims[route.pk], cases[task.pk]
                if task.is_scenario:
                    runs.append(_Runs.of(task, route, region, sim, case_list, rtt))
                else:
                    series.append(_Series.of(task, route, region, sim, case_list))
    written = ran_total = 0
    # The history's days get their partitions first (beat creates only the days ahead), so
    # each day is written and analyzed on its own, not into the default partition.
    for n in range(days + 1):
        partitions.create_day(start + timedelta(days=n))
    # A day of every series at a time: each hourly rollup row is written once per batch.
    chunk = timedelta(days=1)
    at = start
    while at < end:
        upto = min(at + chunk, end)
        pending = [
            s.payload_at(when, rtt.get(s.region.slug, 0.0), rng)
            for s in series
            for when in _slot_times(at, upto, s.phase, PROBE_INTERVAL_S)
        ]
        written += ingest.ingest(results_to_json(pending))
        due = [(r, when) for r in runs for when in _slot_times(at, upto, r.phase, r.interval_s)]
        ran, calls = _write_scenarios(due, end, rng)
        ran_total, written = ran_total + ran, written + calls
        # Statistics for the days just written: the next day's exactly-once check reads them.
        partitions.analyze(at, upto)
        at = upto
    # And each series' last slot on its live schedule: the figures are fresh (Task.stale_after)
    # until live probes take over, however sparse the history before it.
    tail = []
    for one in series:
        interval = one.task.probe_interval_s
        phase = phase_s(one.task.pk, one.route.pk, one.region.pk, interval)
        since = end - timedelta(seconds=interval)
        tail += [
            one.payload_at(when, rtt.get(one.region.slug, 0.0), rng)
            for when in _slot_times(since, end, phase, interval)
        ]
    written += ingest.ingest(results_to_json(tail))
    # A scenario task's last runs on its live schedule: since its deadline plus an interval,
    # so one has ended by now however long the route takes (Task.stale_after).
    ran, calls = _write_scenarios([(r, at) for r in runs for at in r.last_slots(end)], end, rng)
    ran_total, written = ran_total + ran, written + calls
    raced = _races(tasks, config, start, end, rtt, rng)
    # An overview computed while the history was being written (an open page refreshing
    # itself) lacks most of it: drop it, so the next read has the whole history at once.
    OverviewSnapshot.objects.all().delete()
    log.info(
        "demo history: %d generated results (scenario calls included), %d scenario runs "
        "and %d races from %s to %s",
        written,
        ran_total,
        raced,
        start.isoformat(),
        end.isoformat(),
    )
    return written


def _races(
    tasks: list[Task],
    config: Config,
    start: datetime,
    end: datetime,
    rtt: Mapping[str, float],
    rng: random.Random,
) -> int:
    """Races every RACE_INTERVAL_S for tasks that race: each lane a draw with the task's
    reference options; the first valid answer wins, the others are cancelled at that moment
    (probes.race). Claimed and stored through monitor.pipeline.beat.races like live races."""
    due: list[tuple[Task, Region, datetime]] = []
    for task in tasks:
        if task.race_interval_s is None or task.is_scenario:
            continue
        for region in task.regions.filter(is_active=True).order_by("pk"):
            phase = phase_s(task.pk, 0, region.pk, RACE_INTERVAL_S)
            due.extend((task, region, at) for at in _slot_times(start, end, phase, RACE_INTERVAL_S))
    claimed = races.claim(due)
    count = 0
    for task, region, at in claimed:
        routes = [r for r in task.routes.all() if r.is_active and r.provider.is_active]
        sims = counterparts(config, routes)
        draws = {
            route: draw(
                sims[route.pk],
                shape_for(sims[route.pk], route, task.max_tokens),
                input_tokens=task.input_tokens,
                prefix_mode=task.reference(route.provider)[3],
                graded=False,
                rtt_ms=rtt.get(region.slug, 0.0),
                rng=rng,
            )
            for route in routes
            if route.pk in sims
        }
        finished = {r: d for r, d in draws.items() if d.ok and d.e2e_ms is not None}
        winner = min(finished, key=lambda r: finished[r].e2e_ms or 0.0, default=None)
        winner_ms = finished[winner].e2e_ms if winner else None
        lanes: dict[str, LaneResult] = {}
        for route, d in draws.items():
            lanes[str(route.pk)] = _lane(route, d, winner, winner_ms, task)
        result: RaceResult = {
            "race": {"task_id": task.pk, "region_id": region.pk, "slot_at": at.isoformat()},
            "started_at": at.isoformat(),
            "winner_route_id": str(winner.pk) if winner else None,
            "winner_ms": winner_ms,
            "lanes": lanes,
        }
        count += ingest_races.ingest(race_result_to_json(result))
    with transaction.atomic():
        RaceRun.objects.filter(slot_at__gte=start, slot_at__lt=end).update(generated=True)
    return count


def _lane(
    route: Route, d: Draw, winner: Route | None, winner_ms: float | None, task: Task
) -> LaneResult:
    lane: LaneResult = {
        "elapsed_ms": d.e2e_ms,
        "cancelled": False,
        "tokens_paid": d.answer_tokens + d.reasoning_tokens,
        "saved_ms": None,
        "outcome": OUTCOME_OK if d.ok else OUTCOME_ERROR,
        "error_kind": d.error_kind,
        "input_tokens": task.input_tokens,
    }
    if winner_ms is None:
        return lane
    if route == winner:
        lane["saved_ms"] = 0.0
    elif d.ok and d.e2e_ms is not None and d.e2e_ms > winner_ms:
        # Stopped when the winner finished: it had streamed what it generated by then.
        started = d.ttft_ms if d.ttft_ms is not None else winner_ms
        generated = max(0.0, (winner_ms - started) / 1000.0 * d.tokens_per_s)
        lane["elapsed_ms"] = winner_ms
        lane["cancelled"] = True
        lane["tokens_paid"] = min(round(generated), d.answer_tokens + d.reasoning_tokens)
        lane["saved_ms"] = d.e2e_ms - winner_ms
        lane["outcome"] = "cancelled"
    return lane


# --- scenario runs ----------------------------------------------------------------------------

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
class _Runs:
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
    ) -> _Runs:
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
        hourly = set(_slot_times(since, end, self.phase, self.interval_s))
        return [at for at in _slot_times(since, end, phase, interval) if at not in hourly]

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
            draws = []
            for _ in range(step.calls):
                d = draw(
                    self.sim,
                    step.shape,
                    input_tokens=input_tokens,
                    prefix_mode=PREFIX_STABLE,
                    graded=last and case is not None,
                    rtt_ms=self.rtt_ms,
                    rng=rng,
                )
                draws.append(_in_time(d, left, min(first_token_ms, left)))
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


def _write_scenarios(
    due: list[tuple[_Runs, datetime]], end: datetime, rng: random.Random
) -> tuple[int, int]:
    """Run the due scenarios and store them as ingest_scenario does: each ScenarioResult with
    its calls' totals, its calls as ProbeResult rows (not folded in one by one), the scenario
    folded into the rollups by its rollup_row. A run that would end after `end` is still
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
        rollups.apply([scenarios.rollup_row(result) for result in stored])
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
