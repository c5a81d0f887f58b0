"""Racing: the same request to several routes at once; the first complete valid answer wins.

The others are cancelled the moment a winner is known. A race records each route's time (its
e2e if it finished, the time until it was cancelled otherwise), the winner, the time saved
against each single route (against its own finish when it finished with a valid answer,
against a reference such as its recent median when it was cancelled, none when its answer was
not valid), and the output tokens streamed by the losers before they were stopped (what the
race cost on top of the winner).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from probes.engine import Progress, probe
from probes.model import Measurement, ProbeSpec
from probes.tokenizer import count_tokens


@dataclass
class Lane:
    name: str
    result: Measurement | None = None  # None when cancelled
    elapsed_ms: float = 0.0
    cancelled: bool = False
    tokens_paid: int = 0
    saved_ms: float | None = None


@dataclass
class RaceMeasurement:
    winner: str | None
    winner_ms: float | None
    lanes: dict[str, Lane] = field(default_factory=dict)

    @property
    def loser_tokens(self) -> int:
        return sum(lane.tokens_paid for name, lane in self.lanes.items() if name != self.winner)


async def race(
    specs: Mapping[str, ProbeSpec],
    *,
    valid: Callable[[Measurement], bool] = lambda r: r.ok,
    reference_ms: Mapping[str, float] | None = None,
) -> RaceMeasurement:
    progress = {name: Progress() for name in specs}
    t0 = time.perf_counter()
    tasks = {asyncio.create_task(probe(spec, progress[name])): name for name, spec in specs.items()}
    lanes = {name: Lane(name) for name in specs}
    winner: str | None = None
    pending = set(tasks)
    try:
        while pending and winner is None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                name = tasks[task]
                result = task.result()
                lane = lanes[name]
                lane.result = result
                lane.elapsed_ms = (time.perf_counter() - t0) * 1000
                lane.tokens_paid = result.output_tokens or 0
                if winner is None and valid(result):
                    winner = name
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    stopped = (time.perf_counter() - t0) * 1000
    for task in pending:
        name = tasks[task]
        lane = lanes[name]
        lane.cancelled = True
        lane.elapsed_ms = stopped
        seen = "".join(progress[name].reasoning_parts + progress[name].text_parts)
        lane.tokens_paid = count_tokens(seen) if seen else 0
    winner_ms = lanes[winner].elapsed_ms if winner else None
    if winner_ms is not None:
        for name, lane in lanes.items():
            if name == winner:
                lane.saved_ms = 0.0
            elif lane.result is not None:
                # A route whose own answer was not valid would not have answered alone.
                lane.saved_ms = lane.elapsed_ms - winner_ms if valid(lane.result) else None
            elif reference_ms and name in reference_ms:
                lane.saved_ms = reference_ms[name] - winner_ms
    return RaceMeasurement(winner=winner, winner_ms=winner_ms, lanes=lanes)
