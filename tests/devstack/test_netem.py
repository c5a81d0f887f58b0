"""The delay proxy adds the region's round trip to every exchange, in order, over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack import stack
from devstack.netem import DelayProxy, Link
from simulator.testing import free_port
from tests import support


async def _echo_server() -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_each_round_trip_takes_the_configured_rtt_and_bytes_stay_in_order() -> None:
    async def scenario() -> tuple[list[float], bytes]:
        server, port = await _echo_server()
        proxy = DelayProxy(("127.0.0.1", 0), ("127.0.0.1", port), rtt_ms=80)
        proxy_port = await proxy.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        rtts = []
        for i in range(5):
            t0 = time.perf_counter()
            writer.write(f"ping {i}\n".encode())
            await writer.drain()
            await reader.readline()
            rtts.append((time.perf_counter() - t0) * 1000)
        payload = bytes(range(256)) * 4096  # 1 MiB through the proxy and back
        writer.write(payload)
        await writer.drain()
        echoed = await reader.readexactly(len(payload))
        writer.close()
        assert proxy.server is not None
        proxy.server.close()
        server.close()
        return rtts, echoed if echoed == payload else b""

    rtts, echoed = asyncio.run(scenario())
    assert all(rtt >= 80 for rtt in rtts), rtts
    assert sorted(rtts)[2] < 160, rtts  # the median exchange is not delayed twice
    assert echoed, "bytes came back altered or out of order"


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A blocking echo server on loopback, in a thread (its port)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return

            def echo(c: socket.socket = conn) -> None:
                with c, contextlib.suppress(ConnectionError):  # the proxy's resets
                    while data := c.recv(65536):
                        c.sendall(data)

            threading.Thread(target=echo, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield int(server.getsockname()[1])
    server.close()


def _client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(0.5)
    return sock


def test_a_cut_path_passes_nothing_either_way_until_restored_then_everything_in_order(
    echo_port: int,
) -> None:
    with Link(("127.0.0.1", 0), ("127.0.0.1", echo_port), rtt_ms=20) as link:
        before = _client(link.port)
        before.sendall(b"one")
        assert before.recv(16) == b"one"
        link.cut()
        before.sendall(b"two")
        late = _client(link.port)  # the kernel accepts it; nothing answers
        late.sendall(b"three")
        for sock in (before, late):
            with pytest.raises(TimeoutError):
                sock.recv(16)
        link.restore()
        before.settimeout(5)
        late.settimeout(5)
        assert before.recv(16) == b"two"
        assert late.recv(16) == b"three"


def test_a_reset_sends_an_rst_to_every_open_connection(echo_port: int) -> None:
    with Link(("127.0.0.1", 0), ("127.0.0.1", echo_port), rtt_ms=20) as link:
        socks = [_client(link.port) for _ in range(2)]
        for sock in socks:
            sock.sendall(b"x")
            assert sock.recv(16) == b"x"
        assert link.reset() == 2
        for sock in socks:
            sock.settimeout(5)
            with pytest.raises(ConnectionResetError):
                sock.recv(16)
        again = _client(link.port)  # new connections pass again at once
        again.sendall(b"y")
        again.settimeout(5)
        assert again.recv(16) == b"y"


def test_a_new_rtt_applies_from_the_next_exchange_and_a_shorter_one_reorders_nothing() -> None:
    """set_rtt: one region's path made slow, then mended, on an open connection."""

    async def scenario() -> tuple[float, float, float, bytes, bytes]:
        server, port = await _echo_server()
        proxy = DelayProxy(("127.0.0.1", 0), ("127.0.0.1", port), rtt_ms=20)
        proxy_port = await proxy.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)

        async def exchange(line: bytes) -> float:
            t0 = time.perf_counter()
            writer.write(line)
            await writer.drain()
            await reader.readline()
            return (time.perf_counter() - t0) * 1000

        before = await exchange(b"a\n")
        proxy.set_rtt(600)
        slow = await exchange(b"b\n")
        # Mended while a chunk is still on its slow way: the next chunk, read under the short
        # delay, still arrives after it.
        writer.write(b"slow chunk\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        proxy.set_rtt(20)
        writer.write(b"fast chunk\n")
        await writer.drain()
        first, second = await reader.readline(), await reader.readline()
        after = await exchange(b"c\n")
        writer.close()
        assert proxy.server is not None
        proxy.server.close()
        server.close()
        return before, slow, after, first, second

    before, slow, after, first, second = asyncio.run(scenario())
    assert before < 300, before
    assert slow >= 600, slow
    assert after < 300, after
    assert (first, second) == (b"slow chunk\n", b"fast chunk\n")


def test_slow_path_slows_a_running_proxy_through_its_rtt_file_and_mend_restores_it(
    echo_port: int, tmp_path: Path
) -> None:
    """`python -m devstack slow-path` on `make run`'s regions: the proxy process follows its
    --rtt-file (as devstack.stack.region_workers starts it) within a second."""
    port = free_port()
    argv = [
        sys.executable, "-m", "devstack.netem", "--listen", f"127.0.0.1:{port}",
        "--target", f"127.0.0.1:{echo_port}", "--rtt-ms", "20",
        "--rtt-file", str(stack.rtt_file(tmp_path, "eu-west")),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=stack.ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert "rtt 20.0 ms" in proc.stdout.readline()  # listening

        def exchange() -> float:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                t0 = time.perf_counter()
                sock.sendall(b"x")
                assert sock.recv(16) == b"x"
                return (time.perf_counter() - t0) * 1000

        assert exchange() < 400
        assert stack.slow_path(tmp_path, ["eu-west", "nowhere"], 800) == 2  # nothing written
        assert stack.slow_path(tmp_path, ["eu-west"], 800) == 0
        assert support.wait_until(lambda: exchange() >= 800, 10, 0.1)
        assert stack.slow_path(tmp_path, [], None) == 0
        assert not stack.rtt_file(tmp_path, "eu-west").exists()
        assert support.wait_until(lambda: exchange() < 400, 10, 0.1)
    finally:
        proc.terminate()
        proc.wait(10)
