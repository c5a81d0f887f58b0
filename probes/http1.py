"""HTTP/1.1 over our streams (probes/netstream.py): chunked bodies a read at a time, and a pool.

ChunkedBody decodes a chunked response body a read at a time rather than h11 an event per
chunk; pump_chunked and read_chunked read a body with it once h11 has read the head, and give
what follows the last chunk back to h11. They serve both of a client's HTTP/1.1 paths:
httpcore2's connections (probes.transport._HTTP11: httpx2's own requests, and HTTP/2-capable
clients that settle on HTTP/1.1) and DirectPool, which sends a probe's request on a client
that speaks HTTP/1.1 only. What comes out of either is httpcore2's: the same bytes from the
same reads, and its exceptions (as_httpx2 maps them to httpx2's, as an httpx2 transport does).
"""

from __future__ import annotations

import collections
import contextlib
import re
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import h11
import httpcore2
import httpx2

from probes.netstream import READ_SIZE, AsyncioStream

__all__ = [
    "CHUNKED_BODY",
    "CHUNKED_PUMP",
    "CORE_BODY",
    "ChunkedBody",
    "Consume",
    "CoreBody",
    "CoreBodyStream",
    "DirectPool",
    "DirectRequest",
    "as_httpx2",
    "pump_chunked",
    "read_chunked",
]

# The longest incomplete line (a head's, a chunk-size line) h11 may hold: httpcore2 2.16's.
MAX_INCOMPLETE_EVENT_SIZE = 100 * 1024

# The response extension under which ProbeTransport hands over httpcore2's body stream.
CORE_BODY = "routewatch.core_body"
# The response extension under which _HTTP11 hands over the reader of a chunked body.
CHUNKED_BODY = "routewatch.chunked_body"
# The response extension under which _HTTP11 hands over a chunked body's pump (body_pump).
CHUNKED_PUMP = "routewatch.chunked_pump"

# What a pump hands each read's body bytes to, with the read's arrival (perf_counter).
Consume = Callable[[bytes, float], None]

# httpcore2's exceptions as httpx2's, most specific first: what an httpx2 transport raises.
_MAPPED: tuple[tuple[type[Exception], type[httpx2.TransportError]], ...] = (
    (httpcore2.ConnectTimeout, httpx2.ConnectTimeout),
    (httpcore2.ReadTimeout, httpx2.ReadTimeout),
    (httpcore2.WriteTimeout, httpx2.WriteTimeout),
    (httpcore2.PoolTimeout, httpx2.PoolTimeout),
    (httpcore2.TimeoutException, httpx2.TimeoutException),
    (httpcore2.ConnectError, httpx2.ConnectError),
    (httpcore2.ReadError, httpx2.ReadError),
    (httpcore2.WriteError, httpx2.WriteError),
    (httpcore2.NetworkError, httpx2.NetworkError),
    (httpcore2.ProxyError, httpx2.ProxyError),
    (httpcore2.UnsupportedProtocol, httpx2.UnsupportedProtocol),
    (httpcore2.LocalProtocolError, httpx2.LocalProtocolError),
    (httpcore2.RemoteProtocolError, httpx2.RemoteProtocolError),
    (httpcore2.ProtocolError, httpx2.ProtocolError),
)


def as_httpx2(exc: Exception) -> Exception:
    """httpcore2's exception as httpx2's (what an httpx2 transport raises); any other as is."""
    for theirs, ours in _MAPPED:
        if isinstance(exc, theirs):
            return ours(str(exc))
    return exc


class CoreBody(Protocol):
    """httpcore2's response body stream (its pool's): iterated once, then closed."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class CoreBodyStream(httpx2.AsyncByteStream):
    """httpcore2's response body as an httpx2 byte stream: iterating it is iterating httpcore2's
    own stream (no generator layer of ours), closing it returns the connection to the pool."""

    def __init__(self, core: CoreBody) -> None:
        self.core = core

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.core.__aiter__()

    async def aclose(self) -> None:
        await self.core.aclose()


# A chunk-size line as h11 0.16 takes it (its chunk_header without the CRLF): up to 20 hex
# digits, extensions ignored, trailing whitespace allowed.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*")


class ChunkedBody:
    """A chunked HTTP/1.1 body decoded a read at a time, as h11 0.16 decodes it.

    h11 makes an event per chunk through its state machine, and httpcore2 passes each through
    three generator layers: at 200 streams that was a quarter of the engine's CPU (py-spy,
    bench/bench_probes.py). This hands on, per read, all the data the read completes, as soon as
    it comes (part of a chunk included, as h11 does), so an SSE event is still complete on the
    read that brought its last byte and carries that read's arrival. From the last chunk's size
    line on, the raw bytes go back to h11, which reads the trailers, ends the message and keeps
    the connection's state (keep-alive or close) as if it had read the whole body itself.
    A framing error is httpcore2's RemoteProtocolError with h11's words, in `failure` once the
    data before it in the same read is handed on (h11 gives that data first too)."""

    __slots__ = ("_footer", "_left", "_limit", "_pending", "failure")

    def __init__(self, limit: int) -> None:
        self._pending = b""  # an incomplete chunk-size line
        self._left = 0  # data bytes of the current chunk still to come
        self._footer = b""  # what is still to come of the CRLF after a chunk's data
        self._limit = limit  # the longest incomplete line (h11's max_incomplete_event_size)
        self.failure: httpcore2.RemoteProtocolError | None = None

    def feed(self, data: bytes) -> tuple[bytes, bytes | None]:
        """(the body bytes `data` completes, None), or at the last chunk (those bytes, the raw
        rest of the message from the last chunk's size line on). Nothing more after a failure."""
        if self._pending:
            data = self._pending + data
            self._pending = b""
        elif not (self._left or self._footer):
            # The common read at a chunk boundary: one whole chunk, its size line, data and
            # CRLF (a streamed event a read). Taken at once, or by the loop below if not.
            line_end = data.find(b"\r\n", 0, 24)
            if line_end > 0:
                found = _CHUNK_SIZE.fullmatch(data, 0, line_end)
                if found is not None:
                    start = line_end + 2
                    stop = start + int(found[1], 16)
                    if stop > start and stop + 2 == len(data) and data.endswith(b"\r\n"):
                        return data[start:stop], None
        decoded: list[bytes] = []
        left, footer = self._left, self._footer  # locals: this runs for every read
        pos, end = 0, len(data)
        while pos < end:
            if left:
                upto = min(end, pos + left)
                decoded.append(data[pos:upto])
                left -= upto - pos
                pos = upto
                if not left:
                    footer = b"\r\n"
            elif footer:
                got = data[pos : pos + len(footer)]
                if got != footer[: len(got)]:
                    self.failure = httpcore2.RemoteProtocolError(
                        f"malformed chunk footer: {bytearray(got)!r} (expected {footer!r})"
                    )
                    break
                footer = footer[len(got) :]
                pos += len(got)
            else:
                line_end = data.find(b"\r\n", pos)
                if line_end < 0:
                    if end - pos > self._limit:
                        self.failure = httpcore2.RemoteProtocolError("Receive buffer too long")
                        break
                    self._pending = data[pos:]
                    break
                found = _CHUNK_SIZE.fullmatch(data, pos, line_end)
                if found is None:
                    line = bytearray(data[pos : line_end + 2])
                    self.failure = httpcore2.RemoteProtocolError(f"illegal chunk header: {line!r}")
                    break
                size = int(found[1], 16)
                if size == 0:
                    self._left, self._footer = left, footer
                    return b"".join(decoded), data[pos:]
                left = size
                pos = line_end + 2
        self._left, self._footer = left, footer
        return (decoded[0] if len(decoded) == 1 else b"".join(decoded)), None

    def at_boundary(self) -> bool:
        """Whether what was fed ends with a whole chunk (no line, data or CRLF half read)."""
        return not (self._pending or self._left or self._footer)

    def eof_error(self) -> httpcore2.RemoteProtocolError:
        """What h11 raises when the connection ends inside the body."""
        if self._pending:
            return httpcore2.RemoteProtocolError("peer unexpectedly closed connection")
        return httpcore2.RemoteProtocolError(
            "peer closed connection without sending complete message body (incomplete chunked read)"
        )


async def pump_chunked(
    h11_state: h11.Connection,
    stream: AsyncioStream,
    consume: Consume,
    rest: Callable[[], AsyncIterator[bytes]],
) -> None:
    """A chunked body handed to `consume` a read at a time, as read_chunked yields it (the same
    bytes from the same reads, the same errors), each read with its arrival; from the reads
    after the head on, straight from the event loop's callback (AsyncioStream.divert). `rest`
    is h11's reading of what follows the last chunk (its trailers and the message's end)."""
    body = ChunkedBody(MAX_INCOMPLETE_EVENT_SIZE)
    data = h11_state.trailing_data[0]
    chunked = True
    while data:  # what h11 holds: as in read_chunked
        held, reads_on = _h11_step(h11_state, body, data)
        if held:
            consume(held, stream.arrived_at())
        if reads_on is not None:
            chunked = reads_on
            break
        data = await stream.read(READ_SIZE)
        h11_state.receive_data(data)
        chunked = bool(data)
    if chunked:
        end: bytes | None = None

        def sink(data: bytes, now: float) -> bool:
            nonlocal end
            decoded, end = body.feed(data)
            if decoded:
                consume(decoded, now)
            if body.failure is not None:
                raise body.failure
            return end is not None

        if not await stream.divert(sink):  # the stream ended or failed first
            await stream.read(READ_SIZE)  # its ReadError, if it failed
            raise body.eof_error()
        assert end is not None
        h11_state.receive_data(end)
    async for chunk in rest():
        consume(chunk, stream.arrived_at())


async def read_chunked(
    h11_state: h11.Connection,
    stream: httpcore2.AsyncNetworkStream,
    timeout: float | None,
    rest: Callable[[], AsyncIterator[bytes]],
) -> AsyncGenerator[bytes]:
    """A chunked body read with ChunkedBody rather than by h11 an event per chunk, from what h11
    holds after the head on; `rest` is h11's reading of what follows the last chunk."""
    body = ChunkedBody(MAX_INCOMPLETE_EVENT_SIZE)
    data = h11_state.trailing_data[0]
    chunked = True
    # What h11 holds (it came in with the headers) is h11's to read, and so is each read
    # after it until one ends with a whole chunk: ChunkedBody follows along only to tell
    # where that is. From there on, ChunkedBody reads.
    while chunked and data:
        held, reads_on = _h11_step(h11_state, body, data)
        if held:
            yield held
        if reads_on is not None:
            chunked = reads_on
            break
        data = await stream.read(READ_SIZE, timeout=timeout)
        h11_state.receive_data(data)
        chunked = bool(data)  # at the end of the stream, h11 says what is missing
    while chunked:
        data = await stream.read(READ_SIZE, timeout=timeout)
        if not data:
            raise body.eof_error()
        decoded, rest_of_message = body.feed(data)
        if decoded:
            yield decoded
        if body.failure is not None:
            raise body.failure
        if rest_of_message is not None:
            h11_state.receive_data(rest_of_message)
            break
    async for chunk in rest():
        yield chunk


def _h11_step(conn: h11.Connection, body: ChunkedBody, data: bytes) -> tuple[bytes, bool | None]:
    """One read h11 holds (`data`, given to h11 already), before ChunkedBody takes over:
    ChunkedBody follows along only to tell where a read ends with a whole chunk. (The body data
    h11 gives for it, whether ChunkedBody reads from the next read on: True at a whole chunk,
    False if h11 holds the end of the body or an error and reads on, None to read again.)"""
    _, rest = body.feed(data)
    if rest is not None or body.failure is not None:
        return b"", False
    return _h11_data(conn), (True if body.at_boundary() else None)


def _h11_data(conn: h11.Connection) -> bytes:
    """The body data h11 can read from what it holds, which ChunkedBody found to be whole
    chunks (so neither an error nor the end of the body is expected)."""
    data = []
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise httpcore2.RemoteProtocolError(str(exc)) from exc
        if not isinstance(event, h11.Data):
            break
        data.append(bytes(event.data))
    if event is not h11.NEED_DATA:
        raise httpcore2.RemoteProtocolError(f"unexpected {event!r} in a chunked body")
    return b"".join(data)


@dataclass
class DirectRequest:
    """A probe's request for a DirectPool: httpcore2's URL, the head httpx2 builds, the body,
    and the trace callback (httpcore2's trace extension's)."""

    method: bytes
    url: httpcore2.URL
    headers: list[tuple[bytes, bytes]]
    body: bytes
    trace: Callable[[str, dict[str, Any]], Awaitable[None]]


class _Kept:
    """A DirectPool's connection: our stream, its h11 state, when it expires once idle."""

    __slots__ = ("expire_at", "h11", "stream")

    def __init__(self, stream: AsyncioStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(
            our_role=h11.CLIENT, max_incomplete_event_size=MAX_INCOMPLETE_EVENT_SIZE
        )
        self.expire_at = 0.0


class DirectPool:
    """HTTP/1.1 for a client that speaks nothing else: h11 over our streams, without httpcore2's
    pool and connection layers.

    httpcore2's pool walks its connections at every request's start and end, under a lock and
    a cancellation shield, and its HTTP/1.1 connection puts a lock, a trace object per step and
    two stream wrappers around each exchange: together about a fifth of the engine's CPU at 200
    streams (bench/RESULTS.md, "A probe's request without httpcore2's pool"). An HTTP/1.1 exchange
    needs none of it: one request at a time per connection, the connection kept for the next
    request to its origin if h11 ends the exchange cleanly both ways, closed otherwise. What
    goes out is what httpcore2 sends (h11's bytes for the same head and body, in one write),
    the response is read as _HTTP11 reads it (the same chunked readers), and the same
    httpcore2 exceptions come out, as httpx2's. A kept connection is dropped when it has been
    idle past the keep-alive expiry or its socket reads as readable (the server closed it, or
    sent what nobody asked for), as httpcore2's pool drops it; the most recently used goes
    first, and those left idle past their expiry are closed when an exchange ends. tests/probes/test_chunked_body.py holds both paths to the same bodies and keep-alive,
    tests/probes/test_request_path.py to the same request."""

    def __init__(
        self,
        backend: httpcore2.AsyncNetworkBackend,
        ssl_context: ssl.SSLContext,
        keepalive_expiry: float,
        max_idle: int,
    ) -> None:
        self._backend = backend  # probes.transport.TimedBackend: its streams are ours
        self._ssl_context = ssl_context
        self._keepalive_expiry = keepalive_expiry
        self._max_idle = max_idle
        # Per origin, oldest idle first: taken from the right, expired ones swept from the left.
        self._idle: dict[tuple[bytes, bytes, int | None], collections.deque[_Kept]] = {}
        self._closed = False

    async def send(self, request: DirectRequest) -> httpx2.Response:
        try:
            return await self._send(request)
        except Exception as exc:
            raise as_httpx2(exc) from exc

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, {}
        for kept in idle.values():
            for conn in kept:
                await conn.stream.aclose()

    async def _send(self, request: DirectRequest) -> httpx2.Response:
        url = request.url
        if url.scheme not in (b"http", b"https"):  # httpcore2's pool's words
            scheme = url.scheme.decode("ascii", errors="replace")
            raise httpcore2.UnsupportedProtocol(
                f"Request URL has an unsupported protocol '{scheme}://'."
            )
        key = (url.scheme, url.host, url.port)
        conn = await self._take(key)
        if conn is None:
            conn = await self._connect(url, request.trace)
        try:
            return await self._exchange(conn, key, request)
        except BaseException:
            await conn.stream.aclose()
            raise

    async def _take(self, key: tuple[bytes, bytes, int | None]) -> _Kept | None:
        kept = self._idle.get(key)
        now = time.monotonic()
        while kept:
            conn = kept.pop()
            if conn.expire_at > now and not conn.stream.get_extra_info("is_readable"):
                return conn
            await conn.stream.aclose()
        return None

    @staticmethod
    async def _sweep(kept: collections.deque[_Kept], now: float) -> None:
        """Close the idle connections past their expiry, oldest first: those a burst opened
        and nobody has taken since (the server may have closed them long ago)."""
        while kept and kept[0].expire_at <= now:
            await kept.popleft().stream.aclose()

    async def _connect(
        self, url: httpcore2.URL, trace: Callable[[str, dict[str, Any]], Awaitable[None]]
    ) -> _Kept:
        # httpcore2's connection's steps and trace names (connection.py's _connect).
        host = url.host.decode("ascii")
        tls = url.scheme == b"https"
        port = url.port or (443 if tls else 80)
        await trace("connection.connect_tcp.started", {"host": host, "port": port})
        stream = await self._backend.connect_tcp(host, port)
        await trace("connection.connect_tcp.complete", {"return_value": stream})
        if tls:
            await trace("connection.start_tls.started", {"server_hostname": host})
            self._ssl_context.set_alpn_protocols(["http/1.1"])  # read by start_tls at once
            try:
                stream = await stream.start_tls(self._ssl_context, server_hostname=host)
            except BaseException:
                await stream.aclose()
                raise
            await trace("connection.start_tls.complete", {"return_value": stream})
        if not isinstance(stream, AsyncioStream):
            raise TypeError(f"not a stream of ours: {stream!r}")
        return _Kept(stream)

    async def _exchange(
        self, conn: _Kept, key: tuple[bytes, bytes, int | None], request: DirectRequest
    ) -> httpx2.Response:
        state, stream, trace = conn.h11, conn.stream, request.trace
        await trace("http11.send_request_headers.started", {})
        try:
            data = state.send(
                h11.Request(
                    method=request.method, target=request.url.target, headers=request.headers
                )
            )
            if request.body:
                data += state.send(h11.Data(data=request.body))
            data += state.send(h11.EndOfMessage())
        except h11.LocalProtocolError as exc:
            raise httpcore2.LocalProtocolError(str(exc)) from exc
        # As httpcore2: a server may answer (an error) and close before reading it all.
        with contextlib.suppress(httpcore2.WriteError):
            await stream.write(data)
        await trace("http11.send_request_body.complete", {})
        # The head's reads end with the head, as _HTTP11's: its body bytes wait in the stream.
        stream.headers_only = True
        try:
            while True:
                event = await _h11_next(state, stream)
                if isinstance(event, h11.Response) or (
                    isinstance(event, h11.InformationalResponse) and event.status_code == 101
                ):
                    break
        finally:
            stream.headers_only = False
        status = event.status_code
        body = _KeptBody(self, conn, key)
        extensions: dict[str, Any] = {
            "http_version": b"HTTP/" + event.http_version,
            "reason_phrase": event.reason,
            "network_stream": stream,
            CORE_BODY: body,
        }
        # h11's framing rules, as _HTTP11.handle_async_request's.
        if (
            status >= 200
            and status not in (204, 304)
            and request.method not in (b"HEAD", b"CONNECT")
            and any(name == b"transfer-encoding" for name, _ in event.headers)
        ):
            extensions[CHUNKED_BODY] = body.chunked()
            extensions[CHUNKED_PUMP] = body.pump
        return httpx2.Response(
            status_code=status,
            headers=event.headers.raw_items(),
            stream=CoreBodyStream(body),
            extensions=extensions,
        )

    async def release(self, conn: _Kept, key: tuple[bytes, bytes, int | None]) -> None:
        """A response's connection back (its body closed): kept if its exchange ended cleanly."""
        state = conn.h11
        if state.our_state is h11.DONE and state.their_state is h11.DONE and not self._closed:
            kept = self._idle.setdefault(key, collections.deque())
            now = time.monotonic()
            await self._sweep(kept, now)
            if len(kept) < self._max_idle:
                state.start_next_cycle()
                conn.expire_at = now + self._keepalive_expiry
                kept.append(conn)
                return
        await conn.stream.aclose()


class _KeptBody:
    """A DirectPool response's body: read once, pumped or iterated, then closed, which gives
    its connection back to the pool or closes it."""

    def __init__(self, pool: DirectPool, conn: _Kept, key: tuple[bytes, bytes, int | None]) -> None:
        self._pool, self._conn, self._key = pool, conn, key
        self._closed = False

    def _rest(self) -> AsyncIterator[bytes]:
        return _h11_body(self._conn.h11, self._conn.stream)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._rest()

    def chunked(self) -> AsyncIterator[bytes]:
        return read_chunked(self._conn.h11, self._conn.stream, None, self._rest)

    async def pump(self, consume: Consume) -> None:
        await pump_chunked(self._conn.h11, self._conn.stream, consume, self._rest)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._pool.release(self._conn, self._key)


async def _h11_next(state: h11.Connection, stream: AsyncioStream) -> h11.Event | type[h11.PAUSED]:
    """h11's next event, reading when it needs data: httpcore2 2.16's _receive_event (its
    words when the server closes before answering)."""
    while True:
        try:
            event = state.next_event()
        except h11.RemoteProtocolError as exc:
            raise httpcore2.RemoteProtocolError(str(exc)) from exc
        if event is not h11.NEED_DATA:
            return cast("h11.Event | type[h11.PAUSED]", event)  # h11's types do not narrow
        data = await stream.read(READ_SIZE)
        if not data and state.their_state is h11.SEND_RESPONSE:
            raise httpcore2.RemoteProtocolError("Server disconnected without sending a response.")
        state.receive_data(data)


async def _h11_body(state: h11.Connection, stream: AsyncioStream) -> AsyncGenerator[bytes]:
    """A body as h11 reads it, an event per chunk: httpcore2 2.16's _receive_response_body."""
    while True:
        event = await _h11_next(state, stream)
        if isinstance(event, h11.Data):
            yield bytes(event.data)
        elif isinstance(event, (h11.EndOfMessage, h11.PAUSED)):
            break
