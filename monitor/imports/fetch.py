"""Reading an import source from a URL an admin typed: checked like a provider URL.

The host is resolved once, every address it resolves to must be public by the probe engine's
own policy (probes.transport.address_allowed: an IPv6 form that embeds a private or loopback
IPv4 address, NAT64, 6to4, mapped or compatible, is not public) unless
PROVIDER_ALLOW_PRIVATE_NETWORKS, and the connection goes to the address that was checked, so
a name that resolves differently a moment later (DNS rebinding) cannot reach an internal
service. Redirects are followed a few times, each target checked the same way; the body is
read up to a bound, and the whole fetch (connecting and every read, across redirects) within
one deadline. Every way it fails is an ImportFileError saying why, never an exception of the
HTTP client's: the admin sees the refusal on the form."""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from typing import TYPE_CHECKING, cast
from urllib.parse import SplitResult, urljoin, urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError

from monitor.imports.base import MAX_IMPORT_BYTES, ImportFileError
from monitor.models import check_provider_url
from probes.transport import address_allowed

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

# The whole fetch: LiteLLM's price file (about 1.6 MB) takes a second or two.
DEADLINE_S = 30.0
MAX_REDIRECTS = 3
USER_AGENT = "routewatch-import/1"


def is_url(source: str) -> bool:
    return source.startswith(("https://", "http://"))


def _left(deadline: float) -> float:
    """Seconds left before `deadline` (time.monotonic); TimeoutError when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return left


class _DeadlineSocket(socket.socket):
    """Each read waits no longer than what is left of the fetch's deadline: a timeout per
    read alone starts again with every byte, so a server trickling bytes would hold the fetch
    as long as it liked."""

    deadline: float

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(_left(self.deadline))
        return super().recv_into(buffer, nbytes, flags)


class _DeadlineSSLSocket(ssl.SSLSocket):
    """As above, over TLS (the context makes its sockets of this class)."""

    deadline: float

    def recv_into(self, buffer: WriteableBuffer, nbytes: int | None = None, flags: int = 0) -> int:
        self.settimeout(_left(self.deadline))
        return super().recv_into(buffer, nbytes, flags)


def _connect(address: str, port: int, deadline: float) -> _DeadlineSocket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = _DeadlineSocket(family, socket.SOCK_STREAM)
    sock.deadline = deadline
    try:
        sock.settimeout(_left(deadline))
        sock.connect((address, port))
    except BaseException:
        sock.close()
        raise
    return sock


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to an address already checked; the Host header keeps the name."""

    def __init__(self, host: str, port: int, address: str, deadline: float) -> None:
        super().__init__(host, port)  # (its timeout is not used: connect() is ours)
        self._address = address
        self._deadline = deadline

    def connect(self) -> None:
        self.sock = _connect(self._address, self.port, self._deadline)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """As above, over TLS verified against the host name (SNI and certificate)."""

    def __init__(self, host: str, port: int, address: str, deadline: float) -> None:
        self._tls = ssl.create_default_context()
        self._tls.sslsocket_class = _DeadlineSSLSocket
        super().__init__(host, port, context=self._tls)
        self._address = address
        self._deadline = deadline

    def connect(self) -> None:
        raw = _connect(self._address, self.port, self._deadline)
        raw.settimeout(_left(self._deadline))  # the handshake's own bound
        sock = cast(_DeadlineSSLSocket, self._tls.wrap_socket(raw, server_hostname=self.host))
        sock.deadline = self._deadline
        self.sock = sock


def _checked(url: str, allow_private: bool) -> tuple[SplitResult, int]:
    """The URL's parts and port, refused unless well formed (and https, unless private
    networks are allowed)."""
    try:
        check_provider_url(url, allow_private=True)  # shape only; addresses below
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValidationError as exc:
        raise ImportFileError(" ".join(exc.messages), source=url) from None
    except ValueError as exc:  # a port out of range or not a number, a broken [IPv6] host
        raise ImportFileError(f"not a valid URL: {exc}", source=url) from None
    if parts.scheme == "http" and not allow_private:
        raise ImportFileError("plain http:// is allowed only for private test networks", source=url)
    return parts, port


def _checked_address(host: str, port: int, allow_private: bool, source: str) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError):  # ValueError: a name IDNA cannot encode
        raise ImportFileError(f"the host {host!r} does not resolve", source=source) from None
    addresses = [str(info[4][0]) for info in infos]
    if not addresses:
        raise ImportFileError(f"the host {host!r} does not resolve", source=source)
    if not allow_private:
        for address in addresses:
            if not address_allowed(address):
                raise ImportFileError(
                    f"{host} resolves to a non-public address ({address}); "
                    "set PROVIDER_ALLOW_PRIVATE_NETWORKS=true to allow it",
                    source=source,
                )
    return addresses[0]


def fetch(url: str, *, limit: int = MAX_IMPORT_BYTES, deadline_s: float = DEADLINE_S) -> bytes:
    """The body of a 200 response from `url`, refused when larger than `limit` bytes or not
    all there within `deadline_s` seconds (name resolution aside)."""
    allow_private: bool = settings.PROVIDER_ALLOW_PRIVATE_NETWORKS
    deadline = time.monotonic() + deadline_s
    for _ in range(MAX_REDIRECTS + 1):
        parts, port = _checked(url, allow_private)
        host = parts.hostname or ""
        address = _checked_address(host, port, allow_private, url)
        connection_class = (
            _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
        )
        connection = connection_class(host, port, address, deadline)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            connection.request(
                "GET", target, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
            )
            response = connection.getresponse()
            if response.status in (301, 302, 303, 307, 308):
                location = response.getheader("Location")
                if not location:
                    raise ImportFileError(f"HTTP {response.status} without a Location", source=url)
                url = urljoin(url, location)
                continue
            if response.status != 200:
                raise ImportFileError(f"HTTP {response.status} {response.reason}", source=url)
            declared = response.getheader("Content-Length")
            if declared and declared.isdigit() and int(declared) > limit:
                raise ImportFileError(f"larger than {limit} bytes; refused", source=url)
            body = response.read(limit + 1)
            if len(body) > limit:
                raise ImportFileError(f"larger than {limit} bytes; refused", source=url)
            return body
        except TimeoutError:
            raise ImportFileError(
                f"not fetched within {deadline_s:g} s; refused", source=url
            ) from None
        # ValueError: what http.client raises of a Location or header it cannot use
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise ImportFileError(f"cannot fetch it: {exc}", source=url) from None
        finally:
            connection.close()
    raise ImportFileError(f"more than {MAX_REDIRECTS} redirects", source=url)


def post(url: str, body: bytes, headers: dict[str, str], *, deadline_s: float = 10.0) -> int:
    """POST `body` to `url` under the same address policy as `fetch` (checked when resolved,
    connected to the checked address), following no redirect: the response's status. Used by
    the alerts' webhook channel. Every failure is an ImportFileError whose `message` names no
    part of the URL but its host (a webhook URL can carry a token)."""
    allow_private: bool = settings.PROVIDER_ALLOW_PRIVATE_NETWORKS
    deadline = time.monotonic() + deadline_s
    parts, port = _checked(url, allow_private)
    host = parts.hostname or ""
    address = _checked_address(host, port, allow_private, host)
    connection_class = _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
    connection = connection_class(host, port, address, deadline)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request("POST", target, body=body, headers={"User-Agent": USER_AGENT, **headers})
        response = connection.getresponse()
        response.read(MAX_IMPORT_BYTES)
        return int(response.status)
    except TimeoutError:
        raise ImportFileError(f"no answer within {deadline_s:g} s", source=host) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise ImportFileError(
            f"cannot post to {host}: {exc.__class__.__name__}", source=host
        ) from None
    finally:
        connection.close()
