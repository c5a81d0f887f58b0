"""The batch runner."""

from __future__ import annotations

import asyncio

from probes import run_batch
from probes.transport import warm_clients
from simulator.testing import SimulatorProcess
from tests.probes.support import sim_spec


def test_the_batch_runner_spreads_starts_and_keeps_order(sim: SimulatorProcess) -> None:
    specs = [sim_spec(sim, max_tokens=5 + i) for i in range(8)]

    async def run():
        out = await run_batch(specs, window_s=0.4, max_in_flight=3)
        await warm_clients.aclose()
        return out

    results = asyncio.run(run())
    assert [r.output_tokens for r in results] == [5 + i for i in range(8)]
    starts = sorted(r.t0_perf for r in results if r.t0_perf)
    assert starts[-1] - starts[0] >= 0.3  # spread over the window, not all at once
