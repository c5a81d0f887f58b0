"""The engine's asyncio network streams keep httpcore2's contract, over real sockets."""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpcore2
import httpx2
import pytest

from probes.netstream import (
    READ_HIGH_WATER,
    READ_SIZE,
    AsyncioBackend,
    AsyncioStream,
    ip_family,
)
from probes.transport import arrival_clock, body_chunks, make_client
from simulator.testing import SimulatorProcess

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_reading_pauses_while_nobody_reads_and_nothing_is_lost() -> None:
    total = 32 * 1024 * 1024

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        block = b"x" * (1024 * 1024)
        for _ in range(total // len(block)):
            writer.write(block)
            await writer.drain()
        writer.close()

    async def go() -> tuple[int, int, bytes]:
        server, port = await _serve(flood)
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port)
        assert isinstance(stream, AsyncioStream)
        await asyncio.sleep(0.3)  # the server writes as fast as it can; nobody reads
        held = stream._conn.buffered
        received = 0
        while chunk := await stream.read(65536):
            assert len(chunk) <= 65536
            received += len(chunk)
        end = await stream.read(65536)
        await stream.aclose()
        server.close()
        return held, received, end

    held, received, end = asyncio.run(go())
    assert 0 < held <= READ_HIGH_WATER + READ_SIZE  # the cap plus one socket read
    assert received == total
    assert end == b""


def test_a_write_waits_until_the_kernel_has_every_byte() -> None:
    async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async def go() -> None:
        server, port = await _serve(never_reads)
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port)
        await asyncio.wait_for(stream.write(b"small"), 1)  # fits at once: no wait
        with pytest.raises(httpcore2.WriteTimeout):
            # Far more than the socket buffers hold while the peer reads nothing.
            await stream.write(b"x" * (64 * 1024 * 1024), timeout=0.3)
        await stream.aclose()
        server.close()

    asyncio.run(go())


def test_a_read_times_out_and_an_idle_connection_closed_by_the_server_is_readable() -> None:
    closing: asyncio.Event

    async def quiet_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await closing.wait()
        writer.close()

    async def go() -> None:
        nonlocal closing
        closing = asyncio.Event()
        server, port = await _serve(quiet_then_close)
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port)
        with pytest.raises(httpcore2.ReadTimeout):
            await stream.read(100, timeout=0.05)
        assert stream.get_extra_info("is_readable") is False
        closing.set()
        await asyncio.sleep(0.1)
        assert stream.get_extra_info("is_readable") is True
        assert await stream.read(100) == b""
        await stream.aclose()
        server.close()

    asyncio.run(go())


def test_tls_round_trip_and_an_untrusted_certificate(tls_sim: SimulatorProcess) -> None:
    async def go() -> None:
        backend = AsyncioBackend()
        trusted = ssl.create_default_context(cafile=str(tls_sim.ca_pem_path))
        stream = await backend.connect_tcp("127.0.0.1", tls_sim.port)
        stream = await stream.start_tls(trusted, server_hostname="127.0.0.1", timeout=5)
        assert stream.get_extra_info("ssl_object").version() is not None
        await stream.write(b"GET /_sim/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        response = b""
        while chunk := await stream.read(65536, timeout=5):
            response += chunk
        assert response.startswith(b"HTTP/1.1 200")
        assert b'"status": "ok"' in response
        await stream.aclose()

        stream = await backend.connect_tcp("127.0.0.1", tls_sim.port)
        with pytest.raises(httpcore2.ConnectError) as failure:
            await stream.start_tls(ssl.create_default_context(), server_hostname="127.0.0.1")
        assert isinstance(failure.value.__cause__, ssl.SSLError)

    asyncio.run(go())


def test_a_chunk_keeps_the_time_it_arrived_not_the_time_it_was_read() -> None:
    async def two_chunks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"first")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(b"second")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()

    async def go() -> None:
        server, port = await _serve(two_chunks)
        stream = await AsyncioBackend().connect_tcp("127.0.0.1", port)
        assert isinstance(stream, AsyncioStream)
        await asyncio.sleep(0.1)  # "first" waits unread
        assert await stream.read(3) == b"fir"
        late = time.perf_counter()
        first_at = stream.arrived_at()
        assert late - first_at >= 0.09
        assert await stream.read(100) == b"st"  # the rest of a split chunk keeps its time
        assert stream.arrived_at() == first_at
        assert await stream.read(100) == b"second"
        assert first_at + 0.15 < stream.arrived_at() <= time.perf_counter()
        await stream.aclose()
        server.close()

    asyncio.run(go())


def test_a_close_not_yet_seen_by_the_event_loop_reads_as_readable_from_the_socket() -> None:
    """httpcore2 asks "is_readable" of an idle pooled connection before reusing it: a server's
    close must show even before the loop has run our reader (the kernel is asked)."""

    async def go() -> None:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            stream = await AsyncioBackend().connect_tcp("127.0.0.1", port)
            accepted, _ = listener.accept()
            assert stream.get_extra_info("is_readable") is False
            accepted.close()
            time.sleep(0.05)  # not an await: the loop cannot run our reader meanwhile
            assert isinstance(stream, AsyncioStream)
            assert not stream._conn.eof
            assert stream.get_extra_info("is_readable") is True
            assert await stream.read(100) == b""
            await stream.aclose()

    asyncio.run(go())


def test_the_body_is_read_below_httpx2_with_its_arrival_times(sim: SimulatorProcess) -> None:
    async def go() -> None:
        client = make_client(False, True, cleartext=True)
        async with client.stream("GET", f"{sim.base_url}/_sim/health") as response:
            chunks = body_chunks(response)
            # httpcore2's own stream, not httpx2's aiter_raw with its layers per chunk
            source = Path(chunks.ag_code.co_filename)  # type: ignore[attr-defined]
            assert source.is_relative_to(Path(httpcore2.__file__).parent)
            body = b"".join([chunk async for chunk in chunks])
            arrived = arrival_clock(response)()
            assert isinstance(response.extensions["network_stream"], AsyncioStream)
        await client.aclose()
        assert b'"status": "ok"' in body
        assert 0 < time.perf_counter() - arrived < 5

    asyncio.run(go())


def test_the_client_connects_through_our_backend_and_raises_httpx2_errors() -> None:
    """The network backend is the pool's (passed as network_backend=): a refused connection is
    our backend's httpcore2.ConnectError, mapped by ProbeTransport to httpx2's, as httpx2's own
    transport would."""

    async def go() -> None:
        with socket.socket() as probe:  # a port nobody listens on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        client = make_client(False, True, cleartext=True)
        try:
            with pytest.raises(httpx2.ConnectError) as failure:
                await client.get(f"http://127.0.0.1:{port}/")
        finally:
            await client.aclose()
        assert isinstance(failure.value.__cause__, httpcore2.ConnectError)
        assert "probes/netstream.py" in "".join(
            traceback.format_tb(failure.value.__cause__.__traceback__)
        )

    asyncio.run(go())


def test_each_address_family_connects_and_only_ip_sockets_take_kernel_stamps(
    tmp_path: Path,
) -> None:
    # The family is passed down from where the socket is made (netstream.ip_family, cached),
    # not read back from the socket: each kind of address must still get its own.
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hi")
        await writer.drain()
        writer.close()

    async def go() -> list[tuple[int, bool, bytes]]:
        v4 = await asyncio.start_server(answer, "127.0.0.1", 0)
        v6 = await asyncio.start_server(answer, "::1", 0)
        unix = await asyncio.start_unix_server(answer, str(tmp_path / "s"))
        seen: list[tuple[int, bool, bytes]] = []
        for connect in (
            lambda: AsyncioBackend().connect_tcp("127.0.0.1", v4.sockets[0].getsockname()[1]),
            lambda: AsyncioBackend().connect_tcp("::1", v6.sockets[0].getsockname()[1]),
            lambda: AsyncioBackend().connect_unix_socket(str(tmp_path / "s")),
        ):
            for _ in range(2):  # the second time from ip_family's cache
                stream = await connect()
                assert isinstance(stream, AsyncioStream)
                data = await stream.read(16)
                seen.append((stream._conn.sock.family, stream._conn.kernel_stamps, data))
                await stream.aclose()
        for server in (v4, v6, unix):
            server.close()
        return seen

    assert asyncio.run(go()) == [
        (socket.AF_INET, True, b"hi"),
        (socket.AF_INET, True, b"hi"),
        (socket.AF_INET6, True, b"hi"),
        (socket.AF_INET6, True, b"hi"),
        (socket.AF_UNIX, False, b"hi"),
        (socket.AF_UNIX, False, b"hi"),
    ]
    assert ip_family("::1") == socket.AF_INET6
    assert ip_family("127.0.0.1") == socket.AF_INET
    assert ip_family("localhost") is None


def test_a_pooled_connection_the_server_closed_is_closed_by_the_pool_when_next_asked() -> None:
    # The pool skips httpcore2's cancellation shield when it has nothing to close
    # (transport._Pool._close_connections); what it has to close, it still closes.
    async def answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # after a keep-alive response: the client's connection goes idle first

    async def go() -> tuple[AsyncioStream, AsyncioStream, bytes]:
        server, port = await _serve(answer_then_close)
        client = make_client(False, True, cleartext=True)
        streams = []
        for _ in range(2):
            async with client.stream("GET", f"http://127.0.0.1:{port}/") as response:
                body = b"".join([chunk async for chunk in body_chunks(response)])
                streams.append(response.extensions["network_stream"])
            await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        first, second = streams
        first_closed = first._conn.closed
        await client.aclose()
        server.close()
        assert first_closed, "the pool left the closed-by-server connection open"
        return first, second, body

    first, second, body = asyncio.run(go())
    assert first is not second
    assert body == b"ok"
