"""Reading an import source from a URL an admin typed: checked like a provider URL.

The host is resolved once, every address it resolves to must be public (unless
PROVIDER_ALLOW_PRIVATE_NETWORKS), and the connection goes to the address that was checked, so
a name that resolves differently a moment later (DNS rebinding) cannot reach an internal
service. Redirects are followed a few times, each target checked the same way; the body is
read up to a bound."""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from urllib.parse import urljoin, urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError

from monitor.imports.base import MAX_IMPORT_BYTES, ImportFileError
from monitor.models import check_provider_url

TIMEOUT_S = 20.0
MAX_REDIRECTS = 3
USER_AGENT = "routewatch-import/1"


def is_url(source: str) -> bool:
    return source.startswith(("https://", "http://"))


def _checked_address(host: str, port: int, allow_private: bool, source: str) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise ImportFileError(f"the host {host!r} does not resolve", source=source) from None
    addresses = [str(info[4][0]) for info in infos]
    if not allow_private:
        for address in addresses:
            if not ipaddress.ip_address(address).is_global:
                raise ImportFileError(
                    f"{host} resolves to a non-public address ({address}); "
                    "set PROVIDER_ALLOW_PRIVATE_NETWORKS=true to allow it",
                    source=source,
                )
    return addresses[0]


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to an address already checked; the Host header keeps the name."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """As above, over TLS verified against the host name (SNI and certificate)."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)


def fetch(url: str, *, limit: int = MAX_IMPORT_BYTES) -> bytes:
    """The body of a 200 response from `url`, refused when larger than `limit` bytes."""
    allow_private: bool = settings.PROVIDER_ALLOW_PRIVATE_NETWORKS
    for _ in range(MAX_REDIRECTS + 1):
        try:
            check_provider_url(url, allow_private=True)  # shape only; addresses below
        except ValidationError as exc:
            raise ImportFileError(" ".join(exc.messages), source=url) from None
        parts = urlsplit(url)
        if parts.scheme == "http" and not allow_private:
            raise ImportFileError(
                "plain http:// is allowed only for private test networks", source=url
            )
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = _checked_address(host, port, allow_private, url)
        connection_class = (
            _PinnedHTTPSConnection if parts.scheme == "https" else _PinnedHTTPConnection
        )
        connection = connection_class(host, port, address, TIMEOUT_S)
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
        except (OSError, http.client.HTTPException) as exc:
            raise ImportFileError(f"cannot fetch it: {exc}", source=url) from None
        finally:
            connection.close()
    raise ImportFileError(f"more than {MAX_REDIRECTS} redirects", source=url)
