"""Running one probe from a synchronous test."""

from __future__ import annotations

import asyncio

from probes import Measurement, ProbeSpec, probe
from probes.transport import warm_clients


def run(spec: ProbeSpec) -> Measurement:
    async def go() -> Measurement:
        try:
            return await probe(spec)
        finally:
            await warm_clients.aclose()

    return asyncio.run(go())
