"""Simulator benchmark: one process serving 500 concurrent streams at 50 tok/s.

    make bench-simulator          (.venv/bin/python bench/bench_simulator.py [--streams N])

Send lag = when the server handed a token to its transport minus when the profile scheduled it
(the simulator records it per token; GET /_sim/stats). Target: p99 <= 5 ms at 500 streams of
250 tokens at 50 tok/s (25,000 tokens/s at full concurrency), streams starting over 2 s.
Measured in the same run, on the same machine, as references:
- bare timer loop: the same 125,000 timed wake-ups in a process that does nothing else (no
  sockets, no HTTP): the event loop's own timer lag, the floor of any timed sender;
- raw streaming server: a 40-line asyncio server writing the same SSE bytes on the same
  schedule to the same client, with no HTTP parsing, planning or ground truth: the floor of
  this machine's sockets (on a shared machine it moves with the neighbours' load).
Loopback only; about 40 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.testing import SimulatorProcess, free_port  # noqa: E402

RATE = 50.0
TOKENS = 250
CONFIG = f"""
[[providers]]
slug = "bench"
format = "openai"
api_keys = ["sk-bench"]
[[providers.models]]
id = "bench-50"
queue_ms = 0
queue_sigma = 0
prefill_tokens_per_s = 1000000
decode_tokens_per_s = {RATE}
decode_sigma = 0
output_tokens = {TOKENS}
"""
CHUNK = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1767225600,'
    b'"model":"bench-50","system_fingerprint":null,"choices":[{"index":0,"delta":'
    b'{"content":" the"},"logprobs":null,"finish_reason":null}]}\n\n'
)
EARLY_S = 0.0002  # the simulator re-arms a timer that fires earlier than this


def _event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


# --- the client: a lean protocol per stream, so the client's own cost stays small ----------


class _StreamClient(asyncio.Protocol):
    def __init__(self, request: bytes, done: asyncio.Future[int]) -> None:
        self.request, self.done = request, done
        self.received = 0
        self.tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if b"[DONE]" in self.tail + data and self.transport is not None:
            self.transport.close()
        self.tail = data[-16:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(self.received)


async def _clients(port: int, streams: int, ramp_s: float) -> list[int]:
    loop = asyncio.get_running_loop()

    async def one(i: int) -> int:
        await asyncio.sleep(i * ramp_s / streams)
        body = json.dumps(
            {
                "model": "bench-50",
                "messages": [{"role": "user", "content": f"stream {i}"}],
                "stream": True,
                "max_tokens": TOKENS,
            }
        ).encode()
        request = (
            b"POST /bench/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b"authorization: Bearer sk-bench\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body)
        )
        done: asyncio.Future[int] = loop.create_future()
        await loop.create_connection(lambda: _StreamClient(request, done), "127.0.0.1", port)
        return await done

    return await asyncio.gather(*(one(i) for i in range(streams)))


def _run_clients(port: int, streams: int, ramp_s: float) -> float:
    loop = _event_loop()
    started = time.perf_counter()
    try:
        received = loop.run_until_complete(_clients(port, streams, ramp_s))
    finally:
        loop.close()
    assert all(n > TOKENS * len(CHUNK) for n in received), "a stream ended early"
    return time.perf_counter() - started


# --- reference 1: a bare timer loop ---------------------------------------------------------


def _timer_loop(streams: int, ramp_s: float) -> list[float]:
    """The simulator's schedule (call_later, early re-arm) with no I/O at all."""
    loop = _event_loop()
    lags: list[float] = []
    clock = time.perf_counter

    def start(base: float, remaining: list[int], done: asyncio.Future[None]) -> None:
        def fire() -> None:
            at = base + (TOKENS - remaining[0]) / RATE
            wait = at - clock()
            if wait > EARLY_S:
                loop.call_later(wait, fire)
                return
            lags.append((clock() - at) * 1000)
            remaining[0] -= 1
            if remaining[0]:
                fire()
            else:
                done.set_result(None)

        fire()

    async def main() -> None:
        futures = []
        for i in range(streams):
            done: asyncio.Future[None] = loop.create_future()
            base = clock() + i * ramp_s / streams
            loop.call_later(i * ramp_s / streams, start, base, [TOKENS], done)
            futures.append(done)
        await asyncio.gather(*futures)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return lags


# --- reference 2: a raw streaming server ----------------------------------------------------


def _raw_server(port: int, seconds: float, out: str) -> None:
    """Same bytes, same schedule, same client; no HTTP parsing, planning or ground truth."""
    loop = _event_loop()
    lags: list[float] = []
    clock = time.perf_counter

    class Raw(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]
            self.base: float | None = None
            self.sent = 0

        def data_received(self, data: bytes) -> None:
            if self.base is None:
                self.base = clock()
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                self.fire()

        def fire(self) -> None:
            assert self.base is not None
            while not self.transport.is_closing():
                if self.sent == TOKENS:
                    done = b"data: [DONE]\n\n"
                    self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(done), done))
                    return
                at = self.base + self.sent / RATE
                wait = at - clock()
                if wait > EARLY_S:
                    loop.call_later(wait, self.fire)
                    return
                now = clock()
                self.transport.write(b"%x\r\n%b\r\n" % (len(CHUNK), CHUNK))
                lags.append((now - at) * 1000)
                self.sent += 1

    async def main() -> None:
        server = await loop.create_server(Raw, "127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.sleep(seconds)
        server.close()

    loop.run_until_complete(main())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    Path(out).write_text(json.dumps({"lags": lags, "cpu_s": usage.ru_utime + usage.ru_stime}))


def _floor(streams: int, ramp_s: float, folder: Path) -> tuple[list[float], float]:
    """(send lags, CPU seconds) of the raw streaming server."""
    port, out = free_port(), folder / "floor.json"
    seconds = ramp_s + TOKENS / RATE + 4
    proc = subprocess.Popen(
        [sys.executable, __file__, "--raw-server", str(port), str(seconds), str(out)],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    _run_clients(port, streams, ramp_s)
    proc.wait(seconds + 30)
    data = json.loads(out.read_text())
    return data["lags"], data["cpu_s"]


# --- report ---------------------------------------------------------------------------------


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (loopback)
        return json.loads(response.read())


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--ramp", type=float, default=2.0, help="seconds over which streams start")
    parser.add_argument("--no-floor", action="store_true", help="skip the raw-server reference")
    parser.add_argument("--raw-server", nargs=3, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.raw_server:
        _raw_server(int(ns.raw_server[0]), float(ns.raw_server[1]), ns.raw_server[2])
        return
    streams, ramp = ns.streams, ns.ramp
    total = streams * TOKENS
    print(
        f"{streams} streams x {TOKENS} tokens at {RATE:.0f} tok/s, started over {ramp:.0f} s "
        f"({streams * RATE:,.0f} tokens/s at full concurrency); "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    folder = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    (folder / "bench.toml").write_text(CONFIG)

    print("1/3 bare timer loop ...", flush=True)
    timer = _timer_loop(streams, ramp)
    floor: list[float] = []
    floor_cpu_s = 0.0
    if not ns.no_floor:
        print("2/3 raw streaming server ...", flush=True)
        floor, floor_cpu_s = _floor(streams, ramp, folder)
    print("3/3 simulator ...", flush=True)
    with SimulatorProcess(folder / "bench.toml") as sim:
        assert sim.proc is not None
        _get(f"{sim.base_url}/_sim/stats/reset")
        cpu_before = _cpu_s(sim.proc.pid)
        elapsed = _run_clients(sim.port, streams, ramp)
        cpu_s = _cpu_s(sim.proc.pid) - cpu_before
        stats = _get(f"{sim.base_url}/_sim/stats")
    lag = stats["send_lag_ms"]
    assert lag["count"] == total, lag

    print(f"\nsimulator: {lag['count']:,} tokens in {elapsed:.1f} s", end="")
    print(f", {cpu_s:.1f} s CPU = {cpu_s / total * 1e6:.0f} us per token (all work, incl. HTTP)")
    if floor:
        print(f"raw streaming server: {floor_cpu_s / total * 1e6:.0f} us of CPU per token")
    print(f"\n{'send lag (ms)':28}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}")
    rows = [("simulator", [lag["p50"], lag["p90"], lag["p99"], lag["max"]])]
    rows.append(("bare timer loop", [_p(timer, q) for q in (0.5, 0.9, 0.99)] + [max(timer)]))
    if floor:
        rows.append(
            ("raw streaming server", [_p(floor, q) for q in (0.5, 0.9, 0.99)] + [max(floor)])
        )
    for name, values in rows:
        print(f"{name:28}" + "".join(f"{v:8.2f}" for v in values))
    timer_p99 = max(_p(timer, 0.99), 0.01)
    print(f"\nsimulator p99 / bare timer loop p99: {lag['p99'] / timer_p99:.1f}x")
    if floor:
        print(
            f"simulator p99 / raw streaming server p99: {lag['p99'] / max(_p(floor, 0.99), 0.01):.1f}x"
        )
    verdict = "meets" if lag["p99"] <= 5.0 else "MISSES"
    print(f"target send-lag p99 <= 5 ms: {verdict} ({lag['p99']:.2f} ms)")


if __name__ == "__main__":
    main()
