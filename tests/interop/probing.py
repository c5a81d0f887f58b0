"""Running the real engine and the real CLI against an interop server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from probes import Measurement, ProbeSpec, probe
from probes.engine import Progress
from probes.transport import warm_clients
from tests.probes.support import run_all
from tests.support import ROOT


def spec(origin: str, fmt: str, model: str, **kw: Any) -> ProbeSpec:
    """A spec as a route would have it: OpenAI's base ends in /v1, Anthropic's does not."""
    base = origin + "/v1" if fmt == "openai" else origin
    kw.setdefault("user_prompt", "Say one thing about latency.")
    kw.setdefault("total_timeout_s", 30.0)
    kw.setdefault("first_token_timeout_s", 20.0)
    return ProbeSpec(base_url=base, format=fmt, model=model, **kw)


def run_one(s: ProbeSpec) -> Measurement:
    return run_all(s)[0]


def run_while(
    s: ProbeSpec, action: Callable[[Progress], Awaitable[None]]
) -> tuple[Measurement, Progress]:
    """One probe, with `action(progress)` running beside it (to kill a server mid-stream)."""

    async def go() -> tuple[Measurement, Progress]:
        progress = Progress()
        side = asyncio.create_task(action(progress))
        try:
            return await probe(s, progress), progress
        finally:
            side.cancel()
            await warm_clients.aclose()

    return asyncio.run(go())


async def until_output(progress: Progress, chunks: int = 3, timeout_s: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while progress.output_chunks < chunks:
        if loop.time() > deadline:
            raise AssertionError("the probe saw no output")
        await asyncio.sleep(0.01)


def cli(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> tuple[int, list[dict[str, Any]], str]:
    """`python -m probes ARGS --json` in a fresh process: (exit code, results, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "probes", *args, "--json"],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, rows, proc.stderr


def overhead_ms(row: dict[str, Any] | Measurement) -> float:
    """Time from t0 to the request body sent that is neither DNS nor TCP connect: the client's
    own work. On loopback with a ~150-byte body it is a few milliseconds."""
    data = row.to_dict() if isinstance(row, Measurement) else row
    return float(data["upload_ms"] - (data["dns_ms"] or 0.0) - (data["connect_ms"] or 0.0))


def ok_fields(result: Measurement) -> Sequence[str]:
    """Everything that must hold for a complete, sensible streamed answer."""
    problems = []
    if not result.ok:
        problems.append(f"outcome {result.error_kind}: {result.error_detail}")
        return problems
    for name in ("ttfb_ms", "ttft_ms", "ttfat_ms", "e2e_ms", "output_tokens"):
        if getattr(result, name) is None:
            problems.append(f"{name} missing")
    if problems:
        return problems
    assert result.ttfb_ms is not None
    assert result.ttft_ms is not None
    assert result.e2e_ms is not None
    if not 0 < result.ttfb_ms <= result.ttft_ms <= result.e2e_ms:
        problems.append(f"ttfb {result.ttfb_ms} <= ttft {result.ttft_ms} <= e2e {result.e2e_ms}")
    if result.ttfat_ms != result.ttft_ms:
        problems.append("ttfat differs from ttft without reasoning")
    if result.token_source not in ("usage", "tokenizer"):
        problems.append(f"token_source {result.token_source!r}")
    return problems
