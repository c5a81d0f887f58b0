"""httpcore2 network streams on non-blocking sockets read by the event loop directly.

Why not httpcore2's anyio backend: at 200 concurrent streams it cost most of the engine's CPU per
streamed chunk (bench/bench_probes.py, profiled with py-spy on httpcore 1.0, whose backend
httpcore2 2.16 keeps line for line). Its socket stream resumes reading
before every receive and pauses it after (two epoll_ctl system calls per chunk), and httpcore2
wraps every read in anyio.fail_after (a cancel scope, even without a timeout). Here the loop
calls us when the socket is readable (loop.add_reader, in asyncio's selector loops and uvloop
alike); we read into a small queue, and a read takes from it or waits on one future. A streamed
body can skip even that: `divert` hands each read to a sink (the engine's parsers, through
probes/transport.py's body_pump) from the loop's callback, so a read wakes no task at all.

Why not asyncio's transports: they read with recv(), which drops the one thing a measuring
client most wants, the kernel's receive timestamp. Each read here asks for it (SO_TIMESTAMPNS,
Linux): a chunk's arrival is when the kernel queued its last segment, however busy the event
loop was with other streams, a garbage collection or the parsers. Elsewhere (or if the kernel
gives none) the arrival is the time of the read. The kernel stamps CLOCK_REALTIME; it becomes a
perf_counter time through the wait measured on the realtime clock at the read, so a clock
offset never enters, and a wait that is negative or implausibly long (the clock was stepped)
falls back to the time of the read. `arrived_at()` gives the arrival of the chunk httpcore2 read
last; the engine stamps streamed events with it, before any HTTP, SSE or JSON parsing. Leaving
out the transport layer also cut the engine's CPU at 200 streams by a fifth.

What httpcore2 relies on is kept: the same exceptions (ReadError, ConnectError, ...Timeout), b""
at the end of the stream, "is_readable" for spotting a dead pooled connection, and a write that
returns only once the kernel has taken every byte, as with anyio; `write_done` tells when that
was, for the body-sent time (upload_ms). TLS runs with ssl.MemoryBIO over the same socket, as
anyio does.

The loop must offer add_reader: asyncio's selector loops (the default on Linux and macOS) and
uvloop do; on Windows the probes need the selector loop, not the proactor.

Memory stays bounded: reading stops once READ_HIGH_WATER bytes wait unread and resumes when the
reader has drained half of them (a 200 MB response is never buffered here).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import ipaddress
import select
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any

import httpcore2

READ_HIGH_WATER = 256 * 1024
READ_SIZE = 64 * 1024
# SO_TIMESTAMPNS (= SCM_TIMESTAMPNS) is 35 on Linux; the socket module does not name it.
_SO_TIMESTAMPNS = 35 if sys.platform == "linux" else None
_TIMESPEC = struct.Struct("@qq")
_ANCILLARY_SIZE = socket.CMSG_SPACE(_TIMESPEC.size) if _SO_TIMESTAMPNS is not None else 0
# A kernel stamp older than this at the read means the realtime clock moved under us.
_MAX_WAIT_NS = 60 * 1_000_000_000

# When the kernel took the last byte of the latest write made in this context (perf_counter):
# the probe's body-sent time, without the HTTP client's own work after the write.
write_done: ContextVar[float] = ContextVar("probes_write_done", default=0.0)


class _Connection:
    """One socket, read whenever it is readable, with the kernel's receive time of each read."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, family: int | None = None
    ) -> None:
        # `family` is the socket's, passed by who made it: sock.family converts to an enum in
        # Python on every read of it (~0.6% of the engine's CPU at 200 new connections).
        family = sock.family if family is None else family
        self.loop = loop
        self.sock = sock
        # The loop is given the descriptor, not the socket: asyncio's selector looks a new
        # reader up first, and the KeyError it raises for the socket formats its repr (two
        # system calls for the addresses) on every connection.
        self.fd = sock.fileno()
        self.chunks: collections.deque[bytes] = collections.deque()
        self.arrivals: collections.deque[float] = collections.deque()  # one per chunk
        self.last_arrival = 0.0  # arrival of the chunk read last
        self.buffered = 0
        self.waiter: asyncio.Future[None] | None = None
        self.write_waiter: asyncio.Future[None] | None = None
        self.unsent = bytearray()
        self.drained_at = 0.0  # when the kernel last took every byte handed to it
        self.eof = False
        self.lost = False
        self.closed = False
        self.exception: BaseException | None = None
        # While set (AsyncioStream.divert), each read goes to the sink from the loop's callback,
        # with its arrival, instead of the queue: no task wakes for it.
        self.sink: Callable[[bytes, float], bool] | None = None
        self.sink_done = False
        self.sink_error: Exception | None = None
        self.tls: ssl.SSLObject | None = None
        self.tls_in = ssl.MemoryBIO()
        self.tls_out = ssl.MemoryBIO()
        self.handshake: asyncio.Future[None] | None = None
        self.kernel_stamps = False
        if _SO_TIMESTAMPNS is not None and family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                self.kernel_stamps = True
            except OSError:
                pass
        self.reading = True
        loop.add_reader(self.fd, self._on_readable)

    # the loop's callbacks

    def _on_readable(self) -> None:
        try:
            if self.kernel_stamps:
                data, ancillary, _, _ = self.sock.recvmsg(READ_SIZE, _ANCILLARY_SIZE)
            else:
                data, ancillary = self.sock.recv(READ_SIZE), []
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(exc)
            return
        now = time.perf_counter()
        if ancillary:
            now = _kernel_arrival(ancillary, now)
        if not data:
            self.eof = True
            self._stop_reading()
            self._fail_handshake(ConnectionResetError("the server closed the connection"))
        elif self.tls is None:
            self._queue(data, now)
        else:
            self.tls_in.write(data)
            self.tls_pump(now)
        if self.sink is None or self.eof or self.lost:
            self._wake()

    def _on_writable(self) -> None:
        try:
            sent = self.sock.send(self.unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(exc)
            return
        del self.unsent[:sent]
        if not self.unsent:
            self.drained_at = time.perf_counter()
            self.loop.remove_writer(self.fd)
            self._wake_writer()

    # helpers

    def send(self, data: bytes) -> bool:
        """Hand bytes to the kernel; False while some wait for the socket to drain."""
        if self.unsent:
            self.unsent += data
            return False
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._fail(exc)
            raise httpcore2.WriteError(exc) from exc
        if sent == len(data):
            self.drained_at = time.perf_counter()
            return True
        self.unsent += data[sent:]
        self.loop.add_writer(self.fd, self._on_writable)
        return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._stop_reading()
        if self.unsent:
            self.loop.remove_writer(self.fd)
            self.unsent.clear()
        self.sock.close()
        self._wake()
        self._wake_writer()

    def start_reading(self) -> None:
        if not self.reading and not (self.eof or self.lost or self.closed):
            self.reading = True
            self.loop.add_reader(self.fd, self._on_readable)

    def _stop_reading(self) -> None:
        if self.reading:
            self.reading = False
            self.loop.remove_reader(self.fd)

    def _fail(self, exc: BaseException) -> None:
        self.lost = True
        if self.exception is None:
            self.exception = exc
        self._stop_reading()
        if self.unsent:
            self.loop.remove_writer(self.fd)
            self.unsent.clear()
        self._fail_handshake(exc)
        self._wake()
        self._wake_writer()

    def _queue(self, data: bytes, now: float) -> None:
        sink = self.sink
        if sink is not None:
            self.last_arrival = now
            try:
                done = sink(data, now)
            except Exception as exc:  # raised in the reading task, by divert
                self.sink_error = exc
                done = True
            if done:
                self.sink = None
                self.sink_done = True
                self._wake()
            return
        self.chunks.append(data)
        self.arrivals.append(now)
        self.buffered += len(data)
        if self.buffered > READ_HIGH_WATER:
            self._stop_reading()

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
            self.send(self.tls_out.read())

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
                    data = tls.read(READ_SIZE)
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
        except (ssl.SSLError, OSError, httpcore2.WriteError) as exc:
            self._fail(exc)


def _kernel_arrival(ancillary: list[tuple[int, int, bytes]], now: float) -> float:
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(payload) >= 16:
            seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
            waited_ns: int = time.time_ns() - (seconds * 1_000_000_000 + nanoseconds)
            if 0 <= waited_ns < _MAX_WAIT_NS:
                return now - waited_ns / 1e9
    return now


def _socket_readable(sock: socket.socket) -> bool:
    """Whether a read would return at once (data, the end, or an error), without reading: how
    httpcore2 spots a pooled connection the server has closed. A closed socket counts."""
    fd = sock.fileno()
    if fd < 0:
        return True
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)  # Windows
    return bool(readable)


async def _readable(conn: _Connection) -> None:
    """Until data, the end, or a failure. TLS records that carry no data (a session ticket)
    wake the reader too: it waits again."""
    while not (conn.chunks or conn.eof or conn.lost or conn.closed):
        waiter = conn.waiter = conn.loop.create_future()
        try:
            await waiter
        finally:
            conn.waiter = None


class AsyncioStream(httpcore2.AsyncNetworkStream):
    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        # While set, a read ends where an HTTP/1.1 head ends (its first blank line, CRLF CRLF)
        # and the rest of what came in waits for the next read, with the same arrival: the
        # body that came with the headers is then not left to h11 (probes/transport.py).
        self.headers_only = False

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        conn = self._conn
        chunks = conn.chunks
        if not chunks:
            if conn.closed:
                raise httpcore2.ReadError("the stream is closed")
            if not (conn.eof or conn.lost):
                if timeout is None:
                    await _readable(conn)
                else:
                    try:
                        async with asyncio.timeout(timeout):
                            await _readable(conn)
                    except TimeoutError as exc:
                        raise httpcore2.ReadTimeout(exc) from exc
            if not chunks:
                failure = conn.exception
                if failure is not None:
                    raise httpcore2.ReadError(failure) from failure
                if conn.eof:
                    return b""
                raise httpcore2.ReadError("the connection was closed")
        chunk = chunks.popleft()
        conn.last_arrival = conn.arrivals.popleft()
        cut = max_bytes
        if self.headers_only:
            end = chunk.find(b"\r\n\r\n", 0, max_bytes)
            if end >= 0:
                cut = end + 4
        if len(chunk) > cut:
            chunks.appendleft(chunk[cut:])
            conn.arrivals.appendleft(conn.last_arrival)
            chunk = chunk[:cut]
        conn.buffered -= len(chunk)
        if not conn.reading and conn.buffered <= READ_HIGH_WATER // 2:
            conn.start_reading()
        return chunk

    async def divert(self, sink: Callable[[bytes, float], bool]) -> bool:
        """Hand every read to `sink(data, arrival)` as it comes, from the event loop's callback
        (what is queued already first, from here), until the sink returns True: then True.
        An exception from the sink is raised here. False if the stream ends or fails first
        (a read then says how). Saves a task wake-up, a future and the read's coroutine layers
        on every read of a streamed body; the arrival of each read is the same."""
        conn = self._conn
        while conn.chunks:
            data = await self.read(READ_SIZE)
            if sink(data, conn.last_arrival):
                return True
        if conn.eof or conn.lost or conn.closed:
            return False
        conn.sink, conn.sink_done, conn.sink_error = sink, False, None
        try:
            while not (conn.sink_done or conn.eof or conn.lost or conn.closed):
                waiter = conn.waiter = conn.loop.create_future()
                try:
                    await waiter
                finally:
                    conn.waiter = None
        finally:
            conn.sink = None
        failure, conn.sink_error = conn.sink_error, None
        if failure is not None:
            raise failure
        return conn.sink_done

    def arrived_at(self) -> float:
        """When the chunk read last arrived (perf_counter seconds)."""
        return self._conn.last_arrival

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        conn = self._conn
        if conn.closed or conn.lost:
            failure = conn.exception
            raise httpcore2.WriteError(failure or "the connection is closed") from failure
        if conn.tls is not None:
            try:
                conn.tls.write(buffer)
            except ssl.SSLError as exc:
                raise httpcore2.WriteError(exc) from exc
            buffer = conn.tls_out.read()
        if conn.send(buffer):
            write_done.set(conn.drained_at)
            return
        waiter = conn.write_waiter = conn.loop.create_future()
        try:
            if timeout is None:
                await waiter
            else:
                async with asyncio.timeout(timeout):
                    await waiter
        except TimeoutError as exc:
            raise httpcore2.WriteTimeout(exc) from exc
        finally:
            conn.write_waiter = None
        if conn.lost or conn.closed:
            failure = conn.exception
            raise httpcore2.WriteError(failure or "the connection was closed") from failure
        write_done.set(conn.drained_at)

    async def aclose(self) -> None:
        self._conn.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        conn = self._conn
        if conn.tls is not None or conn.lost or conn.eof or conn.closed:
            raise httpcore2.ConnectError("TLS cannot start on this connection")
        conn.tls = ssl_context.wrap_bio(
            conn.tls_in, conn.tls_out, server_side=False, server_hostname=server_hostname
        )
        handshake = conn.handshake = conn.loop.create_future()
        try:
            conn.tls_pump(time.perf_counter())  # sends the ClientHello
            async with asyncio.timeout(timeout):
                await handshake
        except TimeoutError as exc:
            conn.close()
            raise httpcore2.ConnectTimeout(exc) from exc
        except (ssl.SSLError, OSError) as exc:
            conn.close()
            raise httpcore2.ConnectError(exc) from exc
        except BaseException:
            conn.close()
            raise
        return self

    def get_extra_info(self, info: str) -> Any:
        conn = self._conn
        if info == "ssl_object":
            return conn.tls
        if info == "socket":
            return conn.sock
        if conn.closed:
            return True if info == "is_readable" else None
        if info == "client_addr":
            return conn.sock.getsockname()
        if info == "server_addr":
            return conn.sock.getpeername()
        if info == "is_readable":
            # Data or an end already taken off the socket counts as readable: a pooled
            # connection with either is not clean for a new request.
            if conn.chunks or conn.eof or conn.lost:
                return True
            return _socket_readable(conn.sock)
        return None


async def _connect(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    address: Any,
    timeout: float | None,
    socket_options: Iterable[Any] | None,
    family: int,
) -> AsyncioStream:
    """Connect a fresh socket of `family`, mapping failures to httpcore2's exceptions; closed on
    failure."""
    try:
        sock.setblocking(False)
        async with asyncio.timeout(timeout):
            await loop.sock_connect(sock, address)
        for option in socket_options or ():
            sock.setsockopt(*option)
    except TimeoutError as exc:
        sock.close()
        raise httpcore2.ConnectTimeout(exc) from exc
    except OSError as exc:
        sock.close()
        raise httpcore2.ConnectError(exc) from exc
    except BaseException:
        sock.close()
        raise
    return AsyncioStream(_Connection(loop, sock, family))


@functools.lru_cache(maxsize=1024)
def ip_family(host: str) -> int | None:
    """AF_INET or AF_INET6 for a host written as an address, None for a name. Cached: every new
    connection asks, and ipaddress parses in Python (with transport's check of the same host,
    ~1% of the engine's CPU at 200 new connections)."""
    try:
        version = ipaddress.ip_address(host).version
    except ValueError:
        return None
    return socket.AF_INET6 if version == 6 else socket.AF_INET


class AsyncioBackend(httpcore2.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        literal = ip_family(host)
        address: Any
        if literal is not None:
            family, address = literal, (host, port)
        else:  # a name: TimedBackend passes addresses, this is for other callers
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            family, address = infos[0][0], infos[0][4]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as anyio and asyncio
            if local_address:
                sock.bind((local_address, 0))
        except BaseException:
            sock.close()
            raise
        return await _connect(loop, sock, address, timeout, socket_options, family)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        return await _connect(loop, sock, path, timeout, socket_options, socket.AF_UNIX)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
