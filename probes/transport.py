"""HTTP clients for probes: warm pooled clients, cold one-shot clients, and per-phase timing.

The HTTP stack is httpx2 over httpcore2 (the maintained continuation of httpx / httpcore, which
the official SDKs use too). httpcore2's trace extension reports TCP connect, TLS and
header/body events but has no DNS event, so clients use a network backend of ours: it resolves
the name itself (timed), checks the address against the probe's policy (no private or loopback
addresses unless allowed: the connect-time check of admin-configured URLs), and connects to
that address over asyncio streams of ours (probes/netstream.py: far cheaper per chunk than
httpcore2's anyio backend). The timing of the probe in progress is found through a context
variable, since httpcore2 opens connections in the task that sends the request.

The backend reaches httpcore2's connection pool through its public `network_backend=`
argument; httpx2's own AsyncHTTPTransport takes no backend, so ProbeTransport is an httpx2
transport (its public transport API) over that pool. A client that speaks HTTP/1.1 only (every
probe's but those of a task that asks for HTTP/2) sends its probes' requests through a
DirectPool of its own instead (probes/http1.py: h11 over the same streams, with the same
backend, without httpcore2's pool and connection layers); httpx2's own requests on it still go
through httpcore2's pool.

A chunked HTTP/1.1 response body (every SSE stream over HTTP/1.1) is decoded a read at a time
by probes/http1.py's readers rather than by h11 an event per chunk: httpcore2's HTTP/1.1
connections here are _HTTP11, the one place that reaches inside httpcore2 (see there).
body_chunks and body_pump hand a body to the engine whichever path it came by.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import socket
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, cast

import h11
import httpcore2
import httpx2

from probes.errors import BlockedAddress, ResolutionError
from probes.http1 import (
    CHUNKED_BODY,
    CHUNKED_PUMP,
    CORE_BODY,
    Consume,
    CoreBody,
    CoreBodyStream,
    DirectPool,
    as_httpx2,
    pump_chunked,
    read_chunked,
)
from probes.netstream import AsyncioBackend, AsyncioStream, write_done

__all__ = [
    "BlockedAddress",
    "ClientPool",
    "Phases",
    "ProbeClient",
    "ResolutionError",
    "make_client",
]


@dataclass
class Phases:
    """Per-probe timestamps (perf_counter seconds) collected by the backend and the trace."""

    dns_start: float | None = None
    dns_end: float | None = None
    connect_start: float | None = None
    connect_end: float | None = None
    tls_start: float | None = None
    tls_end: float | None = None
    body_sent: float | None = None
    started: float = 0.0  # t0
    allow_private: bool = True
    connect_to: str | None = None
    # The request goes out as plain http:// (refused at connect unless allow_private).
    plain_http: bool = False
    events: list[str] = field(default_factory=list)
    # Whether this probe opened a connection (our backend was asked for one), and whether its
    # request got as far as being sent: together, whether a pooled connection was reused.
    opened_connection: bool = False
    request_started: bool = False

    @property
    def connection_reused(self) -> bool | None:
        if self.opened_connection:
            return False
        return True if self.request_started else None

    async def trace(self, name: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if name.endswith("send_request_headers.started"):
            self.request_started = True
        elif name == "connection.connect_tcp.started":
            self.connect_start = self.connect_start or now
        elif name == "connection.connect_tcp.complete":
            self.connect_end = now
        elif name == "connection.start_tls.started":
            self.tls_start = now
        elif name == "connection.start_tls.complete":
            self.tls_end = now
        elif name.endswith("send_request_body.complete"):
            # When the kernel took the body's last byte, not when httpcore2 got round to saying so.
            done = write_done.get()
            self.body_sent = done if self.started <= done <= now else now


current: ContextVar[Phases | None] = ContextVar("probe_phases", default=None)


# IPv6 ranges that carry an IPv4 address in their low 32 bits: NAT64's well-known prefix
# (RFC 6052) and its local-use one (RFC 8215), and IPv4-compatible addresses (deprecated).
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address leads to, if it embeds one (mapped, NAT64, 6to4,
    IPv4-compatible, Teredo client)."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in net for net in _NAT64) or address in _IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_allowed(address: str) -> bool:
    """A public address, including what an IPv6 address embeds: ::ffff:10.0.0.1 or
    64:ff9b::7f00:1 reach a private or loopback IPv4 host through a translator."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = embedded_ipv4(ip)
        if embedded is not None:
            return embedded.is_global
    return ip.is_global


@functools.lru_cache(maxsize=1024)
def _ip_literal(host: str) -> str | None:
    """An address written as one needs no resolution (dns_ms ~0): asyncio would still send it
    through its thread pool, which at 200 new connections cost ~5% of the engine's CPU. Cached,
    as netstream.ip_family: ipaddress parses in Python, for every new connection."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


class TimedBackend(httpcore2.AsyncNetworkBackend):
    """Resolves names itself (DNS timed apart from TCP) and enforces the address policy."""

    def __init__(self) -> None:
        self._inner = AsyncioBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        phases = current.get()
        if phases is not None:
            phases.opened_connection = True
        if phases is not None and phases.connect_to:
            target_host, _, target_port = phases.connect_to.rpartition(":")
            host, port = target_host, int(target_port)
        started = time.perf_counter()
        address = _ip_literal(host)
        if address is None:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
            except socket.gaierror as exc:
                raise ResolutionError(f"cannot resolve {host}: {exc.strerror}") from None
            address = str(infos[0][4][0])
        resolved = time.perf_counter()
        if phases is not None:
            phases.dns_start, phases.dns_end = started, resolved
            phases.connect_start = resolved
            if not phases.allow_private and not address_allowed(address):
                raise BlockedAddress(f"{host} resolves to a non-public address ({address})")
            if not phases.allow_private and phases.plain_http:
                raise BlockedAddress(f"plain http:// to {host} refused (https only)")
        return await self._inner.connect_tcp(
            address,
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        return await self._inner.connect_unix_socket(
            path, timeout=timeout, socket_options=socket_options
        )

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def arrival_clock(response: httpx2.Response) -> Callable[[], float]:
    """A clock for a streaming response: when the bytes read last for it arrived.

    HTTP/1.1: the arrival of the read that completed what httpx2 just returned, the headers or
    a body chunk (h11 reads only when it cannot make an event from what it holds). HTTP/2: the
    arrival of the latest read on the connection, which another stream's task may have made
    after this stream's data came in, so never earlier than the truth. A stream not ours: the
    time now."""
    stream = response.extensions.get("network_stream")
    return stream.arrived_at if isinstance(stream, AsyncioStream) else time.perf_counter


# httpcore2's own exceptions, which come through unmapped when the body is read below httpx2.
HTTPCORE_ERRORS = (
    httpcore2.NetworkError,
    httpcore2.TimeoutException,
    httpcore2.ProtocolError,
    httpcore2.ProxyError,
    httpcore2.UnsupportedProtocol,
)


class ProbeTransport(httpx2.AsyncBaseTransport):
    """An httpx2 transport over an httpcore2 pool of ours (built with our network backend).

    It does what httpx2's AsyncHTTPTransport does for a pool without a proxy, and one thing
    more: the response carries httpcore2's body stream in its extensions (CORE_BODY), since
    httpx2's client wraps the response stream in a layer of its own on the way out."""

    def __init__(
        self, pool: httpcore2.AsyncConnectionPool, direct: DirectPool | None = None
    ) -> None:
        self.pool = pool
        # A client that speaks HTTP/1.1 only sends its probes' requests through this instead
        # (probes.request.send); httpx2's own requests still go through the pool.
        self.direct = direct

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        core_request = httpcore2.Request(
            method=request.method,
            url=httpcore2.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        return await self.send_core(core_request)

    async def send_core(self, core_request: httpcore2.Request) -> httpx2.Response:
        """An httpcore2 request through the pool, answered as an httpx2 response."""
        try:
            core = await self.pool.handle_async_request(core_request)
        except Exception as exc:
            raise as_httpx2(exc) from exc
        # An async pool's response body is async, with aclose (httpcore2's PoolByteStream).
        body = cast(CoreBody, core.stream)
        extensions = dict(core.extensions)
        extensions[CORE_BODY] = body
        return httpx2.Response(
            status_code=core.status,
            headers=core.headers,
            stream=CoreBodyStream(body),
            extensions=extensions,
        )

    async def aclose(self) -> None:
        if self.direct is not None:
            await self.direct.aclose()
        await self.pool.aclose()


class _HTTP11(httpcore2.AsyncHTTP11Connection):
    """httpcore2's HTTP/1.1 connection, reading a chunked response body with ChunkedBody.

    This overrides three private methods of httpcore2 2.16 (pinned below 2.17 in
    pyproject.toml): _receive_response_body, _receive_response_headers (only to have the head's
    reads end with the head) and _send_event (only to send the request's head with its body, in
    one write), and uses the connection's h11 state and network stream from inside: no public
    hook lets a body be read without an h11 event per chunk. A body that is not chunked
    is read by httpcore2 as before. tests/probes/test_chunked_body.py holds ChunkedBody to h11,
    and this class to keep-alive however the reads fall."""

    _chunked = False
    _held = b""  # the request's head, sent with the body's first bytes

    async def _send_event(self, event: h11.Event, timeout: float | None = None) -> None:
        # The head and the body in one write: httpcore2 writes each h11 event on its own, a
        # send() and a loopback or network packet more a probe (the head's). The head is sent
        # with the first body data, or at the end of the message if the body is empty.
        data = self._h11_state.send(event)
        if type(event) is h11.Request:
            self._held = data or b""
            return
        if self._held:
            data, self._held = self._held + (data or b""), b""
        if data:
            await self._network_stream.write(data, timeout=timeout)

    async def _receive_response_headers(
        self, request: httpcore2.Request
    ) -> tuple[bytes, int, bytes, list[tuple[bytes, bytes]], bytes]:
        # Reads end with the head (AsyncioStream.headers_only), so the body's first events,
        # which often come in the same read at 200 streams, are read by ChunkedBody, not by h11
        # an event per chunk (with the same arrival: the read's). A head whose blank line is
        # split between reads, or ends in bare LFs, leaves body bytes with h11 as before.
        stream = self._network_stream
        if not isinstance(stream, AsyncioStream):
            return await super()._receive_response_headers(request)
        stream.headers_only = True
        try:
            return await super()._receive_response_headers(request)
        finally:
            stream.headers_only = False

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        response = await super().handle_async_request(request)
        # h11's framing rules: these responses have no body whatever the headers say, and h11
        # has refused any Transfer-Encoding but chunked already.
        self._chunked = (
            response.status >= 200
            and response.status not in (204, 304)
            and request.method not in (b"HEAD", b"CONNECT")
            and any(name.lower() == b"transfer-encoding" for name, _ in response.headers)
        )
        if self._chunked:
            # Read directly by body_chunks: httpcore2's response stream would put two generator
            # layers of its own on every chunk. Closing the response still goes through it.
            response.extensions[CHUNKED_BODY] = self._receive_response_body(request)
            timeout = request.extensions.get("timeout", {}).get("read", None)
            if timeout is None and isinstance(self._network_stream, AsyncioStream):
                response.extensions[CHUNKED_PUMP] = functools.partial(self._pump_body, request)
        return response

    async def _pump_body(self, request: httpcore2.Request, consume: Consume) -> None:
        """pump_chunked for this connection: instead of _receive_response_body, not with it."""
        self._chunked = False
        stream = self._network_stream
        assert isinstance(stream, AsyncioStream)
        rest = functools.partial(super()._receive_response_body, request)
        await pump_chunked(self._h11_state, stream, consume, rest)

    async def _receive_response_body(self, request: httpcore2.Request) -> AsyncGenerator[bytes]:
        chunked, self._chunked = self._chunked, False
        timeout = request.extensions.get("timeout", {}).get("read", None)
        rest = functools.partial(super()._receive_response_body, request)
        stream = self._network_stream
        if not chunked:
            async for chunk in rest():
                yield chunk
            return
        async for chunk in read_chunked(self._h11_state, stream, timeout, rest):
            yield chunk


class _Connection(httpcore2.AsyncHTTPConnection):
    """httpcore2's connection, with _HTTP11 for HTTP/1.1: its handle_async_request (2.16) with
    that one class changed."""

    async def handle_async_request(self, request: httpcore2.Request) -> httpcore2.Response:
        if not self.can_handle_request(request.url.origin):
            raise RuntimeError(
                f"Attempted to send request to {request.url.origin} on connection to {self._origin}"
            )
        try:
            async with self._request_lock:
                if self._connection is None:
                    stream = await self._connect(request)
                    ssl_object = stream.get_extra_info("ssl_object")
                    h2 = ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2"
                    if h2 or (self._http2 and not self._http1):
                        self._connection = httpcore2.AsyncHTTP2Connection(
                            origin=self._origin,
                            stream=stream,
                            keepalive_expiry=self._keepalive_expiry,
                        )
                    else:
                        self._connection = _HTTP11(
                            origin=self._origin,
                            stream=stream,
                            keepalive_expiry=self._keepalive_expiry,
                        )
        except BaseException:
            self._connect_failed = True
            raise
        return await self._connection.handle_async_request(request)


class _Pool(httpcore2.AsyncConnectionPool):
    """httpcore2's pool (no proxy), its connections _Connection."""

    async def _close_connections(self, closing: list[httpcore2.AsyncConnectionInterface]) -> None:
        # httpcore2 2.16 calls this at every request's start and end, nearly always with
        # nothing to close, and shields it from cancellation each time: an anyio CancelScope
        # entered and left around no await at all (~2% of the engine's CPU at 200 streams,
        # py-spy). With nothing to close there is nothing to shield; the rest is httpcore2's.
        if closing:
            await super()._close_connections(closing)

    def create_connection(self, origin: httpcore2.Origin) -> httpcore2.AsyncConnectionInterface:
        return _Connection(
            origin=origin,
            ssl_context=self._ssl_context,
            keepalive_expiry=self._keepalive_expiry,
            http1=self._http1,
            http2=self._http2,
            retries=self._retries,
            local_address=self._local_address,
            uds=self._uds,
            network_backend=self._network_backend,
            socket_options=self._socket_options,
        )


def body_chunks(response: httpx2.Response) -> AsyncIterator[bytes]:
    """The body as httpcore2 yields it. httpx2's aiter_raw puts generator layers on every chunk
    (~7% of the engine's CPU at 200 streams with httpx 0.28, py-spy) and nothing the engine
    uses: it reads raw bytes and closes the response itself. A response that did not come
    through ProbeTransport is read with aiter_raw. A chunked HTTP/1.1 body is read by _HTTP11's
    own reader, without httpcore2's layers; closing the response closes it as before.
    Exceptions: HTTPCORE_ERRORS as well as httpx2's."""
    chunked: AsyncIterator[bytes] | None = response.extensions.get(CHUNKED_BODY)
    if chunked is not None:
        return chunked
    body: CoreBody | None = response.extensions.get(CORE_BODY)
    if body is None:
        return response.aiter_raw()
    return body.__aiter__()


def body_pump(response: httpx2.Response) -> Callable[[Consume], Awaitable[None]] | None:
    """For a chunked HTTP/1.1 body on our stream: an awaitable `pump(consume)` that hands
    `consume(data, arrival)` the body a read at a time as body_chunks would yield it (an
    exception from consume ends the pump with it), calling it from the event loop's callback
    for each read rather than waking the reading task. None for any other body."""
    pump: Callable[[Consume], Awaitable[None]] | None = response.extensions.get(CHUNKED_PUMP)
    return pump


@functools.cache
def ssl_context(verify: bool | str) -> ssl.SSLContext:
    """One SSL context per verification setting: loading CA certificates takes ~30 ms, far
    too long to do per client while other probes stream on the same event loop. verify=True
    is httpx2's default: the system's CA store (SSL_CERT_FILE / SSL_CERT_DIR if set)."""
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return httpx2.create_ssl_context(verify=verify)


def make_client(
    http2: bool, verify: bool | str, max_connections: int = 1000, *, cleartext: bool = False
) -> httpx2.AsyncClient:
    """A client whose connections go through TimedBackend. Creating one costs tens of ms:
    never inside a timed path. HTTP/2 over cleartext (h2c) uses prior knowledge."""
    pool = _Pool(
        ssl_context=ssl_context(verify),
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=300.0,
        http1=not (http2 and cleartext),
        http2=http2,
        network_backend=TimedBackend(),
    )
    direct = None
    if not http2:
        direct = DirectPool(
            TimedBackend(), ssl_context(verify), keepalive_expiry=300.0, max_idle=max_connections
        )
    return ProbeClient(ProbeTransport(pool, direct))


class ProbeClient(httpx2.AsyncClient):
    """make_client's client: httpx2's, no timeouts (the engine bounds every phase itself with
    one deadline), no redirects followed, its headers httpx2's defaults, and its transport at
    hand for send()."""

    def __init__(self, transport: ProbeTransport) -> None:
        super().__init__(transport=transport, timeout=None, follow_redirects=False)
        self.probe_transport = transport


class ClientPool:
    """Long-lived clients per (origin, HTTP version, verification) per process.

    A key starts with one client; when its in-flight requests reach `per_client`, the next
    request goes to another client (a shard). httpcore2's pool walks all of its connections on
    every request start and end, which at 200 concurrent streams in one pool cost most of a
    core (bench/bench_probes.py); several small pools cost a fraction. Requests go to the
    first shard with room, so sequential probes keep reusing the same warm connection."""

    def __init__(self, per_client: int = 16) -> None:
        self.per_client = per_client
        self._clients: dict[tuple[str, bool, str], list[httpx2.AsyncClient]] = {}
        self._in_flight: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def acquire(self, origin: str, http2: bool, verify: bool | str) -> httpx2.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # clients are bound to the loop they were made on
            self._clients.clear()
            self._in_flight.clear()
            self._loop = loop
        ring = self._clients.setdefault((origin, http2, str(verify)), [])
        for i, client in enumerate(ring):
            if client.is_closed:
                client = ring[i] = make_client(
                    http2, verify, cleartext=origin.startswith("http://")
                )
            if self._in_flight.get(id(client), 0) < self.per_client:
                break
        else:
            client = make_client(http2, verify, cleartext=origin.startswith("http://"))
            ring.append(client)
        self._in_flight[id(client)] = self._in_flight.get(id(client), 0) + 1
        return client

    def release(self, client: httpx2.AsyncClient) -> None:
        key = id(client)
        if key in self._in_flight:
            self._in_flight[key] = max(0, self._in_flight[key] - 1)

    async def aclose(self) -> None:
        for ring in list(self._clients.values()):
            for client in ring:
                await client.aclose()
        self._clients.clear()
        self._in_flight.clear()


warm_clients = ClientPool()
