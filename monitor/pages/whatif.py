"""The what-if calculator: how long N calls of X input / Y output tokens take on each route.

One call takes its time to first token plus its output at the route's generation speed
(tokens per second measured after the first token, so the two add up without overlap):

    per call = TTFT + Y / speed
    total    = ceil(N / P) x per call        (P calls at a time; P = 1 is strictly sequential)

The seeds' example: 10 sequential calls of 10k in / 500 out take 10 x (1.62 s + 500 / 1,823)
= 18.9 s at TTFT 1.62 s and 1,823 tok/s, and 10 x (75.1 s + 500 / 60) = 13 min 54 s at
TTFT 75.1 s and 60 tok/s: 44x. TTFT is used as measured at the task's own input size; the
input tokens count toward cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

MAX_CALLS = 100_000
MAX_TOKENS = 10_000_000
CUSTOM_ROWS = 2  # hypothetical routes a reader may type in (a published benchmark, say)


@dataclass(frozen=True)
class Scenario:
    calls: int = 10
    input_tokens: int = 10_000
    output_tokens: int = 500
    parallel: int = 1

    @property
    def waves(self) -> int:
        """Rounds of calls: P at a time, each round as long as one call."""
        return math.ceil(self.calls / max(1, self.parallel))


@dataclass(frozen=True)
class Estimate:
    per_call_ms: float
    total_ms: float


def estimate(scenario: Scenario, ttft_ms: float, tokens_per_s: float) -> Estimate:
    """Total time of the scenario on a route with this TTFT and generation speed."""
    if tokens_per_s <= 0:
        raise ValueError("generation speed must be positive")
    per_call_ms = ttft_ms + 1000.0 * scenario.output_tokens / tokens_per_s
    return Estimate(per_call_ms=per_call_ms, total_ms=scenario.waves * per_call_ms)


@dataclass(frozen=True)
class Speed:
    """What the calculator needs of one route (measured, or typed in)."""

    name: str
    ttft_ms: float | None
    tokens_per_s: float | None
    price_input_per_mtok: Decimal | None = None
    price_output_per_mtok: Decimal | None = None
    route_id: int | None = None  # None: a hypothetical route typed into the form


@dataclass(frozen=True)
class Line:
    speed: Speed
    estimate: Estimate | None  # None: too few samples to say
    ratio: float | None  # total / the fastest total (1.0 for the fastest)
    cost_usd: Decimal | None


def compare(scenario: Scenario, speeds: Sequence[Speed]) -> list[Line]:
    """One line per route, fastest first; routes without figures last."""
    estimates = [
        estimate(scenario, s.ttft_ms, s.tokens_per_s)
        if s.ttft_ms is not None and s.tokens_per_s
        else None
        for s in speeds
    ]
    fastest = min((e.total_ms for e in estimates if e), default=None)
    lines = []
    for speed, est in zip(speeds, estimates, strict=True):
        cost = None
        if speed.price_input_per_mtok is not None and speed.price_output_per_mtok is not None:
            cost = (
                (
                    speed.price_input_per_mtok * scenario.input_tokens
                    + speed.price_output_per_mtok * scenario.output_tokens
                )
                * scenario.calls
                / Decimal(1_000_000)
            )
        ratio = est.total_ms / fastest if est and fastest else None
        lines.append(Line(speed=speed, estimate=est, ratio=ratio, cost_usd=cost))
    lines.sort(
        key=lambda line: (line.estimate is None, line.estimate.total_ms if line.estimate else 0)
    )
    return lines


def _bounded_int(value: str | None, default: int, low: int, high: int) -> tuple[int, str]:
    if value in (None, ""):
        return default, ""
    try:
        number = int(str(value).replace(",", "").replace("_", "").strip())
    except ValueError:
        return default, f"{value!r} is not a whole number"
    if not low <= number <= high:
        return default, f"{number:,} is outside {low:,} to {high:,}"
    return number, ""


def _positive_float(value: str | None) -> float | None:
    try:
        number = float(str(value).replace(",", "").strip())
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


@dataclass(frozen=True)
class Form:
    scenario: Scenario
    custom: list[Speed]
    errors: list[str]


def parse(params: Mapping[str, str]) -> Form:
    """The calculator's query string: calls, input, output, parallel and up to two typed-in
    routes (name_1, ttft_ms_1, tps_1...). Bad values fall back to defaults, with a message."""
    errors = []
    calls, e1 = _bounded_int(params.get("calls"), Scenario.calls, 1, MAX_CALLS)
    inp, e2 = _bounded_int(params.get("input"), Scenario.input_tokens, 0, MAX_TOKENS)
    out, e3 = _bounded_int(params.get("output"), Scenario.output_tokens, 1, MAX_TOKENS)
    par, e4 = _bounded_int(params.get("parallel"), Scenario.parallel, 1, MAX_CALLS)
    for label, err in (("calls", e1), ("input", e2), ("output", e3), ("parallel", e4)):
        if err:
            errors.append(f"{label}: {err}")
    custom = []
    for i in range(1, CUSTOM_ROWS + 1):
        ttft = _positive_float(params.get(f"ttft_ms_{i}"))
        speed = _positive_float(params.get(f"tps_{i}"))
        if ttft is None and speed is None:
            continue
        if ttft is None or speed is None:
            errors.append(f"custom route {i}: give both TTFT (ms) and speed (tok/s)")
            continue
        name = (params.get(f"name_{i}") or "").strip()[:80] or f"custom {i}"
        custom.append(Speed(name=name, ttft_ms=ttft, tokens_per_s=speed))
    return Form(Scenario(calls, inp, out, par), custom, errors)
