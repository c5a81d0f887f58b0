"""Scenario benchmark: the engine's overhead per call of a sequential scenario, against a
raw-socket client running the same sequence in the same run.

    make bench-scenarios [ARGS="--runs 20 --calls 10"]

Each side runs `runs` scenarios of `calls` sequential calls against the simulator, every
call on one kept-alive connection (as an application holds one client). The server's own
time for each call (request body read to response end, from the simulator's ground truth,
perf_counter on the same host) is subtracted from the scenario's wall time; what is left,
per call, is the client's overhead: sending, reading, parsing, and the work between calls
(building the next request; for the engine also its timing, token counting and result).
Reports p50/p95 per call for both and the difference (the engine's cost over a minimal
client). Loopback only; well under a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from probes import ProbeSpec  # noqa: E402
from probes.scenario import Scenario, Step, run_scenario  # noqa: E402
from probes.transport import warm_clients  # noqa: E402
from simulator.testing import SimulatorProcess  # noqa: E402

CONFIG = """
[[providers]]
slug = "bench"
format = "openai"
api_keys = ["sk-bench"]
[[providers.models]]
id = "bench-model"
queue_ms = 5
queue_sigma = 0
prefill_tokens_per_s = 1000000
decode_tokens_per_s = 2000
decode_sigma = 0
output_tokens = 20
"""


def _truth(base: str, request_id: str) -> dict:
    with urllib.request.urlopen(f"{base}/_sim/requests/{request_id}", timeout=10) as r:  # noqa: S310
        return json.loads(r.read())


def _server_ms(base: str, request_ids: list[str]) -> float:
    total = 0.0
    for rid in request_ids:
        t = _truth(base, rid)
        total += (t["end_at"] - t["received_at"]) * 1000.0
    return total


async def _raw_call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> str:
    body = json.dumps(
        {
            "model": "bench-model",
            "messages": [{"role": "user", "content": f"Step {n}: act."}],
            "stream": True,
            "max_tokens": 20,
        }
    ).encode()
    writer.write(
        b"POST /bench/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-bench\r\n"
        b"content-type: application/json\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    await writer.drain()
    buffer = b""
    while not buffer.endswith(b"\r\n0\r\n\r\n"):
        chunk = await reader.read(65536)
        if not chunk:
            break
        buffer += chunk
    head = buffer.split(b"\r\n\r\n", 1)[0].decode()
    for line in head.split("\r\n"):
        if line.lower().startswith("x-sim-request-id:"):
            return line.split(":", 1)[1].strip()
    raise RuntimeError("no request id: " + head[:200])


async def _raw_scenario(port: int, calls: int) -> tuple[float, list[str]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await _raw_call(reader, writer, -1)  # the connection is warm, as the engine's is
    started = time.perf_counter()
    ids = [await _raw_call(reader, writer, n) for n in range(calls)]
    wall_ms = (time.perf_counter() - started) * 1000.0
    writer.close()
    return wall_ms, ids


async def _engine_scenarios(base: str, runs: int, calls: int) -> list[tuple[float, list[str]]]:
    spec = ProbeSpec(
        base_url=f"{base}/bench/v1", format="openai", model="bench-model", api_key="sk-bench"
    )
    steps = [Step(prompt="Step {step}: act.", max_tokens=20, carry_context=False)] * calls
    out = []
    try:
        await run_scenario(Scenario(spec, steps[:1], total_timeout_s=30))  # warm connection
        for _ in range(runs):
            result = await run_scenario(Scenario(spec, steps, total_timeout_s=60))
            if not result.ok:
                raise RuntimeError(result.error_detail)
            assert result.app_e2e_ms is not None
            out.append((result.app_e2e_ms, [c.result.request_id for c in result.calls]))
    finally:
        await warm_clients.aclose()
    return out


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scenarios-") as tmp:
        config = Path(tmp, "bench.toml")
        config.write_text(CONFIG)
        with SimulatorProcess(config) as sim:
            engine_runs = asyncio.run(_engine_scenarios(sim.base_url, ns.runs, ns.calls))
            raw_runs = [asyncio.run(_raw_scenario(sim.port, ns.calls)) for _ in range(ns.runs)]
            engine = [
                (wall - _server_ms(sim.base_url, ids)) / ns.calls for wall, ids in engine_runs
            ]
            raw = [(wall - _server_ms(sim.base_url, ids)) / ns.calls for wall, ids in raw_runs]
            server = statistics.median(
                _server_ms(sim.base_url, ids) / ns.calls for _, ids in raw_runs
            )
    print(
        f"\n{ns.runs} scenarios of {ns.calls} sequential calls each side, one warm connection; "
        f"server time per call (ground truth) ~{server:.1f} ms"
    )
    print(f"{'client overhead per call':<28}{'p50':>10}{'p95':>10}")
    print(f"{'engine (probes.scenario)':<28}{_p(engine, 0.5):>8.2f}ms{_p(engine, 0.95):>8.2f}ms")
    print(f"{'raw socket':<28}{_p(raw, 0.5):>8.2f}ms{_p(raw, 0.95):>8.2f}ms")
    print(
        f"{'engine - raw':<28}{_p(engine, 0.5) - _p(raw, 0.5):>8.2f}ms"
        f"{_p(engine, 0.95) - _p(raw, 0.95):>8.2f}ms"
    )


if __name__ == "__main__":
    main()
