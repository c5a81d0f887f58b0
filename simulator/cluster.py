"""Several simulator processes on one port: `python -m simulator --processes N`.

Layout: the parent binds N listening TCP sockets on the same address with SO_REUSEPORT (the
kernel spreads new connections over them by a hash of the connection's addresses, each socket
with its own accept queue of `backlog`), binds the Unix sockets below, then forks N workers,
each serving the same config on its own listening socket and leading a session of its own
(a CPU share of its own where Linux shares CPUs between sessions first: `_own_session`). Why SO_REUSEPORT and not one
listener shared by all workers: a burst of 1,500 connections is split evenly between the
workers' queues, where on one shared queue every worker wakes and whichever runs first takes
the burst (and its streams); and each worker has its own `backlog`. The price: a connection
hashed to a busy worker waits for it even while another is idle.

The state a request's behaviour depends on is kept once, in the parent, so the same request
gets the same answer whichever worker serves it:
- the providers' prompt caches (a prompt cached through one worker hits through another),
- their rate-limit windows (limits and the remaining counts in the headers are the
  provider's, not a worker's),
asked for over the parent's Unix socket (`state.sock`, a small HTTP/1.1 exchange). The parent
runs nothing else, so its answers come back in well under a millisecond. What is per worker
and merged on request: the ground truth of each request (GET /_sim/requests/<id> on any
worker finds it in the worker that served it) and the statistics (/_sim/stats sums the
workers' counts and merges their send lags; /_sim/stats/reset resets every worker), through
each worker's own Unix socket (`w<i>.sock`). None of these sockets is reachable over TCP.

Random draws (fault probabilities, jitter without `x-sim-seed`) come from each worker's own
generator, seeded from `--seed` and the worker's index: a run is repeatable, and a request
with `x-sim-seed` is planned the same in every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import tempfile
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator import generation
from simulator.config import Config
from simulator.formats import FORMATS
from simulator.server import Request, Responder, serve_socket

MAX_PROCESSES = 64


class ClusterError(Exception):
    pass


def listening_socket(host: str, port: int, backlog: int, *, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _unix_socket(path: Path, backlog: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


async def call(path: Path, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.1 exchange over a Unix socket (the server closes after its answer)."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    try:
        head = (
            f"{method} {target} HTTP/1.1\r\nhost: cluster\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
        data = await reader.read()
    finally:
        writer.close()
    head_bytes, _, payload = data.partition(b"\r\n\r\n")
    try:
        status = int(head_bytes.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise ClusterError(f"no answer from {path.name}") from None
    return status, payload


def _json(responder: Responder, status: int, data: Any) -> None:
    responder.respond(status, [("content-type", "application/json")], json.dumps(data).encode())


# --- the state kept once (in the parent) ------------------------------------------------


class SharedState:
    """The providers' prompt caches and rate-limit windows: a single process's own
    (SimulatorApp.state), or the cluster's, kept in the parent and served to the workers over
    `state.sock`."""

    def __init__(self, config: Config) -> None:
        self.caches = {
            slug: generation.PromptCache(p.cache_ttl_s) for slug, p in config.providers.items()
        }
        self.breakpoint_caches = {
            slug: generation.BreakpointCache()
            for slug, p in config.providers.items()
            if FORMATS[p.wire].explicit_cache
        }
        self.limits = {
            slug: generation.RateLimiter(p.requests_per_minute, p.tokens_per_minute)
            for slug, p in config.providers.items()
        }

    def cache(self, args: dict[str, Any], tokens: list[int]) -> tuple[int, int]:
        slug, namespace = args["provider"], args["namespace"]
        if args["breakpoints"] is None:
            return self.caches[slug].lookup_and_store(namespace, tokens), 0
        return self.breakpoint_caches[slug].lookup_and_store(
            namespace,
            tokens,
            args["block_ends"],
            [(int(b), float(t)) for b, t in args["breakpoints"]],
            args["min_tokens"],
        )

    def limit(self, args: dict[str, Any]) -> generation.Usage:
        return self.limits[args["provider"]].check(args["input_tokens"], args["max_tokens"])

    async def handle(self, request: Request, responder: Responder) -> None:
        header, _, raw = request.body.partition(b"\n")
        try:
            args = json.loads(header)
            if request.path == "/state/cache":
                tokens = array("I")
                tokens.frombytes(raw)
                read, created = self.cache(args, tokens.tolist())
                _json(responder, 200, [read, created])
            elif request.path == "/state/limit":
                usage = self.limit(args)
                _json(
                    responder,
                    200,
                    [
                        usage.allowed,
                        usage.retry_after_s,
                        usage.requests,
                        usage.input_tokens,
                        usage.output_tokens,
                    ],
                )
            else:
                _json(responder, 404, {"error": "not found"})
        except (KeyError, TypeError, ValueError) as exc:
            _json(responder, 400, {"error": f"bad state request: {type(exc).__name__}"})


# --- a worker's view of the others -----------------------------------------------------


@dataclass
class Cluster:
    """What a worker knows of the cluster: its index, its siblings' sockets, the state's."""

    index: int
    processes: int
    folder: Path
    sockets: dict[str, socket.socket] = field(default_factory=dict)

    @property
    def state_path(self) -> Path:
        return self.folder / "state.sock"

    def peer_path(self, index: int) -> Path:
        return self.folder / f"w{index}.sock"

    def siblings(self) -> list[Path]:
        return [self.peer_path(i) for i in range(self.processes) if i != self.index]

    async def _state(self, target: str, args: dict[str, Any], raw: bytes = b"") -> Any:
        status, payload = await call(
            self.state_path, "POST", target, json.dumps(args).encode() + b"\n" + raw
        )
        if status != 200:
            raise ClusterError(f"state {target}: {status} {payload[:200]!r}")
        return json.loads(payload)

    async def cache(
        self,
        provider: str,
        namespace: str,
        tokens: list[int],
        block_ends: list[int] | None = None,
        breakpoints: list[tuple[int, float]] | None = None,
        min_tokens: int = 0,
    ) -> tuple[int, int]:
        args = {
            "provider": provider,
            "namespace": namespace,
            "block_ends": block_ends,
            "breakpoints": breakpoints,
            "min_tokens": min_tokens,
        }
        read, created = await self._state("/state/cache", args, array("I", tokens).tobytes())
        return int(read), int(created)

    async def limit(self, provider: str, input_tokens: int, max_tokens: int) -> generation.Usage:
        args = {"provider": provider, "input_tokens": input_tokens, "max_tokens": max_tokens}
        allowed, retry, requests, used_in, used_out = await self._state("/state/limit", args)
        return generation.Usage(bool(allowed), float(retry), requests, used_in, used_out)

    async def ask_siblings(self, method: str, target: str) -> list[tuple[int, bytes]]:
        return list(await asyncio.gather(*(call(path, method, target) for path in self.siblings())))


# --- the parent -------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: a worker gets SIGTERM when the parent dies (even by SIGKILL)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _own_session() -> None:
    """A worker leads a session of its own, so that it gets the CPU share of one process.

    With autogroups (Linux's default on most kernels: /proc/sys/kernel/sched_autogroup_enabled)
    the CPUs are shared between sessions first: N workers left in their parent's session
    shared ONE session's share between them. On a busy 2-core machine (bench-load's, load
    average 12, some 15 sessions wanting a CPU) the 3 workers got about 0.2 cores together,
    ran 1 s for every 11 s they waited, and left ~1,600 connections a worker in their accept
    queues: probes timed out waiting 135 s for response headers (bench/RESULTS.md). The
    parent, which only answers the shared state, stays in the caller's session; a terminal's
    Ctrl-C reaches it and it stops the workers."""
    with contextlib.suppress(OSError):
        os.setsid()


def bind(processes: int, host: str, port: int, backlog: int) -> list[socket.socket]:
    """The workers' listening sockets, bound now: a port in use fails before anything else."""
    if not 1 <= processes <= MAX_PROCESSES:
        raise ClusterError(f"--processes must be 1 to {MAX_PROCESSES}")
    listeners: list[socket.socket] = []
    try:
        for _ in range(processes):
            listeners.append(listening_socket(host, port, backlog, reuse_port=processes > 1))
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def run(
    listeners: list[socket.socket],
    config: Config,
    worker: Callable[[Cluster, socket.socket], None],
    announce: Callable[[], None],
) -> int:
    """Fork a worker per listening socket (each runs `worker(cluster, its socket)` and exits),
    keep the shared state, and stop them all on SIGTERM / SIGINT or when one dies. Returns the
    exit status."""
    processes = len(listeners)
    folder = Path(tempfile.mkdtemp(prefix="simulator-cluster-"))
    peers = [_unix_socket(folder / f"w{i}.sock", 128) for i in range(processes)]
    state_sock = _unix_socket(folder / "state.sock", 1024)
    parent = os.getpid()
    children: list[int] = []
    for index in range(processes):
        pid = os.fork()
        if pid == 0:  # the worker
            status = 1
            try:
                _die_with_parent()
                if os.getppid() != parent:
                    os._exit(1)
                _own_session()
                for i, (listener, peer) in enumerate(zip(listeners, peers, strict=True)):
                    if i != index:
                        listener.close()
                        peer.close()
                state_sock.close()
                cluster = Cluster(index, processes, folder, {"peer": peers[index]})
                worker(cluster, listeners[index])
                status = 0
            finally:
                os._exit(status)
        children.append(pid)
    for sock in (*listeners, *peers):
        sock.close()
    state = SharedState(config)
    return asyncio.run(_parent(children, state, state_sock, folder, announce))


async def _parent(
    children: list[int],
    state: SharedState,
    state_sock: socket.socket,
    folder: Path,
    announce: Callable[[], None],
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = await serve_socket(state.handle, state_sock, backlog=1024)
    announce()
    alive = set(children)
    status = 0
    async with server:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
            for pid in list(alive):
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    alive.discard(pid)
                    print(f"simulator: worker {pid} exited ({code}); stopping", flush=True)
                    status = 1
                    stop.set()
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = loop.time() + 10
    while alive:
        for pid in list(alive):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    if loop.time() < deadline:
                        continue
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            alive.discard(pid)
        if alive:
            await asyncio.sleep(0.05)
    for path in folder.iterdir():
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        folder.rmdir()
    return status
