"""API keys never leak: not in results, details or logs."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from probes import ProbeSpec, probe
from probes.transport import warm_clients
from simulator.testing import SimulatorProcess
from tests.probes.support import sim_spec
from tests.sim_fixtures import OPENAI_KEY


def test_an_api_key_never_appears_in_results_details_or_logs(
    sim: SimulatorProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    specs = [
        sim_spec(sim),
        sim_spec(sim, extra_headers={"x-sim-fault": "http_500"}),
        sim_spec(sim, extra_headers={"x-sim-fault": "stream_error"}),
        ProbeSpec(
            base_url=sim.base_url + "/fastchip/v1",
            format="openai",
            model="x",
            api_key="sk-wrong-canary-9876543210",
        ),
    ]

    async def run():
        out = [await probe(s) for s in specs]
        await warm_clients.aclose()
        return out

    results = asyncio.run(run())
    assert results[3].error_kind == "http_4xx"
    for spec, result in zip(specs, results, strict=True):
        dumped = json.dumps(result.to_dict())
        assert spec.api_key not in dumped
        assert spec.api_key not in repr(spec)
    assert OPENAI_KEY not in caplog.text
    assert "sk-wrong-canary-9876543210" not in caplog.text
