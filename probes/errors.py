"""One failure taxonomy: what went wrong in a probe, and which party it blames.

A failed probe has exactly one `Kind`, stored as its string value (`error_kind`). Each kind
has a one-line meaning (what the user should conclude) and a `Blame`:

    provider  the provider's service failed or broke its own wire format
    network   the path to the provider failed: name resolution, TCP connect, TLS
    config    our configuration is wrong (route settings, URL, eval case)
    engine    the probe engine itself failed (a bug in probes/)
    monitor   the monitor did not run the probe by its deadline

`Kind.counts_against_provider` is what availability figures use: provider and network
failures count (an application in that region would have failed the same way); ours
(config, engine, monitor) never do.

The exceptions, drawn the way httpx draws its own. Each carries its kind (`.kind`) and a
sentence for the user (`.detail`, redacted before it is stored):

    ProbeError
    ├── NetworkFailure ........................ blame: network
    │   ├── ResolutionError                     dns (raised by the network backend)
    │   ├── ConnectFailure                      connect
    │   └── TLSFailure                          tls
    ├── ProviderFailure ....................... blame: provider
    │   ├── ProbeTimeout                        timeout_headers | timeout_first_token | timeout_total
    │   ├── HTTPStatusFailure                   http_4xx | http_429 | http_5xx
    │   ├── StreamErrorEvent                    stream_error
    │   ├── MalformedStream                     malformed_stream (raised by the wire formats)
    │   │   └── NotAnEventStream                  a 200 that is not SSE (an HTML page, JSON...)
    │   ├── ResponseTooLarge                    too_large
    │   │   └── LineTooLong                       (raised by the SSE parser)
    │   └── Truncated                           truncated
    ├── ConfigError ........................... blame: config
    │   ├── BlockedAddress                      blocked_url (raised by the network backend)
    │   ├── UnknownWireFormat                   config
    │   ├── InvalidSpec                         config (settings the format cannot send)
    │   ├── RefusedParameter                    config (a 400 naming a parameter we sent)
    │   └── GraderError (also a ValueError)     config (an unusable eval case; raised by
    │                                             probes.graders after the probe, not in it)
    └── EngineError ........................... blame: engine
        └── TokenizerError                      engine (the shipped o200k file is unusable)

Outside the tree on purpose: asyncio.CancelledError (a race cancelling a probe is not a
failure), and the TimeoutError of the engine's own deadline, which becomes a ProbeTimeout.
"missed" has a kind but no exception: the monitor records it when no result came back.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from enum import StrEnum

import httpcore2
import httpx2


class Blame(StrEnum):
    PROVIDER = "provider"
    NETWORK = "network"
    CONFIG = "config"
    ENGINE = "engine"
    MONITOR = "monitor"


class Kind(StrEnum):
    DNS = "dns"
    CONNECT = "connect"
    TLS = "tls"
    TIMEOUT_HEADERS = "timeout_headers"
    TIMEOUT_FIRST_TOKEN = "timeout_first_token"  # noqa: S105 (a kind, not a password)
    TIMEOUT_TOTAL = "timeout_total"
    HTTP_4XX = "http_4xx"
    HTTP_429 = "http_429"
    HTTP_5XX = "http_5xx"
    STREAM_ERROR = "stream_error"
    MALFORMED_STREAM = "malformed_stream"
    TOO_LARGE = "too_large"
    TRUNCATED = "truncated"
    BLOCKED_URL = "blocked_url"
    CONFIG = "config"
    ENGINE = "engine"
    MISSED = "missed"

    @property
    def blame(self) -> Blame:
        return _ABOUT[self][0]

    @property
    def meaning(self) -> str:
        return _ABOUT[self][1]

    @property
    def counts_against_provider(self) -> bool:
        return self.blame in (Blame.PROVIDER, Blame.NETWORK)


_ABOUT: dict[Kind, tuple[Blame, str]] = {
    Kind.DNS: (Blame.NETWORK, "The provider's host name did not resolve from this region."),
    Kind.CONNECT: (Blame.NETWORK, "No TCP connection to the provider could be opened."),
    Kind.TLS: (
        Blame.NETWORK,
        "The TLS handshake failed (an invalid or untrusted certificate, or a broken path).",
    ),
    Kind.TIMEOUT_HEADERS: (
        Blame.PROVIDER,
        "The provider sent no response headers before the first-token deadline.",
    ),
    Kind.TIMEOUT_FIRST_TOKEN: (
        Blame.PROVIDER,
        "The provider answered but streamed no output before the first-token deadline.",
    ),
    Kind.TIMEOUT_TOTAL: (
        Blame.PROVIDER,
        "The stream started but did not finish before the total deadline.",
    ),
    Kind.HTTP_4XX: (
        Blame.PROVIDER,
        "The provider refused the request (4xx other than 429): a key, model or quota problem.",
    ),
    Kind.HTTP_429: (Blame.PROVIDER, "The provider rate-limited the request (429)."),
    Kind.HTTP_5XX: (Blame.PROVIDER, "The provider failed with a server error (5xx)."),
    Kind.STREAM_ERROR: (
        Blame.PROVIDER,
        "The provider started answering, then sent an error event in the stream.",
    ),
    Kind.MALFORMED_STREAM: (
        Blame.PROVIDER,
        "The response broke its wire format: not an event stream (e.g. an HTML gateway page), "
        "bad JSON, or invalid HTTP.",
    ),
    Kind.TOO_LARGE: (
        Blame.PROVIDER,
        "The response or one of its lines exceeded the probe's size bound.",
    ),
    Kind.TRUNCATED: (
        Blame.PROVIDER,
        "The connection closed or reset before the response was complete.",
    ),
    Kind.BLOCKED_URL: (
        Blame.CONFIG,
        "The configured URL resolves to a private or loopback address, which is not allowed.",
    ),
    Kind.CONFIG: (
        Blame.CONFIG,
        "Our request settings are wrong for this route (e.g. a parameter the model refuses); "
        "fix the route, the provider is not at fault.",
    ),
    Kind.ENGINE: (
        Blame.ENGINE,
        "The probe engine failed (a bug in Routewatch); the provider is not at fault.",
    ),
    Kind.MISSED: (
        Blame.MONITOR,
        "No result came back by the slot's deadline (a worker or the broker was down).",
    ),
}


class ProbeError(Exception):
    """A probe failure of one kind, with a sentence for the user."""

    kind: Kind = Kind.ENGINE

    def __init__(self, detail: str, kind: Kind | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if kind is not None:
            self.kind = kind


class NetworkFailure(ProbeError):
    kind = Kind.CONNECT


class ResolutionError(NetworkFailure):
    """The host name does not resolve."""

    kind = Kind.DNS


class ConnectFailure(NetworkFailure):
    kind = Kind.CONNECT


class TLSFailure(NetworkFailure):
    kind = Kind.TLS


class ProviderFailure(ProbeError):
    kind = Kind.HTTP_5XX


class ProbeTimeout(ProviderFailure):
    kind = Kind.TIMEOUT_TOTAL


class HTTPStatusFailure(ProviderFailure):
    def __init__(self, status: int, detail: str) -> None:
        kind = Kind.HTTP_429 if status == 429 else Kind.HTTP_5XX if status >= 500 else Kind.HTTP_4XX
        super().__init__(detail, kind)
        self.status = status


class StreamErrorEvent(ProviderFailure):
    kind = Kind.STREAM_ERROR


class MalformedStream(ProviderFailure):
    """An event that is not what the dialect allows (bad JSON, wrong shape), or invalid HTTP."""

    kind = Kind.MALFORMED_STREAM


class NotAnEventStream(MalformedStream):
    """A 200 whose body is not a stream of server-sent events."""


class ResponseTooLarge(ProviderFailure):
    kind = Kind.TOO_LARGE


class LineTooLong(ResponseTooLarge):
    pass


class Truncated(ProviderFailure):
    kind = Kind.TRUNCATED


class ConfigError(ProbeError):
    kind = Kind.CONFIG


class BlockedAddress(ConfigError):
    """The host resolves to an address the probe may not connect to."""

    kind = Kind.BLOCKED_URL


class UnknownWireFormat(ConfigError):
    pass


class InvalidSpec(ConfigError):
    pass


class RefusedParameter(ConfigError):
    """The provider refused a parameter we sent (400): the route's settings are wrong."""

    def __init__(self, detail: str, param: str) -> None:
        super().__init__(detail)
        self.param = param


class EngineError(ProbeError):
    kind = Kind.ENGINE


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and not any(node is s for s in seen):
        seen.append(node)
        yield node
        node = node.__cause__ or node.__context__


# What h11 and h2 say (through httpcore2) when the server closed or reset the stream, as opposed
# to sending something that is not HTTP.
_CLOSED_WORDS = ("disconnect", "closed", "StreamReset", "ConnectionTerminated", "incomplete")
_CONNECT = (
    httpx2.ConnectError,
    httpx2.ConnectTimeout,
    httpcore2.ConnectError,
    httpcore2.ConnectTimeout,
)
_OURS = (
    httpx2.UnsupportedProtocol,
    httpcore2.UnsupportedProtocol,
    httpx2.InvalidURL,
    httpx2.LocalProtocolError,
    httpcore2.LocalProtocolError,
)
_TIMEOUTS = (httpx2.TimeoutException, httpcore2.TimeoutException)
_REMOTE_PROTOCOL = (httpx2.RemoteProtocolError, httpcore2.RemoteProtocolError)
_BROKEN = (httpx2.TransportError, httpcore2.NetworkError, OSError)


def from_transport(exc: BaseException, headers_seen: bool) -> ProbeError:
    """The failure an exception from the HTTP client stands for. Only a failure to connect is
    `connect`; a connection that broke after it was made is `truncated`, whether or not the
    headers had come; what was sent but is not HTTP is `malformed_stream`; a request httpx2
    could not even build from our settings is `config`; anything else is ours (`engine`)."""
    for item in _chain(exc):
        if isinstance(item, ProbeError):
            return item
        if isinstance(item, ssl.SSLError):
            return TLSFailure(f"TLS failed: {item.reason or item}")
    name = exc.__class__.__name__
    where = "mid-stream" if headers_seen else "before the response headers"
    if isinstance(exc, _CONNECT):
        return ConnectFailure(f"connection failed: {exc or name}")
    if isinstance(exc, _OURS):
        return InvalidSpec(f"the request cannot be sent as configured: {name}: {exc}")
    if isinstance(exc, _TIMEOUTS):
        kind = Kind.TIMEOUT_TOTAL if headers_seen else Kind.TIMEOUT_HEADERS
        return ProbeTimeout(f"the client timed out {where}: {name}", kind)
    if isinstance(exc, _REMOTE_PROTOCOL):
        if any(word in str(exc) for word in _CLOSED_WORDS):
            return Truncated(f"the server closed the stream {where}: {exc}")
        return MalformedStream(f"the server's response is not valid HTTP: {exc}")
    if isinstance(exc, _BROKEN):
        return Truncated(f"the connection broke {where}: {name}: {exc}".rstrip(": "))
    return EngineError(f"{name}: {exc}")


def counts_against_provider(kind: str) -> bool:
    """Does a stored error kind count against the provider's availability? A kind this version
    does not know (a newer worker's) counts against it: better a visible error than a hidden
    one."""
    try:
        return Kind(kind).counts_against_provider
    except ValueError:
        return True
