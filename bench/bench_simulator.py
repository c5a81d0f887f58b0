"""Simulator benchmark: one process serving 500 concurrent streams at 50 tok/s.

    make bench-simulator          (.venv/bin/python bench/bench_simulator.py [--streams N])

Shaped like bench-load at 1x (thousands of streams in flight, most idle in their TTFT wait,
a few hundred streaming at 30-60 tok/s, about 18,000 tokens/s; the simulator's processes as
bench-load runs them):

    python bench/bench_simulator.py --streams 400 --rates 30,40,50,60 --tokens 500 \
        --idle 1600 --ramp 5 --processes 3

`--idle N` opens N more streams first, on a model whose TTFT is an hour: they send their
headers and opening chunk, then wait (held open until the streaming ones end, then closed by
the client). `--rates` spreads the streaming ones over models at those decode rates (stream i
at rates[i % len]). CPU is the simulator's whole process tree (parent and workers).

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
import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulator.testing import SimulatorProcess, free_port  # noqa: E402

RATE = 50.0
TOKENS = 250
PROVIDER = """
[[providers]]
slug = "bench"
format = "openai"
api_keys = ["sk-bench"]
"""
MODEL = """
[[providers.models]]
id = "{id}"
queue_ms = {queue_ms}
queue_sigma = 0
prefill_tokens_per_s = 1000000
decode_tokens_per_s = {rate}
decode_sigma = 0
output_tokens = {tokens}
"""
IDLE_MODEL = "bench-idle"  # TTFT of an hour: sends its headers and opening chunk, then waits


def _config(rates: list[float], tokens: int) -> str:
    models = [MODEL.format(id=_model(r), queue_ms=0, rate=r, tokens=tokens) for r in rates]
    models.append(MODEL.format(id=IDLE_MODEL, queue_ms=3_600_000, rate=50, tokens=tokens))
    return PROVIDER + "".join(models)


def _model(rate: float) -> str:
    return f"bench-{rate:g}"


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
    def __init__(self, request: bytes, done: asyncio.Future[int] | None) -> None:
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
        if self.done is not None and not self.done.done():
            self.done.set_result(self.received)


def _request(model: str, i: int, tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": f"stream {i}"}],
            "stream": True,
            "max_tokens": tokens,
        }
    ).encode()
    return (
        b"POST /bench/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"authorization: Bearer sk-bench\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(body), body)
    )


@dataclass
class Shape:
    streams: int
    ramp_s: float
    rates: list[float]
    tokens: int
    idle: int

    def rate(self, i: int) -> float:
        return self.rates[i % len(self.rates)]

    @property
    def seconds(self) -> float:
        """Until the last streaming one ends (idle streams are opened before, over 2 s)."""
        return (2.0 if self.idle else 0.0) + self.ramp_s + self.tokens / min(self.rates)


async def _clients(port: int, shape: Shape, on_ready: Callable[[], None] | None) -> list[int]:
    loop = asyncio.get_running_loop()
    idle: list[_StreamClient] = []

    async def one_idle(i: int) -> None:
        await asyncio.sleep(i * 2.0 / shape.idle)
        request = _request(IDLE_MODEL, -1 - i, shape.tokens)
        _, client = await loop.create_connection(
            lambda: _StreamClient(request, None), "127.0.0.1", port
        )
        idle.append(client)

    async def one(i: int) -> int:
        await asyncio.sleep(i * shape.ramp_s / shape.streams)
        request = _request(_model(shape.rate(i)), i, shape.tokens)
        done: asyncio.Future[int] = loop.create_future()
        await loop.create_connection(lambda: _StreamClient(request, done), "127.0.0.1", port)
        return await done

    if shape.idle:
        await asyncio.gather(*(one_idle(i) for i in range(shape.idle)))
    if on_ready is not None:
        on_ready()
    try:
        return await asyncio.gather(*(one(i) for i in range(shape.streams)))
    finally:
        for client in idle:
            if client.transport is not None:
                client.transport.close()


def _run_clients(port: int, shape: Shape, on_ready: Callable[[], None] | None = None) -> float:
    """Seconds from when the idle streams are open (on_ready) to the last stream's end."""
    loop = _event_loop()
    started = [time.perf_counter()]

    def ready() -> None:
        started[0] = time.perf_counter()
        if on_ready is not None:
            on_ready()

    try:
        received = loop.run_until_complete(_clients(port, shape, ready))
    finally:
        loop.close()
    assert all(n > shape.tokens * len(CHUNK) for n in received), "a stream ended early"
    return time.perf_counter() - started[0]


# --- reference 1: a bare timer loop ---------------------------------------------------------


def _timer_loop(shape: Shape) -> list[float]:
    """The simulator's schedule (call_later, early re-arm) with no I/O at all."""
    streams, ramp_s, tokens = shape.streams, shape.ramp_s, shape.tokens
    loop = _event_loop()
    lags: list[float] = []
    clock = time.perf_counter

    def start(base: float, rate: float, remaining: list[int], done: asyncio.Future[None]) -> None:
        def fire() -> None:
            at = base + (tokens - remaining[0]) / rate
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
            loop.call_later(i * ramp_s / streams, start, base, shape.rate(i), [tokens], done)
            futures.append(done)
        await asyncio.gather(*futures)

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    return lags


# --- reference 2: a raw streaming server ----------------------------------------------------


def _raw_server(port: int, seconds: float, out: str, tokens: int) -> None:
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
                model = re.search(rb'"model": "bench-([0-9.]+|idle)"', data)
                self.rate = float(model[1]) if model and model[1] != b"idle" else 0.0
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                self.fire()

        def fire(self) -> None:
            assert self.base is not None
            if not self.rate:
                return  # idle: headers only, until the client leaves
            while not self.transport.is_closing():
                if self.sent == tokens:
                    done = b"data: [DONE]\n\n"
                    self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(done), done))
                    return
                at = self.base + self.sent / self.rate
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


def _floor(shape: Shape, folder: Path) -> tuple[list[float], float]:
    """(send lags, CPU seconds) of the raw streaming server."""
    port, out = free_port(), folder / "floor.json"
    seconds = shape.seconds * 1.5 + 10
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--raw-server",
            str(port),
            str(seconds),
            str(out),
            str(shape.tokens),
        ],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    _run_clients(port, shape)
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
    """CPU seconds of a process and its live children (a cluster's workers)."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--ramp", type=float, default=2.0, help="seconds over which streams start")
    parser.add_argument("--no-floor", action="store_true", help="skip the raw-server reference")
    parser.add_argument(
        "--rates",
        default=f"{RATE:g}",
        help="decode rates (tok/s) the streams are spread over, comma-separated",
    )
    parser.add_argument("--tokens", type=int, default=TOKENS, help="tokens a stream")
    parser.add_argument(
        "--idle", type=int, default=0, help="streams held in their TTFT wait beside them"
    )
    parser.add_argument("--processes", type=int, default=1, help="simulator --processes")
    parser.add_argument("--raw-server", nargs=4, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.raw_server:
        port, seconds, out, tokens = ns.raw_server
        _raw_server(int(port), float(seconds), out, int(tokens))
        return
    rates = [float(r) for r in ns.rates.split(",")]
    shape = Shape(ns.streams, ns.ramp, rates, ns.tokens, ns.idle)
    streams, ramp, tokens = shape.streams, shape.ramp_s, shape.tokens
    total = streams * tokens
    rate_sum = sum(shape.rate(i) for i in range(streams))
    print(
        f"{streams} streams x {tokens} tokens at {ns.rates} tok/s, started over {ramp:g} s "
        f"({rate_sum:,.0f} tokens/s at full concurrency), {shape.idle} idle beside them; "
        f"simulator --processes {ns.processes}; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    folder = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    (folder / "bench.toml").write_text(_config(rates, tokens))

    print("1/3 bare timer loop ...", flush=True)
    timer = _timer_loop(shape)
    floor: list[float] = []
    floor_cpu_s = 0.0
    if not ns.no_floor:
        print("2/3 raw streaming server ...", flush=True)
        floor, floor_cpu_s = _floor(shape, folder)
    print("3/3 simulator ...", flush=True)
    with SimulatorProcess(folder / "bench.toml", processes=ns.processes) as sim:
        assert sim.proc is not None
        pid = sim.proc.pid
        cpu_before = [0.0]

        def ready() -> None:  # the idle streams are open: measure from here
            _get(f"{sim.base_url}/_sim/stats/reset")
            cpu_before[0] = _cpu_s(pid)

        elapsed = _run_clients(sim.port, shape, ready)
        cpu_s = _cpu_s(pid) - cpu_before[0]
        stats = _get(f"{sim.base_url}/_sim/stats")
    lag = stats["send_lag_ms"]
    assert lag["count"] == total, lag

    print(f"\nsimulator: {lag['count']:,} tokens in {elapsed:.1f} s", end="")
    print(
        f", {cpu_s:.1f} s CPU = {cpu_s / total * 1e6:.0f} us per token (all work, incl. HTTP)"
        f", {cpu_s / elapsed:.2f} cores; load average {os.getloadavg()[0]:.2f}"
    )
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
