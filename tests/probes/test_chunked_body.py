"""The engine's chunked-body decoder reads every body as h11 does: the same bytes out of the
same read, and the same framing errors at the same read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import h11
import httpcore2
import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probes.http1 import ChunkedBody
from probes.request import build_request, send
from probes.transport import body_chunks, body_pump, make_client
from tests.probes.loopback import LoopbackServer, Reply, read_request

LIMIT = 64  # the longest incomplete line, small so that the limit is reached
# A POST's two ways on an HTTP/1.1 client: httpx2's (its client, httpcore2's pool and _HTTP11)
# and the probe's (probes.request: the client's DirectPool).
PATHS = ["httpcore2", "direct"]


async def _trace(name: str, info: dict[str, Any]) -> None:
    pass


@contextlib.asynccontextmanager
async def _post(client: httpx2.AsyncClient, url: str, path: str) -> AsyncIterator[httpx2.Response]:
    """A POST of b"{}" on `client` the `path` way, its response closed on the way out."""
    if path == "httpcore2":
        async with client.stream("POST", url, content=b"{}") as response:
            yield response
        return
    outgoing = build_request(client, url, {}, b"{}", _trace)
    assert outgoing.direct is not None
    response = await send(client, outgoing)
    try:
        yield response
    finally:
        await response.aclose()


def _h11_in_body() -> h11.Connection:
    """A client connection that has sent its request and read a chunked response's headers."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=LIMIT)
    conn.send(h11.Request(method="POST", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    assert isinstance(conn.next_event(), h11.Response)
    return conn


def _drain(conn: h11.Connection) -> tuple[bytes, str | None, bool]:
    """(the data h11 has for what it holds, its error, whether the message ended)."""
    data = b""
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Data):
                data += event.data
            else:
                return data, None, event is not h11.NEED_DATA
    except h11.RemoteProtocolError as exc:
        return data, str(exc), False


def _compare(reads: list[bytes]) -> None:
    """Feed both, a read at a time: each read gives the same bytes, or the same error, and
    from the last chunk on, h11 reading the rest ChunkedBody hands back ends as h11 alone."""
    theirs, ours = _h11_in_body(), ChunkedBody(LIMIT)
    rest_reader: h11.Connection | None = None
    for read in reads:
        theirs.receive_data(read)
        expected = _drain(theirs)
        if rest_reader is None:
            decoded, rest = ours.feed(read)
            if ours.failure is not None:
                assert (decoded, str(ours.failure), False) == expected
                return
            if rest is None:
                assert (decoded, None, False) == expected
                continue
            rest_reader = _h11_in_body()
            read = rest
        else:
            decoded = b""
        rest_reader.receive_data(read)
        data, error, ended = _drain(rest_reader)
        assert (decoded + data, error, ended) == expected
        if error is not None or ended:
            return
    theirs.receive_data(b"")
    expected_eof = _drain(theirs)[1]
    if rest_reader is None:
        assert str(ours.eof_error()) == expected_eof
    else:
        rest_reader.receive_data(b"")
        assert _drain(rest_reader)[1] == expected_eof


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(len(data), cut) for cut in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    return [piece for piece in pieces if piece]  # an empty read is the end of the stream


chunk = st.tuples(
    st.binary(min_size=1, max_size=40),
    st.sampled_from(["", ";ext=1", " ", "\t ", ";a", "0"]),
    st.sampled_from(["x", "X"]),
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.lists(chunk, max_size=8),
    end=st.sampled_from([b"0\r\n\r\n", b"0;x\r\nx-t: 1\r\n\r\n", b"", b"0\r\n"]),
    cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=12),
)
def test_a_well_formed_body_comes_out_of_the_same_reads_as_with_h11(
    chunks: list[tuple[bytes, str, str]], end: bytes, cuts: list[int]
) -> None:
    wire = b""
    for data, extension, case in chunks:
        size = format(len(data), case)
        if extension == "0":
            size = "0" + size  # leading zeros
            extension = ""
        wire += f"{size}{extension}\r\n".encode() + data + b"\r\n"
    _compare(_split(wire + end, cuts))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    wire=st.lists(
        st.sampled_from([b"5\r\n", b"hello", b"\r\n", b"\r", b"\n", b"zz\r\n", b"0\r\n", b"ff"])
        | st.binary(max_size=20),
        max_size=12,
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_any_bytes_fail_or_pass_as_with_h11(wire: list[bytes], cuts: list[int]) -> None:
    _compare(_split(b"".join(wire), cuts))


def test_a_long_chunk_size_line_is_refused_as_h11_refuses_it() -> None:
    _compare([b"1" * (LIMIT + 1)])
    _compare([b"f" * 21 + b"\r\n"])


@pytest.mark.parametrize("path", PATHS)
def test_a_chunked_stream_leaves_its_connection_reusable(path: str) -> None:
    """The last chunk goes back to h11, which ends the message: the next request goes out on
    the same connection, and its body comes out whole too."""
    events = [b"data: one\n\n", b"data: two\n\n"]
    reply = Reply(200, [("content-type", "text/event-stream")], [(0.01, e) for e in events])

    async def go(url: str) -> tuple[list[bytes], list[object]]:
        client = make_client(False, True, cleartext=True)
        bodies, streams = [], []
        try:
            for _ in range(2):
                async with _post(client, url, path) as response:
                    bodies.append(b"".join([part async for part in body_chunks(response)]))
                    streams.append(response.extensions["network_stream"])
        finally:
            await client.aclose()
        return bodies, streams

    with LoopbackServer(lambda request: reply) as server:
        bodies, streams = asyncio.run(go(server.url))
    assert bodies == [b"".join(events)] * 2
    assert streams[0] is streams[1]


def _collect(stream: Any) -> tuple[list[bytes], list[float], Callable[[bytes, float], None]]:
    """A consumer for body_pump that keeps each part and its arrival, checking the arrival is
    the stream's last read's."""
    parts: list[bytes] = []
    stamps: list[float] = []

    def consume(data: bytes, now: float) -> None:
        assert now == stream.arrived_at()
        parts.append(data)
        stamps.append(now)

    return parts, stamps, consume


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
ONE = b"b\r\ndata: one\n\n\r\n"
TWO = b"b\r\ndata: two\n\n\r\n"
END = b"0\r\n\r\n"


@pytest.mark.parametrize(
    "writes",
    [
        [HEAD, ONE, TWO, END],
        [HEAD + ONE, TWO, END],  # a whole chunk came in with the headers
        [HEAD + ONE[:7], ONE[7:] + TWO[:3], TWO[3:], END],  # half of one
        [HEAD + ONE[:-1], ONE[-1:] + TWO, END],  # all but the last byte of its CRLF
        [HEAD + ONE + TWO + END],  # the whole body
        [HEAD, ONE + TWO[:5], TWO[5:] + b"0\r\nx-trailer: 1\r\n", b"\r\n"],
    ],
)
@pytest.mark.parametrize("pumped", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_a_body_split_anywhere_comes_out_whole_and_the_connection_is_reused(
    writes: list[bytes], pumped: bool, path: str
) -> None:
    """However the reads fall against the headers and the chunks (h11 reading what came with
    the headers, ChunkedBody from the first whole chunk on), the body is the same, and the
    next request goes out on the same connection; read by body_chunks, or pumped from the
    loop's callback (body_pump, the engine's way), each part with its read's arrival."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await read_request(reader)
            for data in writes:
                writer.write(data)
                await writer.drain()
                await asyncio.sleep(0.02)
        writer.close()

    async def go() -> tuple[list[bytes], list[object]]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = make_client(False, True, cleartext=True)
        bodies, streams = [], []
        try:
            for _ in range(2):
                url = f"http://127.0.0.1:{port}/"
                async with _post(client, url, path) as response:
                    stream = response.extensions["network_stream"]
                    pump = body_pump(response)
                    assert pump is not None
                    if pumped:
                        parts, stamps, consume = _collect(stream)
                        await pump(consume)
                        assert stamps == sorted(stamps)
                        bodies.append(b"".join(parts))
                    else:
                        bodies.append(b"".join([part async for part in body_chunks(response)]))
                    streams.append(stream)
        finally:
            await client.aclose()
            server.close()
        return bodies, streams

    bodies, streams = asyncio.run(go())
    assert bodies == [b"data: one\n\ndata: two\n\n"] * 2
    assert streams[0] is streams[1]


@pytest.mark.parametrize("path", PATHS)
def test_body_bytes_that_come_with_the_headers_wait_in_the_stream_for_chunked_body(
    path: str,
) -> None:
    """A read while the headers are awaited ends with the head: the chunks that came in the
    same read stay queued on the stream, with that read's arrival, for ChunkedBody (not h11,
    an event per chunk). Every event keeps its stamp, and the body comes out whole."""
    released = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(HEAD + ONE + TWO)  # one write: one read on loopback
        await writer.drain()
        await released.wait()
        writer.write(END)
        await writer.drain()
        writer.close()

    async def go() -> tuple[bytes, list[bytes], float, float, list[float], bool]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = make_client(False, True, cleartext=True)
        try:
            url = f"http://127.0.0.1:{port}/"
            async with _post(client, url, path) as response:
                stream = response.extensions["network_stream"]
                headers_at = stream.arrived_at()
                queued = list(stream._conn.chunks)
                queued_at = list(stream._conn.arrivals)
                parts = body_chunks(response)
                first = await anext(parts)
                first_at = stream.arrived_at()
                released.set()
                rest = b"".join([part async for part in parts])
                reading_heads = getattr(stream, "headers_only", False)
        finally:
            await client.aclose()
            server.close()
        return first + rest, queued, headers_at, first_at, queued_at, reading_heads

    body, queued, headers_at, first_at, queued_at, reading_heads = asyncio.run(go())
    assert body == b"data: one\n\ndata: two\n\n"
    assert queued == [ONE + TWO]  # left by the head's read, not taken by h11
    assert queued_at == [headers_at]  # with the arrival of the read that brought them
    assert first_at == headers_at
    assert not reading_heads  # only while the headers are awaited


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.lists(chunk, min_size=1, max_size=6),
    tail=st.sampled_from([b"", b"\r\n", b"x", b"0\r\n\r\n"]),
)
def test_a_read_of_one_whole_chunk_comes_out_as_with_h11(
    chunks: list[tuple[bytes, str, str]], tail: bytes
) -> None:
    # A read that is exactly one chunk (the engine's common read, taken on a fast path),
    # then one with something after the chunk (the general path), read for read as h11.
    reads = []
    for data, extension, case in chunks:
        size = format(len(data), case)
        if extension == "0":
            size, extension = "0" + size, ""
        reads.append(f"{size}{extension}\r\n".encode() + data + b"\r\n")
    _compare(reads)
    _compare([*reads[:-1], reads[-1] + tail])


@pytest.mark.parametrize(
    ("writes", "failure", "body"),
    [
        ([HEAD, ONE, b"zz\r\n"], "illegal chunk header: bytearray(b'zz\\r\\n')", ONE[3:-2]),
        (
            [HEAD, ONE, TWO[:-2] + b"xx"],
            "malformed chunk footer: bytearray(b'xx')",
            ONE[3:-2] + TWO[3:-2],
        ),
        (
            [HEAD, ONE, TWO[:6]],
            "peer closed connection without sending complete message body",
            b"data: one\n\ndat",
        ),
        ([HEAD, ONE, b"ffff"], "peer unexpectedly closed connection", ONE[3:-2]),
        ([HEAD, ONE, b"c\r\ndata: oops\n\n\r\n"], "consume refused the read", ONE[3:-2]),
    ],
)
@pytest.mark.parametrize("pumped", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_a_failing_body_fails_alike_read_or_pumped(
    writes: list[bytes], failure: str, body: bytes, pumped: bool, path: str
) -> None:
    """A framing error, the end of the stream inside the body, or an exception of the consumer:
    the same exception after the same data, read by body_chunks or pumped from the callback,
    and the connection is not reused."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        for data in writes:
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.close()

    class Refused(Exception):
        pass

    def consume(data: bytes, now: float) -> None:
        if b"oops" in data:
            raise Refused("consume refused the read")
        parts.append(data)

    parts: list[bytes] = []

    async def go() -> tuple[str, bool]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = make_client(False, True, cleartext=True)
        error = ""
        try:
            url = f"http://127.0.0.1:{port}/"
            async with _post(client, url, path) as response:
                stream = response.extensions["network_stream"]
                try:
                    if pumped:
                        pump = body_pump(response)
                        assert pump is not None
                        await pump(consume)
                    else:
                        async for part in body_chunks(response):
                            consume(part, stream.arrived_at())
                except (httpcore2.RemoteProtocolError, Refused) as exc:
                    error = str(exc)
            return error, stream._conn.closed
        finally:
            await client.aclose()
            server.close()

    error, closed = asyncio.run(go())
    assert b"".join(parts) == body
    assert error.startswith(failure)
    assert closed
