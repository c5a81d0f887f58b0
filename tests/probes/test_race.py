"""Races: the first valid answer wins, the rest are cancelled."""

from __future__ import annotations

import asyncio

import pytest

from probes import race
from probes.transport import warm_clients
from simulator.testing import SimulatorProcess
from tests.probes.support import sim_spec


def test_a_race_takes_the_first_valid_answer_and_cancels_the_rest(sim: SimulatorProcess) -> None:
    specs = {
        "fast": sim_spec(sim, "fast-small", max_tokens=60),
        "slow": sim_spec(sim, "slow-large", max_tokens=40),
        "broken": sim_spec(sim, extra_headers={"x-sim-fault": "http_500"}),
    }

    async def run():
        out = await race(specs, reference_ms={"slow": 600.0})
        await warm_clients.aclose()
        return out

    result = asyncio.run(run())
    assert result.winner == "fast"
    assert result.lanes["slow"].cancelled
    assert result.lanes["slow"].saved_ms == pytest.approx(600.0 - result.winner_ms)
    assert result.lanes["broken"].result is not None
    assert result.lanes["broken"].result.error_kind == "http_5xx"
    assert result.lanes["fast"].saved_ms == 0.0
    assert result.lanes["broken"].saved_ms is None  # it would not have answered alone
    assert result.loser_tokens >= 0


def test_a_race_skips_a_finished_answer_that_is_not_valid(sim: SimulatorProcess) -> None:
    specs = {
        "short": sim_spec(sim, "fast-small", max_tokens=5),  # done first, but cut off
        "full": sim_spec(sim, "slow-large", max_tokens=40),
    }

    async def run():
        out = await race(specs, valid=lambda r: r.ok and r.output_tokens == 40)
        await warm_clients.aclose()
        return out

    result = asyncio.run(run())
    assert result.winner == "full"
    assert result.lanes["short"].result is not None
    assert result.lanes["short"].elapsed_ms < result.lanes["full"].elapsed_ms
    assert result.lanes["short"].saved_ms is None
    assert result.loser_tokens == 5
