"""Running one probe from a synchronous test."""

from __future__ import annotations

import asyncio

from probes import ProbeResult, ProbeSpec, probe
from probes.transport import warm_clients


def run(spec: ProbeSpec) -> ProbeResult:
    async def go() -> ProbeResult:
        try:
            return await probe(spec)
        finally:
            await warm_clients.aclose()

    return asyncio.run(go())
