"""The simulator's HTTP server: asyncio protocols on h11 (HTTP/1.1) and h2 (HTTP/2).

Why hand-rolled and not hypercorn (the first version used it): at 500 concurrent streams of
50 chunks/s, hypercorn's per-chunk path (ASGI message dicts, task groups, h11 Data events)
saturated a core and the send lag p99 reached about 100 ms. Here a streamed chunk costs one
`transport.write` of pre-framed bytes. h11 and h2 still do all request parsing and every
HTTP/2 frame; only HTTP/1.1 chunk framing is written by hand (byte-identical to h11's).

HTTP/2 is offered through TLS ALPN ("h2") and as h2c with prior knowledge (a plaintext
connection that opens with the HTTP/2 preface). The Upgrade: h2c dance is not supported.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h11

MAX_BODY_BYTES = 20 * 1024 * 1024
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_clock = time.perf_counter


@dataclass
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    http_version: str  # "1.1" or "2"
    received_at: float  # perf_counter when the body was fully read


class Responder(ABC):
    """One response. Every method returns at once. `start`, `write` and `end` return the
    perf_counter time at which their bytes were handed to the transport (taken just before the
    hand-over, so a client on the same host never sees bytes before their recorded time)."""

    http_version: str

    def __init__(self) -> None:
        self.closed = False
        self.started = False
        self._close_callbacks: list[Callable[[], None]] = []
        self._closed_future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @abstractmethod
    def start(
        self, status: int, headers: list[tuple[str, str]], content_length: int | None = None
    ) -> float: ...

    @abstractmethod
    def write(self, data: bytes) -> float: ...

    @abstractmethod
    def end(self) -> float: ...

    @abstractmethod
    def abort(self) -> None:
        """Break the response off: the client sees the connection (or HTTP/2 stream) die."""

    @abstractmethod
    async def drain(self) -> None:
        """Wait until the transport wants more (flow control, socket buffers). Always yields
        to the loop once, so a writer that never fills the buffers cannot starve the others."""

    def respond(self, status: int, headers: list[tuple[str, str]], body: bytes) -> float:
        self.start(status, headers, content_length=len(body))
        sent = self.write(body) if body else _clock()
        self.end()
        return sent

    def on_close(self, callback: Callable[[], None]) -> None:
        if self.closed:
            callback()
        else:
            self._close_callbacks.append(callback)

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed_future)

    def _mark_closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self._closed_future.done():
            self._closed_future.set_result(None)
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            callback()


Handler = Callable[[Request, Responder], Awaitable[None]]


class _WriteGate:
    """asyncio flow control of one transport (pause_writing / resume_writing)."""

    def __init__(self) -> None:
        self.paused = False
        self._waiters: list[asyncio.Future[None]] = []

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self) -> None:
        if self.paused:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


class Connection(asyncio.Protocol):
    """One client connection; becomes HTTP/1.1 or HTTP/2 once the first bytes (or ALPN) tell."""

    def __init__(self, handler: Handler, *, http2: bool) -> None:
        self.handler = handler
        self.http2 = http2
        self.transport: asyncio.Transport | None = None
        self.gate = _WriteGate()
        self.mode: _H1 | _H2 | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self._sniffed = b""

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        ssl_object = self.transport.get_extra_info("ssl_object")
        if isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
            self.mode = _H2(self) if ssl_object.selected_alpn_protocol() == "h2" else _H1(self)

    def data_received(self, data: bytes) -> None:
        if self.mode is None:
            # Plaintext: h2c with prior knowledge opens with the preface; wait for enough bytes.
            data, self._sniffed = self._sniffed + data, b""
            if self.http2 and len(data) < len(H2_PREFACE) and H2_PREFACE.startswith(data):
                self._sniffed = data
                return
            self.mode = _H2(self) if self.http2 and data.startswith(H2_PREFACE) else _H1(self)
        self.mode.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.resume()
        if self.mode is not None:
            self.mode.connection_lost()
        for task in list(self.tasks):
            task.cancel()

    def pause_writing(self) -> None:
        self.gate.pause()

    def resume_writing(self) -> None:
        self.gate.resume()

    # --- shared -------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def dispatch(self, request: Request, responder: Responder) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._run(request, responder))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _run(self, request: Request, responder: Responder) -> None:
        try:
            await self.handler(request, responder)
        except asyncio.CancelledError:
            responder._mark_closed()
            raise
        except Exception:
            if not responder.started and not responder.closed:
                responder.respond(500, [("content-type", "text/plain")], b"internal error\n")
            else:
                responder.abort()
            raise


# --- HTTP/1.1 ---------------------------------------------------------------------------


class _H1:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        self.request: h11.Request | None = None
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.responder: _H1Responder | None = None

    def data_received(self, data: bytes) -> None:
        self.h11.receive_data(data)
        self._process()

    def connection_lost(self) -> None:
        if self.responder is not None:
            self.responder._mark_closed()

    def _process(self) -> None:
        while self.responder is None:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._reject(exc.error_status_hint, str(exc))
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self.request, self.body, self.body_bytes = event, [], 0
            elif isinstance(event, h11.Data):
                self.body_bytes += len(event.data)
                if self.body_bytes > MAX_BODY_BYTES:
                    self._reject(413, "request body too large")
                    return
                self.body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._dispatch()
            elif isinstance(event, h11.ConnectionClosed):
                self.conn.close()
                return

    def _reject(self, status: int, message: str) -> None:
        body = f"{message}\n".encode()
        with contextlib.suppress(h11.LocalProtocolError):
            self.conn.write(
                self.h11.send(
                    h11.Response(
                        status_code=status,
                        headers=[
                            ("content-type", "text/plain"),
                            ("content-length", str(len(body))),
                            ("connection", "close"),
                        ],
                    )
                )
                + (self.h11.send(h11.Data(body)) or b"")
                + (self.h11.send(h11.EndOfMessage()) or b"")
            )
        self.conn.close()

    def _dispatch(self) -> None:
        assert self.request is not None
        received_at = _clock()
        target = self.request.target.decode("latin-1")
        path, _, query = target.partition("?")
        headers: dict[str, str] = {}
        for name, value in self.request.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        request = Request(
            method=self.request.method.decode("ascii"),
            path=path,
            query=query,
            headers=headers,
            body=b"".join(self.body),
            http_version="1.1" if self.request.http_version == b"1.1" else "1.0",
            received_at=received_at,
        )
        self.body = []
        self.responder = _H1Responder(self)
        self.conn.dispatch(request, self.responder)

    def finished(self) -> None:
        """The response is complete: next request on this connection, or close."""
        self.responder = None
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            self._process()
        elif self.h11.our_state is h11.MUST_CLOSE or self.h11.their_state is not h11.DONE:
            self.conn.close()


class _H1Responder(Responder):
    def __init__(self, h1: _H1) -> None:
        super().__init__()
        self.h1 = h1
        self.http_version = "1.1"
        self.chunked = False

    def start(
        self, status: int, headers: list[tuple[str, str]], content_length: int | None = None
    ) -> float:
        self.started = True
        if content_length is not None:
            headers = [*headers, ("content-length", str(content_length))]
        elif self.h1.h11.their_http_version == b"1.1":
            headers = [*headers, ("transfer-encoding", "chunked")]
            self.chunked = True
        head = self.h1.h11.send(h11.Response(status_code=status, headers=headers)) or b""
        now = _clock()
        self.h1.conn.write(head)
        return now

    def write(self, data: bytes) -> float:
        if self.chunked:
            # Hand-framed chunk: h11 keeps no count for chunked bodies, and this skips its
            # per-event machinery on the hot path (one streamed token = one call here).
            framed = b"%x\r\n%b\r\n" % (len(data), data)
        else:
            framed = (self.h1.h11.send(h11.Data(data)) or b"") if data else b""
        now = _clock()
        self.h1.conn.write(framed)
        return now

    def end(self) -> float:
        now = _clock()
        if not self.closed:
            try:
                self.h1.conn.write(self.h1.h11.send(h11.EndOfMessage()) or b"")
            except h11.LocalProtocolError:
                self.h1.conn.close()
            self._mark_closed()
            self.h1.finished()
        return now

    def abort(self) -> None:
        # Flushes what was written, then closes with no terminating chunk.
        self.h1.conn.close()
        self._mark_closed()

    async def drain(self) -> None:
        await asyncio.sleep(0)
        await self.h1.conn.gate.wait()
        if self.closed:
            raise ConnectionResetError("client went away")


# --- HTTP/2 -----------------------------------------------------------------------------


class _H2:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        config = h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_inbound_headers=False
        )
        self.h2 = h2.connection.H2Connection(config=config)
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 4 * 1024 * 1024,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024,
            },
        )
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(16 * 1024 * 1024)
        self.streams: dict[int, _H2Stream] = {}
        self.flush()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.conn.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self.flush()
            self.conn.close()
            return
        for event in events:
            self._event(event)
        self.flush()

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            assert event.stream_id is not None
            self.streams[event.stream_id] = _H2Stream(self, event.stream_id, event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            assert event.stream_id is not None
            stream = self.streams.get(event.stream_id)
            self.h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
            if stream is not None and event.data:
                stream.body_bytes += len(event.data)
                if stream.body_bytes > MAX_BODY_BYTES:
                    self.h2.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
                    self.streams.pop(event.stream_id, None)
                else:
                    stream.body.append(event.data)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id or 0)
            if stream is not None and stream.responder is None:
                stream.dispatch()
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.pop(event.stream_id or 0, None)
            if stream is not None and stream.responder is not None:
                stream.responder._mark_closed()
                if stream.task is not None:
                    stream.task.cancel()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            for stream in list(self.streams.values()):
                if stream.responder is not None:
                    stream.responder.flush_pending()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.conn.close()

    def connection_lost(self) -> None:
        for stream in self.streams.values():
            if stream.responder is not None:
                stream.responder._mark_closed()
        self.streams.clear()


class _H2Stream:
    def __init__(self, h2conn: _H2, stream_id: int, headers: Iterable[Any]) -> None:
        self.h2conn = h2conn
        self.stream_id = stream_id
        self.headers: dict[str, str] = {}
        self.pseudo: dict[str, str] = {}
        name: bytes | str
        value: bytes | str
        for name, value in headers:
            key = name.decode("latin-1") if isinstance(name, bytes) else str(name)
            text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
            if key.startswith(":"):
                self.pseudo[key] = text
            else:
                self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text
        self.body: list[bytes] = []
        self.body_bytes: int = 0
        self.responder: _H2Responder | None = None
        self.task: asyncio.Task[None] | None = None

    def dispatch(self) -> None:
        path, _, query = self.pseudo.get(":path", "/").partition("?")
        if "host" not in self.headers and ":authority" in self.pseudo:
            self.headers["host"] = self.pseudo[":authority"]  # what HTTP/1.1 calls Host (SigV4)
        request = Request(
            method=self.pseudo.get(":method", "GET"),
            path=path,
            query=query,
            headers=self.headers,
            body=b"".join(self.body),
            http_version="2",
            received_at=_clock(),
        )
        self.body = []
        self.responder = _H2Responder(self)
        self.task = self.h2conn.conn.dispatch(request, self.responder)


class _H2Responder(Responder):
    def __init__(self, stream: _H2Stream) -> None:
        super().__init__()
        self.stream = stream
        self.h2conn = stream.h2conn
        self.http_version = "2"
        self.pending = bytearray()
        self.ending = False
        self._window_waiters: list[asyncio.Future[None]] = []
        self.on_close(self._release_waiters)

    def start(
        self, status: int, headers: list[tuple[str, str]], content_length: int | None = None
    ) -> float:
        self.started = True
        fields = [(":status", str(status)), *headers]
        if content_length is not None:
            fields.append(("content-length", str(content_length)))
        now = _clock()
        try:
            self.h2conn.h2.send_headers(self.stream.stream_id, fields)
        except h2.exceptions.ProtocolError:
            self._mark_closed()
        self.h2conn.flush()
        return now

    def write(self, data: bytes) -> float:
        now = _clock()
        if not self.closed:
            self.pending += data
            self.flush_pending()
        return now

    def flush_pending(self) -> None:
        conn, sid = self.h2conn.h2, self.stream.stream_id
        try:
            while self.pending:
                size = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                if size <= 0:
                    break
                conn.send_data(sid, bytes(self.pending[:size]))
                del self.pending[:size]
            if not self.pending and self.ending:
                conn.end_stream(sid)
                self.ending = False
                self.h2conn.streams.pop(sid, None)
                self._mark_closed()
        except (h2.exceptions.ProtocolError, KeyError):
            self.pending.clear()
            self._mark_closed()
        self.h2conn.flush()
        if not self.pending:
            self._release_waiters()

    def _release_waiters(self) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def end(self) -> float:
        now = _clock()
        if not self.closed:
            self.ending = True
            self.flush_pending()
        return now

    def abort(self) -> None:
        if not self.closed:
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2conn.h2.reset_stream(
                    self.stream.stream_id, h2.errors.ErrorCodes.INTERNAL_ERROR
                )
            self.h2conn.streams.pop(self.stream.stream_id, None)
            self.h2conn.flush()
            self._mark_closed()

    async def drain(self) -> None:
        await asyncio.sleep(0)
        while self.pending and not self.closed:
            waiter = asyncio.get_running_loop().create_future()
            self._window_waiters.append(waiter)
            await waiter
        await self.h2conn.conn.gate.wait()
        if self.closed:
            raise ConnectionResetError("client went away")


async def serve(
    handler: Handler,
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    http2: bool = True,
    backlog: int = 4096,
) -> asyncio.Server:
    """Start listening; the caller keeps the loop running (and closes the server)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: Connection(handler, http2=http2),
        host,
        port,
        ssl=ssl_context,
        backlog=backlog,
        reuse_address=True,
    )


async def serve_socket(
    handler: Handler,
    sock: socket.socket,
    *,
    ssl_context: ssl.SSLContext | None = None,
    http2: bool = True,
    backlog: int = 4096,
) -> asyncio.Server:
    """Serve on a bound socket: a TCP socket of the cluster's (SO_REUSEPORT), or a Unix socket
    (HTTP/1.1 only). asyncio and uvloop call listen() again, with `backlog`."""
    loop = asyncio.get_running_loop()
    if sock.family == socket.AF_UNIX:
        return await loop.create_unix_server(
            lambda: Connection(handler, http2=False), sock=sock, backlog=backlog
        )
    return await loop.create_server(
        lambda: Connection(handler, http2=http2), sock=sock, ssl=ssl_context, backlog=backlog
    )


def tls_context(certfile: str, keyfile: str, *, http2: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    context.set_alpn_protocols(["h2", "http/1.1"] if http2 else ["http/1.1"])
    return context
