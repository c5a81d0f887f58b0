"""One made-up probe of the demo history (monitor.demo_history): drawn from the simulated
route's model profile the way the simulator draws a response, with the provider's faults at
their rates and the region's round trip, and the result payload ingest takes; and the
history's slot times.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from monitor.models import (
    CONN_COLD,
    HTTP_2,
    OUTCOME_ERROR,
    OUTCOME_OK,
    PREFIX_STABLE,
    Region,
    Route,
    Task,
)
from monitor.pipeline.beat.slots import EPOCH
from monitor.pipeline.messages import (
    ResultPayload,
)
from probes import prompts
from probes.errors import Kind
from probes.formats import wire_format
from probes.model import ProbeSpec
from simulator.config import Config, Profile
from simulator.config import Provider as SimProvider
from simulator.generation import BLOCK_TOKENS, MIN_CACHEABLE_TOKENS, Shape, lognormal_factor
from simulator.profiles import PROFILES

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


def history_slot_times(
    start: datetime, end: datetime, phase: float, interval_s: int
) -> Iterator[datetime]:
    first = math.ceil(((start - EPOCH).total_seconds() - phase) / interval_s)
    at = EPOCH + timedelta(seconds=phase + first * interval_s)
    step = timedelta(seconds=interval_s)
    while at < end:
        yield at
        at += step
