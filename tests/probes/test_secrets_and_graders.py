"""API keys never leak; graders; races; the batch runner; the CLI."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys

import pytest

from probes import ProbeSpec, grade, probe, race, run_batch
from probes.transport import warm_clients
from simulator.testing import ROOT, SimulatorProcess
from tests.sim_fixtures import OPENAI_KEY


def _spec(
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


def test_an_api_key_never_appears_in_results_details_or_logs(
    sim: SimulatorProcess, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    specs = [
        _spec(sim),
        _spec(sim, extra_headers={"x-sim-fault": "http_500"}),
        _spec(sim, extra_headers={"x-sim-fault": "stream_error"}),
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


@pytest.mark.parametrize(
    ("grader", "text", "expected", "schema", "tolerance", "passes"),
    [
        ("exact", "thinking...\nANSWER: 42", "42", None, 0, True),
        ("exact", "ANSWER: 43", "42", None, 0, False),
        ("contains", "the route is fast", "fast", None, 0, True),
        ("regex", "words\nANSWER: 1517", r"ANSWER:\s*1517\b", None, 0, True),
        ("regex", "ANSWER: 15170", r"ANSWER:\s*1517\b", None, 0, False),
        ("numeric", "ANSWER: 3.14159", "3.14", None, 0.01, True),
        ("numeric", "ANSWER: 3.2", "3.14", None, 0.01, False),
        (
            "json_schema",
            'text\nANSWER: {"name": "Ada", "age": 36}',
            "",
            {"type": "object", "required": ["name"]},
            0,
            True,
        ),
        (
            "json_schema",
            'so {"name": "Ada"} and more',
            "",
            {"type": "object", "required": ["age"]},
            0,
            False,
        ),
    ],
)
def test_graders(
    grader: str, text: str, expected: str, schema: dict | None, tolerance: float, passes: bool
) -> None:
    assert grade(grader, text, expected, schema, tolerance) is passes


def test_a_race_takes_the_first_valid_answer_and_cancels_the_rest(sim: SimulatorProcess) -> None:
    specs = {
        "fast": _spec(sim, "fast-small", max_tokens=60),
        "slow": _spec(sim, "slow-large", max_tokens=40),
        "broken": _spec(sim, extra_headers={"x-sim-fault": "http_500"}),
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
        "short": _spec(sim, "fast-small", max_tokens=5),  # done first, but cut off
        "full": _spec(sim, "slow-large", max_tokens=40),
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


def test_the_batch_runner_spreads_starts_and_keeps_order(sim: SimulatorProcess) -> None:
    specs = [_spec(sim, max_tokens=5 + i) for i in range(8)]

    async def run():
        out = await run_batch(specs, window_s=0.4, max_in_flight=3)
        await warm_clients.aclose()
        return out

    results = asyncio.run(run())
    assert [r.output_tokens for r in results] == [5 + i for i in range(8)]
    starts = sorted(r.t0_perf for r in results if r.t0_perf)
    assert starts[-1] - starts[0] >= 0.3  # spread over the window, not all at once


def test_the_cli_prints_a_summary_and_json_lines(sim: SimulatorProcess) -> None:
    env = dict(os.environ, SIMKEY=OPENAI_KEY)
    base = [
        sys.executable,
        "-m",
        "probes",
        "--url",
        sim.base_url + "/fastchip/v1",
        "--format",
        "openai",
        "--model",
        "fast-small",
        "--api-key-env",
        "SIMKEY",
        "--max-tokens",
        "20",
    ]
    summary = subprocess.run(
        [*base, "-n", "6", "--concurrency", "3"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert summary.returncode == 0, summary.stderr
    assert "6/6 ok" in summary.stdout
    assert "p95" in summary.stdout
    lines = subprocess.run(
        [*base, "-n", "2", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    records = [json.loads(line) for line in lines.stdout.splitlines()]
    assert len(records) == 2
    assert {"ttft_ms", "tps", "e2e_ms", "outcome", "token_source"} <= set(records[0])
    assert OPENAI_KEY not in lines.stdout
    missing = subprocess.run(
        [*base[:-2], "--api-key-env", "NOPE_UNSET"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2
    assert "NOPE_UNSET" in missing.stderr
