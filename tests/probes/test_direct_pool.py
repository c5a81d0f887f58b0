"""A probe's HTTP/1.1 request goes through its client's DirectPool (probes/transport.py), not
httpcore2's pool: a connection is kept for the next request to its origin only when the exchange
ended cleanly both ways, and dropped when it has expired or the server has closed it. (What goes
out is held to httpx2's in test_request_path.py; bodies and their failures to _HTTP11's in
test_chunked_body.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpcore2
import httpx2
import pytest

from probes.http1 import DirectPool, DirectRequest
from probes.netstream import AsyncioStream
from probes.transport import TimedBackend, body_chunks, ssl_context
from tests.probes.loopback import read_request

Answer = Callable[[int], bytes]  # the request's number on its connection -> the raw response


async def _trace(name: str, info: dict[str, Any]) -> None:
    pass


async def _server(
    answer: Answer, close_after: Callable[[bytes], bool]
) -> tuple[Any, int, list[int]]:
    """A server that reads each request whole (head and body) and writes answer(n); it closes
    the connection after a response close_after says so. The list counts its connections."""
    connections: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            for n in range(100):
                await read_request(reader)
                response = answer(n)
                writer.write(response)
                await writer.drain()
                if close_after(response):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], connections


def _request(port: int, scheme: bytes = b"http") -> DirectRequest:
    url = httpcore2.URL(scheme=scheme, host=b"127.0.0.1", port=port, target=b"/v1/x")
    headers = [(b"Host", b"127.0.0.1:%d" % port), (b"Content-Length", b"2")]
    return DirectRequest(b"POST", url, headers, b"{}", _trace)


async def _exchange(pool: DirectPool, port: int, read: bool = True) -> tuple[bytes, AsyncioStream]:
    response = await pool.send(_request(port))
    stream = response.extensions["network_stream"]
    body = b"".join([part async for part in body_chunks(response)]) if read else b""
    await response.aclose()
    return body, stream


def _run(go: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(go())  # type: ignore[arg-type]


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def test_a_connection_is_kept_while_fresh_and_dropped_once_past_its_expiry() -> None:
    async def go() -> tuple[list[bytes], list[AsyncioStream], int]:
        server, port, connections = await _server(lambda n: OK, lambda r: False)
        pool = DirectPool(TimedBackend(), ssl_context(True), keepalive_expiry=0.3, max_idle=4)
        bodies, streams = [], []
        for pause in (0.0, 0.0, 0.5):
            await asyncio.sleep(pause)
            body, stream = await _exchange(pool, port)
            bodies.append(body)
            streams.append(stream)
        await pool.aclose()
        server.close()
        return bodies, streams, len(connections)

    bodies, streams, connections = _run(go)
    assert bodies == [b"ok"] * 3
    assert streams[0] is streams[1]  # kept, and taken again
    assert streams[2] is not streams[1]  # idle past its expiry: a new one
    assert streams[1]._conn.closed
    assert connections == 2


def test_a_connection_the_server_closed_while_idle_is_dropped_for_a_new_one() -> None:
    async def go() -> tuple[list[bytes], list[AsyncioStream]]:
        server, port, _ = await _server(lambda n: OK, lambda r: True)  # closes after each
        pool = DirectPool(TimedBackend(), ssl_context(True), keepalive_expiry=300, max_idle=4)
        bodies, streams = [], []
        for _ in range(2):
            body, stream = await _exchange(pool, port)
            bodies.append(body)
            streams.append(stream)
            await asyncio.sleep(0.1)  # the server's close reaches the idle connection
        await pool.aclose()
        server.close()
        return bodies, streams

    bodies, streams = _run(go)
    assert bodies == [b"ok", b"ok"]
    assert streams[0] is not streams[1]
    assert streams[0]._conn.closed


@pytest.mark.parametrize(
    ("answer", "read"),
    [
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok", True),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", False),  # the body left unread
        (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", True),  # HTTP/1.0: no keep-alive
        (b"HTTP/1.1 200 OK\r\n\r\nok", True),  # a body that ends with the connection
    ],
)
def test_an_exchange_that_did_not_end_cleanly_both_ways_closes_its_connection(
    answer: bytes, read: bool
) -> None:
    async def go() -> tuple[bytes, AsyncioStream, AsyncioStream]:
        close = answer.startswith(b"HTTP/1.0") or b"content-length" not in answer
        server, port, _ = await _server(lambda n: answer, lambda r: close)
        pool = DirectPool(TimedBackend(), ssl_context(True), keepalive_expiry=300, max_idle=4)
        body, first = await _exchange(pool, port, read)
        _, second = await _exchange(pool, port)
        await pool.aclose()
        server.close()
        return body, first, second

    body, first, second = _run(go)
    assert body == (b"ok" if read else b"")
    assert first._conn.closed
    assert first is not second


def test_the_pool_keeps_no_more_idle_connections_than_its_bound_and_closes_them_at_the_end() -> (
    None
):
    async def go() -> tuple[list[AsyncioStream], list[bool]]:
        server, port, _ = await _server(lambda n: OK, lambda r: False)
        pool = DirectPool(TimedBackend(), ssl_context(True), keepalive_expiry=300, max_idle=2)
        responses = [await pool.send(_request(port)) for _ in range(3)]  # three at once
        streams = [r.extensions["network_stream"] for r in responses]
        for response in responses:
            b"".join([part async for part in body_chunks(response)])
            await response.aclose()
        kept = [not s._conn.closed for s in streams]
        await pool.aclose()
        server.close()
        return streams, kept

    streams, kept = _run(go)
    assert kept == [True, True, False]
    assert all(s._conn.closed for s in streams)


def test_failures_come_out_as_httpx2s_exceptions() -> None:
    async def go() -> list[type[httpx2.HTTPError]]:
        pool = DirectPool(TimedBackend(), ssl_context(True), keepalive_expiry=300, max_idle=4)
        server, port, _ = await _server(lambda n: b"", lambda r: True)  # no response at all
        errors = []
        for request in (_request(port, b"ftp"), _request(port)):
            try:
                await pool.send(request)
            except httpx2.HTTPError as exc:
                errors.append(type(exc))
        server.close()
        await server.wait_closed()
        try:
            await pool.send(_request(port))  # nobody listening
        except httpx2.HTTPError as exc:
            errors.append(type(exc))
        await pool.aclose()
        return errors

    assert _run(go) == [httpx2.UnsupportedProtocol, httpx2.RemoteProtocolError, httpx2.ConnectError]


def test_a_connection_left_idle_past_its_expiry_is_closed_when_another_exchange_ends() -> None:
    # Two at once leave two idle; only the newer is taken again, and when its exchange ends
    # the older, now past its expiry, is closed: a burst's connections do not linger.
    async def go() -> tuple[AsyncioStream, AsyncioStream, list[AsyncioStream], bool]:
        server, port, _ = await _server(lambda n: OK, lambda r: False)
        pool = DirectPool(TimedBackend(), ssl_context(True), keepalive_expiry=1.0, max_idle=4)
        first, second = [await pool.send(_request(port)) for _ in range(2)]
        older, newer = (r.extensions["network_stream"] for r in (first, second))
        for response in (first, second):  # released in this order: `second` is taken first
            b"".join([part async for part in body_chunks(response)])
            await response.aclose()
        again = []
        for _ in range(2):
            await asyncio.sleep(0.6)
            _, stream = await _exchange(pool, port)
            again.append(stream)
        older_closed = older._conn.closed
        await pool.aclose()
        server.close()
        return older, newer, again, older_closed

    older, newer, again, older_closed = _run(go)
    assert older is not newer
    assert again == [newer, newer]
    assert older_closed
