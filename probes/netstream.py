"""httpcore network streams on plain asyncio transports (instead of httpcore's anyio backend).

Why: at 200 concurrent streams the anyio backend cost most of the engine's CPU per streamed
chunk (bench/bench_probes.py, profiled with py-spy). Its socket stream resumes reading before
every receive and pauses it after (two epoll_ctl system calls per chunk), and httpcore wraps
every read in anyio.fail_after (a cancel scope, even without a timeout). Here the transport
keeps reading into a small queue; a read takes from it or waits on one future.

What httpcore relies on is kept: the same exceptions (ReadError, ConnectError, ...Timeout), b""
at the end of the stream, "is_readable" for spotting a dead pooled connection, and a write that
returns only once the kernel has taken every byte (the trace's body-sent time, so upload_ms, is
unchanged). TLS runs over the same protocol with ssl.MemoryBIO, as anyio does, rather than
asyncio's start_tls: its TLS transport reports write flow control differently (a zero
high-water mark pauses it on every other write), so "the kernel has the bytes" could not be
awaited through it.

Every chunk keeps the perf_counter time at which asyncio handed it over (data_received, before
any HTTP, SSE or JSON parsing); `arrived_at()` gives the arrival time of the chunk httpcore read
last, so the engine can stamp a streamed event with when its bytes came off the socket rather
than when the parsers above got to it (under load, other streams' parsing would sit in between).

Memory stays bounded: reading pauses once READ_HIGH_WATER bytes wait unread and resumes when
the reader has drained half of them (a 200 MB response is never buffered here).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Iterable
from typing import Any, cast

import httpcore
from httpcore._utils import is_socket_readable

READ_HIGH_WATER = 256 * 1024
_TLS_READ = 64 * 1024


class _Protocol(asyncio.Protocol):
    """Queues what arrives (decrypted, once TLS has started) for AsyncioStream.read."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.arrivals: collections.deque[float] = collections.deque()  # one per chunk
        self.last_arrival = 0.0  # arrival of the chunk read last
        self.buffered = 0
        self.waiter: asyncio.Future[None] | None = None
        self.write_waiter: asyncio.Future[None] | None = None
        self.eof = False
        self.lost = False
        self.exception: BaseException | None = None
        self.paused_reading = False
        self.paused_writing = False
        self.tls: ssl.SSLObject | None = None
        self.tls_in = ssl.MemoryBIO()
        self.tls_out = ssl.MemoryBIO()
        self.handshake: asyncio.Future[None] | None = None

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport = cast(asyncio.Transport, transport)
        # Pause (and so make writes wait) whenever anything is left unsent: a write completes
        # when the kernel has all of its bytes, as with anyio.
        transport.set_write_buffer_limits(0)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.tls is None:
            self._queue(data, now)
        else:
            self.tls_in.write(data)
            self.tls_pump(now)
        self._wake()

    def eof_received(self) -> bool:
        # With TLS, an end without close_notify counts as the end too (anyio's
        # standard_compatible=False): whether the response was complete is judged from the
        # HTTP framing and the stream's own end events, not from TLS.
        self.eof = True
        self._fail_handshake(ConnectionResetError("the server closed the connection"))
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if exc is not None and self.exception is None:
            self.exception = exc
        self._fail_handshake(exc or ConnectionResetError("the connection was closed"))
        self._wake()
        self._wake_writer()

    def pause_writing(self) -> None:
        self.paused_writing = True

    def resume_writing(self) -> None:
        self.paused_writing = False
        self._wake_writer()

    # helpers

    def _queue(self, data: bytes, now: float) -> None:
        self.chunks.append(data)
        self.arrivals.append(now)
        self.buffered += len(data)
        if self.buffered > READ_HIGH_WATER and not self.paused_reading:
            assert self.transport is not None
            self.transport.pause_reading()
            self.paused_reading = True

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        waiter = self.write_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail_handshake(self, exc: BaseException) -> None:
        if self.handshake is not None and not self.handshake.done():
            self.handshake.set_exception(exc)

    def tls_flush(self) -> None:
        if self.tls_out.pending:
            assert self.transport is not None
            self.transport.write(self.tls_out.read())

    def tls_pump(self, now: float) -> None:
        tls = self.tls
        assert tls is not None
        try:
            if self.handshake is not None and not self.handshake.done():
                try:
                    tls.do_handshake()
                except ssl.SSLWantReadError:
                    return
                finally:
                    self.tls_flush()
                self.handshake.set_result(None)
            while True:
                try:
                    data = tls.read(_TLS_READ)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:  # close_notify
                    self.eof = True
                    break
                if not data:
                    self.eof = True
                    break
                self._queue(data, now)
            self.tls_flush()  # TLS 1.3 may answer post-handshake messages
        except (ssl.SSLError, OSError) as exc:
            if self.handshake is not None and not self.handshake.done():
                self.handshake.set_exception(exc)
            else:
                self.exception = exc
            assert self.transport is not None
            self.transport.abort()


async def _readable(protocol: _Protocol) -> None:
    """Until data, the end, or a failure. TLS records that carry no data (a session ticket)
    wake the reader too: it waits again."""
    while not (protocol.chunks or protocol.eof or protocol.lost):
        waiter = protocol.waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            protocol.waiter = None


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._closed = False

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        protocol = self._protocol
        chunks = protocol.chunks
        if not chunks:
            if self._closed:
                raise httpcore.ReadError("the stream is closed")
            if not (protocol.eof or protocol.lost):
                if timeout is None:
                    await _readable(protocol)
                else:
                    try:
                        async with asyncio.timeout(timeout):
                            await _readable(protocol)
                    except TimeoutError as exc:
                        raise httpcore.ReadTimeout(exc) from exc
            if not chunks:
                failure = protocol.exception
                if failure is not None:
                    raise httpcore.ReadError(failure) from failure
                if protocol.eof:
                    return b""
                raise httpcore.ReadError("the connection was closed")
        chunk = chunks.popleft()
        protocol.last_arrival = protocol.arrivals.popleft()
        if len(chunk) > max_bytes:
            chunks.appendleft(chunk[max_bytes:])
            protocol.arrivals.appendleft(protocol.last_arrival)
            chunk = chunk[:max_bytes]
        protocol.buffered -= len(chunk)
        if protocol.paused_reading and protocol.buffered <= READ_HIGH_WATER // 2:
            protocol.paused_reading = False
            self._transport.resume_reading()
        return chunk

    def arrived_at(self) -> float:
        """When the chunk read last arrived (perf_counter seconds)."""
        return self._protocol.last_arrival

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        protocol = self._protocol
        if self._closed or protocol.lost or self._transport.is_closing():
            failure = protocol.exception
            raise httpcore.WriteError(failure or "the connection is closed") from failure
        if protocol.tls is not None:
            try:
                protocol.tls.write(buffer)
            except ssl.SSLError as exc:
                raise httpcore.WriteError(exc) from exc
            protocol.tls_flush()
        else:
            self._transport.write(buffer)
        if not protocol.paused_writing:
            return
        waiter = protocol.write_waiter = asyncio.get_running_loop().create_future()
        try:
            if timeout is None:
                await waiter
            else:
                async with asyncio.timeout(timeout):
                    await waiter
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(exc) from exc
        finally:
            protocol.write_waiter = None
        if protocol.lost:
            failure = protocol.exception
            raise httpcore.WriteError(failure or "the connection was closed") from failure

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        protocol = self._protocol
        if protocol.tls is not None or protocol.lost or protocol.eof:
            raise httpcore.ConnectError("TLS cannot start on this connection")
        protocol.tls = ssl_context.wrap_bio(
            protocol.tls_in, protocol.tls_out, server_side=False, server_hostname=server_hostname
        )
        handshake = protocol.handshake = asyncio.get_running_loop().create_future()
        try:
            protocol.tls_pump(time.perf_counter())  # sends the ClientHello
            async with asyncio.timeout(timeout):
                await handshake
        except TimeoutError as exc:
            self._transport.abort()
            raise httpcore.ConnectTimeout(exc) from exc
        except (ssl.SSLError, OSError) as exc:
            self._transport.abort()
            raise httpcore.ConnectError(exc) from exc
        except BaseException:
            self._transport.abort()
            raise
        return self

    def get_extra_info(self, info: str) -> Any:
        transport = self._transport
        if info == "ssl_object":
            return self._protocol.tls
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "socket":
            return transport.get_extra_info("socket")
        if info == "is_readable":
            # Data or an end of stream already taken off the socket counts as readable: a pooled
            # connection with either is not clean for a new request.
            protocol = self._protocol
            if protocol.chunks or protocol.eof or protocol.lost or transport.is_closing():
                return True
            return is_socket_readable(transport.get_extra_info("socket"))
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(
                    _Protocol,
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                )
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.ConnectError(exc) from exc
        # asyncio sets TCP_NODELAY on TCP transports, as anyio does.
        sock = transport.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(transport, protocol)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_unix_connection(_Protocol, path)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(exc) from exc
        except OSError as exc:
            raise httpcore.ConnectError(exc) from exc
        sock = transport.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
