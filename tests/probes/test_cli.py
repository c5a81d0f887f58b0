"""The engine's command line (`python -m probes`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from simulator.testing import ROOT, SimulatorProcess
from tests.sim_fixtures import OPENAI_KEY


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
