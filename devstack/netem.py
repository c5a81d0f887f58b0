"""A user-space network delay proxy: how demo regions differ on one machine.

    python -m devstack.netem --listen 127.0.0.1:9101 --target 127.0.0.1:8100 --rtt-ms 80 \
        [--rtt-file var/netem/us-east.rtt-ms]

Every byte from the client reaches the target half a round trip later, and every byte back
reaches the client half a round trip later, in order (Linux tc netem is not available here).
A demo region's worker reaches the simulated providers through its own proxy (the worker's
RW_CONNECT_TO setting), so its probes really take that region's network path; nothing in the
probe adds made-up numbers. The TCP handshake to the proxy itself is local, so a cold
connection's connect_ms does not include the delay; every request/response exchange does.

A proxy is also a WAN's faults, where they hurt, on demand (`Link` runs one in a thread of
the calling process and controls it from there; tests/monitor/pipeline/test_remote_region.py):
- `cut()`: the path is cut. Nothing passes either way: bytes already sent wait (as TCP
  segments wait to be sent again), a new connection is accepted by the kernel but gets no
  answer (its TLS handshake or first command times out); nothing is refused or reset, so
  only a client's own timeouts tell it. `restore()` lets everything through again, in order.
- `reset()`: every open connection is reset (RST to both ends, nothing more delivered).
- `set_rtt(ms)`: the path gets slower or faster from the next chunk on (never reordering one
  connection's bytes): one region's route slow while the others are not. From the command
  line, `--rtt-file`: its number replaces --rtt-ms while the file exists (`python -m
  devstack slow-path` writes it for `make run`'s regions).
No Django here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import struct
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger("devstack.netem")
READ_SIZE = 65536


def _deliver(writer: asyncio.StreamWriter, data: bytes) -> None:
    if writer.is_closing():
        return
    if data:
        writer.write(data)
    elif writer.can_write_eof():
        with contextlib.suppress(OSError):
            writer.write_eof()


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay_s: Callable[[], float],
    path_open: asyncio.Event,
) -> None:
    """Copy reader to writer, each chunk delivered `delay_s()` (the delay when it was read)
    after it was read, in order: never before the chunk ahead of it (timer handles with
    non-decreasing deadlines run in order), so a delay made shorter mid-stream reorders
    nothing. While the path is cut (`path_open` clear) a chunk read waits, and so does
    everything behind it."""
    loop = asyncio.get_running_loop()
    last = 0.0

    def at() -> float:
        nonlocal last
        last = max(last, loop.time() + delay_s())
        return last

    try:
        while data := await reader.read(READ_SIZE):
            await path_open.wait()
            loop.call_at(at(), _deliver, writer, data)
    except (ConnectionError, OSError):
        pass
    await path_open.wait()
    loop.call_at(at(), _deliver, writer, b"")
    await asyncio.sleep(max(0.0, last - loop.time()))


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class DelayProxy:
    def __init__(self, listen: tuple[str, int], target: tuple[str, int], rtt_ms: float) -> None:
        self.listen = listen
        self.target = target
        self.one_way_s = rtt_ms / 2000.0
        self.server: asyncio.Server | None = None
        self._open: asyncio.Event | None = None
        # Open connections: (client, upstream) writers, for reset().
        self._connections: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.accepted = 0  # connections accepted since the start

    @property
    def path_open(self) -> asyncio.Event:
        if self._open is None:  # made on the proxy's own loop
            self._open = asyncio.Event()
            self._open.set()
        return self._open

    def cut(self) -> None:
        self.path_open.clear()

    def restore(self) -> None:
        self.path_open.set()

    def set_rtt(self, rtt_ms: float) -> None:
        """A new round-trip time, from the next chunk read on (a slow or mended path: what
        makes one region's route slow while the others are not)."""
        self.one_way_s = rtt_ms / 2000.0

    def _one_way_s(self) -> float:
        return self.one_way_s

    def reset(self) -> int:
        """Reset every open connection; returns how many there were."""
        connections = list(self._connections)
        for pair in connections:
            for w in pair:
                _reset(w)
        return len(connections)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await self.path_open.wait()  # a connection made while the path is cut hears nothing
        try:
            upstream_r, upstream_w = await asyncio.open_connection(*self.target)
        except OSError as exc:
            log.warning("cannot reach %s:%s: %s", *self.target, exc)
            client_w.close()
            return
        pair = (client_w, upstream_w)
        self._connections.add(pair)
        try:
            await asyncio.gather(
                _pipe(client_r, upstream_w, self._one_way_s, self.path_open),
                _pipe(upstream_r, client_w, self._one_way_s, self.path_open),
            )
        except asyncio.CancelledError:
            # The proxy is stopping: the connection just closes (asyncio would log a
            # traceback for every open connection's cancelled handler).
            pass
        finally:
            self._connections.discard(pair)
            for w in (client_w, upstream_w):
                w.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await w.wait_closed()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, *self.listen)
        return int(self.server.sockets[0].getsockname()[1])

    async def serve_forever(self) -> None:
        assert self.server is not None
        async with self.server:
            await self.server.serve_forever()


T = TypeVar("T")


class Link:
    """A DelayProxy served by a thread of this process, controlled from any thread: each
    call returns once it has taken effect on the proxy's loop.

        with Link(("10.0.0.1", 6380), ("127.0.0.1", 6379), rtt_ms=100) as link:
            link.cut(); ...; link.restore(); link.reset()
    """

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], rtt_ms: float) -> None:
        self.proxy = DelayProxy(listen, target, rtt_ms)
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._thread = threading.Thread(target=self.loop.run_forever, name="netem", daemon=True)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def __enter__(self) -> Link:
        self._thread.start()
        self.port = self._call(self.proxy.start())
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            self.proxy.restore()  # connections waiting on a cut end too
            self.proxy.reset()
            if self.proxy.server is not None:
                self.proxy.server.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        with contextlib.suppress(Exception):
            self._call(close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()

    def cut(self) -> None:
        async def cut() -> None:
            self.proxy.cut()

        self._call(cut())

    def restore(self) -> None:
        async def restore() -> None:
            self.proxy.restore()

        self._call(restore())

    def set_rtt(self, rtt_ms: float) -> None:
        async def set_rtt() -> None:
            self.proxy.set_rtt(rtt_ms)

        self._call(set_rtt())

    def reset(self) -> int:
        async def reset() -> int:
            return self.proxy.reset()

        return self._call(reset())


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def read_rtt_file(path: Path, default_ms: float) -> float:
    """The round trip a control file asks for (milliseconds), or `default_ms` while it is
    absent, empty or not a number."""
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return default_ms


async def _follow(proxy: DelayProxy, path: Path, default_ms: float) -> None:
    """Apply the control file's round trip, read every half second."""
    current = default_ms
    while True:
        wanted = read_rtt_file(path, default_ms)
        if wanted != current:
            proxy.set_rtt(wanted)
            log.warning("netem: rtt now %g ms (%s)", wanted, path)
            current = wanted
        await asyncio.sleep(0.5)


async def _main(ns: argparse.Namespace) -> None:
    rtt_ms = read_rtt_file(ns.rtt_file, ns.rtt_ms) if ns.rtt_file else ns.rtt_ms
    proxy = DelayProxy(ns.listen, ns.target, rtt_ms)
    port = await proxy.start()
    print(
        f"netem: {ns.listen[0]}:{port} -> {ns.target[0]}:{ns.target[1]} rtt {rtt_ms} ms",
        flush=True,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(proxy.serve_forever())
    following = asyncio.create_task(_follow(proxy, ns.rtt_file, ns.rtt_ms)) if ns.rtt_file else None
    await stop.wait()
    for task in (serving, following):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.netem", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--listen", type=_addr, required=True, help="HOST:PORT to listen on")
    parser.add_argument("--target", type=_addr, required=True, help="HOST:PORT to forward to")
    parser.add_argument("--rtt-ms", type=float, required=True, help="round-trip time to add")
    parser.add_argument(
        "--not-loopback",
        action="store_true",
        help="allow --listen on an address other than loopback (the host's end of a veth pair "
        "to a network namespace): whatever reaches that address reaches the target",
    )
    parser.add_argument(
        "--rtt-file",
        type=Path,
        help="a file whose number (ms) replaces --rtt-ms while it exists, read every half "
        "second: a path made slow, then mended, while the proxy runs",
    )
    ns = parser.parse_args(argv)
    if ns.listen[0] not in ("127.0.0.1", "localhost", "::1") and not ns.not_loopback:
        parser.error("the delay proxy listens on loopback only, unless --not-loopback")
    asyncio.run(_main(ns))


if __name__ == "__main__":
    main()
