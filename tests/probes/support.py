"""Running one probe from a synchronous test, and a spec for the simulator's fast route."""

from __future__ import annotations

import asyncio

from probes import Measurement, ProbeSpec, probe
from probes.transport import warm_clients
from simulator.testing import SimulatorProcess
from tests.sim_fixtures import OPENAI_KEY


def run(spec: ProbeSpec) -> Measurement:
    async def go() -> Measurement:
        try:
            return await probe(spec)
        finally:
            await warm_clients.aclose()

    return asyncio.run(go())


def run_all(*specs: ProbeSpec) -> list[Measurement]:
    """Probes one after the other on one event loop: the same warm client for each."""

    async def go() -> list[Measurement]:
        try:
            return [await probe(spec) for spec in specs]
        finally:
            await warm_clients.aclose()

    return asyncio.run(go())


def sim_spec(
    sim: SimulatorProcess, model: str = "fast-small", max_tokens: int = 30, **kw: object
) -> ProbeSpec:
    return ProbeSpec(
        base_url=sim.base_url + "/fastchip/v1",
        format="openai",
        model=model,
        api_key=OPENAI_KEY,
        max_tokens=max_tokens,
        **kw,  # type: ignore[arg-type]
    )
