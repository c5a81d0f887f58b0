"""Demo history: a week of results for the simulated routes, so a fresh demo shows every page at
once instead of empty charts for its first hour.

Made up, not measured. Each result is drawn from the simulated route's own model profile (the
simulator's TOML, simulator/configs/demo.toml) the way the simulator draws a response
(simulator.generation.plan): a lognormal queue around queue_ms, the uncached input tokens over
prefill_tokens_per_s, a decode rate with its per-request jitter, reasoning before the answer as
the model profile shapes the request (simulator.profiles), the provider's faults at their
configured rates; plus the region's round trip. Slots, option combinations and eval cases are
the scheduler's own (monitor.pipeline.slots), at a sparser interval, and every result goes
through the real ingest path (monitor.pipeline.ingest.ingest), so rollups, hour strips and the
reference flags are what live probes make. Races go through monitor.pipeline.races.ingest.

Every row is marked `generated` (ProbeResult, RaceRun); pages say so and can leave it out
(monitor.pages.common.demo_history). It is never added to a database that holds a measured
result, and never twice. The history runs up to the moment it is made, so the overview has
fresh winners until live probes take over; a reader hiding it sees the rollup pages from the
next hour on (the current hour's rollups hold both).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from monitor import partitions
from monitor.models import (
    CONN_COLD,
    HTTP_2,
    OUTCOME_ERROR,
    OUTCOME_OK,
    PREFIX_STABLE,
    EvalCase,
    OverviewSnapshot,
    ProbeResult,
    RaceRun,
    Region,
    Route,
    Task,
)
from monitor.pipeline import ingest, races
from monitor.pipeline.messages import (
    LaneResult,
    RaceResult,
    ResultPayload,
    race_result_to_json,
    results_to_json,
)
from monitor.pipeline.scheduling import active_eval_cases
from monitor.pipeline.slots import EPOCH, assignment, options_for, phase_s, slot_number
from probes.errors import Kind
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


def request_body(route: Route, task: Task) -> dict[str, Any]:
    """The model parameters the probe engine sends for this route (what a profile reads)."""
    body: dict[str, Any] = {route.token_limit_param: route.token_limit(task.max_tokens)}
    if route.reasoning_effort:
        body["reasoning_effort"] = route.reasoning_effort
    if route.service_tier:
        body["service_tier"] = route.service_tier
    if route.temperature is not None:
        body["temperature"] = route.temperature
    if route.thinking_budget_tokens:
        body["thinking"] = {"type": "enabled", "budget_tokens": route.thinking_budget_tokens}
    return body


def shape_for(sim: Simulated, route: Route, task: Task) -> Shape:
    """How the simulator's model profile reads this route's request."""
    return PROFILES[sim.profile.profile].read(request_body(route, task), sim.profile).shape


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
            shape=shape_for(sim, route, task),
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
        .prefetch_related("routes__provider", "regions")
        .order_by("pk")
    )
    cases = active_eval_cases()
    rtt = rtt_ms or {}
    series = []
    for task in tasks:
        if task.is_scenario:  # a scenario's history would be whole runs, not single probes
            continue
        routes = [r for r in task.routes.all() if r.is_active and r.provider.is_active]
        sims = counterparts(config, routes)
        for region in task.regions.filter(is_active=True).order_by("pk"):
            for route in routes:
                if route.pk in sims:  # else not a simulated route: no profile to draw from
                    series.append(_Series.of(task, route, region, sims[route.pk], cases[task.pk]))
    written = 0
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
    raced = _races(tasks, config, start, end, rtt, rng)
    # An overview computed while the history was being written (an open page refreshing
    # itself) lacks most of it: drop it, so the next read has the whole history at once.
    OverviewSnapshot.objects.all().delete()
    log.info(
        "demo history: %d generated results and %d races from %s to %s",
        written,
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
    (probes.race). Claimed and stored through monitor.pipeline.races like live races."""
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
                shape_for(sims[route.pk], route, task),
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
        count += races.ingest(race_result_to_json(result))
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
