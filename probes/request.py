"""A probe's request, straight to its client's transport: httpx2's request, not its client's layers.

httpx2's AsyncClient puts build_request, send, auth, redirect and cookie layers and a response
stream wrapper on every request (a few hundred Python calls a probe). A probe needs none of
their work but the cookies, so build_request and send give the pool of a ProbeClient
(probes/transport.py: its own HTTP/1.1 pool, probes/http1.py, on a client that speaks HTTP/1.1
only, else httpcore2's) the request httpx2's client would have sent, its head built once per URL
and header set by httpx2's own header merge and Request, and keep cookies with httpx2's own
helpers. Any other client, or a URL with a user and password (httpx2's basic auth), goes
httpx2's whole way. tests/probes/test_request_path.py holds both to httpx2's client.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpcore2
import httpx2

from probes.http1 import DirectRequest
from probes.transport import ProbeClient

__all__ = ["Outgoing", "build_request", "send"]


# The request extension httpx2's build_request gives a client without timeouts.
_NO_TIMEOUTS = httpx2.Timeout(None).as_dict()


@dataclass(frozen=True)
class _Head:
    """A POST to a URL, its request line and head as httpx2 builds them for a ProbeClient, but
    the body's length (a placeholder at `length_at`) and the client's cookies."""

    url: httpx2.URL
    core_url: httpcore2.URL
    headers: tuple[tuple[bytes, bytes], ...]
    length_at: int

    def raw(self, length: int, cookies: httpx2.Cookies) -> list[tuple[bytes, bytes]]:
        """The head for a body of `length` bytes, with a Cookie header (before the length, as
        httpx2's Request puts it) if the client's cookies have any for the URL."""
        headers = list(self.headers[: self.length_at])
        if cookies.jar:
            request = httpx2.Request("POST", self.url)
            cookies.set_cookie_header(request)  # httpx2's own: urllib's rules for the URL
            headers += [item for item in request.headers.raw if item[0].lower() == b"cookie"]
        headers.append((b"Content-Length", b"%d" % length))
        headers += self.headers[self.length_at + 1 :]
        return headers


@functools.lru_cache(maxsize=1024)
def _head(
    url: str, headers: tuple[tuple[str, str], ...], defaults: tuple[tuple[bytes, bytes], ...]
) -> _Head:
    # Keyed by the URL's text: httpx2 parses a str on every request, and compares a URL by
    # parsing the other side (a few percent of the engine's CPU at 200 streams). An invalid
    # URL raises httpx2.InvalidURL here, and is not cached. httpx2's own merge of the client's
    # headers with the request's (BaseClient._merge_headers) and its own Request: the same
    # names, values and order as client.build_request.
    parsed = httpx2.URL(url)
    merged = httpx2.Headers(list(defaults))
    merged.update(dict(headers))
    raw = httpx2.Request("POST", parsed, headers=merged, content=b"-").headers.raw
    length_at = next(i for i, (name, _) in enumerate(raw) if name.lower() == b"content-length")
    core_url = httpcore2.URL(
        scheme=parsed.raw_scheme, host=parsed.raw_host, port=parsed.port, target=parsed.raw_path
    )
    return _Head(parsed, core_url, tuple(raw), length_at)


@dataclass
class Outgoing:
    """A request ready to go (build_request), sent by send(): for a ProbeClient, a request to
    its own HTTP/1.1 pool (`direct`) or httpcore2's request to its transport (`core`); for any
    other client, or a URL with a user and password (httpx2's basic auth), httpx2's request to
    its client."""

    url: httpx2.URL
    headers: list[tuple[bytes, bytes]]
    core: httpcore2.Request | None = None
    request: httpx2.Request | None = None
    direct: DirectRequest | None = None


def build_request(
    client: httpx2.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: bytes,
    trace: Callable[[str, dict[str, Any]], Awaitable[None]],
) -> Outgoing:
    """A streamed POST as `client.build_request("POST", url, headers=headers, content=body,
    extensions={"trace": trace})` builds it: the same request line and head, the client's
    cookies included; for a ProbeClient, without httpx2's Request and its layers, the head
    built once per URL and header set. Work to do before t0."""
    head = _head(url, tuple(headers.items()), tuple(client.headers.raw))
    if not isinstance(client, ProbeClient) or head.url.userinfo:
        request = client.build_request(
            "POST", head.url, headers=headers, content=body, extensions={"trace": trace}
        )
        return Outgoing(head.url, request.headers.raw, request=request)
    raw = head.raw(len(body), client.cookies)
    if client.probe_transport.direct is not None:
        return Outgoing(
            head.url, raw, direct=DirectRequest(b"POST", head.core_url, raw, body, trace)
        )
    core = httpcore2.Request(
        method=b"POST",
        url=head.core_url,
        headers=raw,
        content=body,
        extensions={"trace": trace, "timeout": _NO_TIMEOUTS},
    )
    return Outgoing(head.url, raw, core=core)


async def send(client: httpx2.AsyncClient, outgoing: Outgoing) -> httpx2.Response:
    """The response to a build_request's request, its body streamed, as `client.send(request,
    stream=True)` gives it: a redirect answered, not followed; the response's Set-Cookie kept
    in the client's cookies (httpx2's own extract). For a ProbeClient, straight to its
    transport: none of httpx2's send, auth and redirect layers, nor its stream wrapper."""
    if outgoing.request is not None:
        return await client.send(outgoing.request, stream=True)
    assert isinstance(client, ProbeClient)
    transport = client.probe_transport
    if outgoing.direct is not None and transport.direct is not None:
        response = await transport.direct.send(outgoing.direct)
    else:
        assert outgoing.core is not None
        response = await transport.send_core(outgoing.core)
    if "set-cookie" in response.headers or "set-cookie2" in response.headers:
        response.request = httpx2.Request("POST", outgoing.url, headers=outgoing.headers)
        client.cookies.extract_cookies(response)
    return response
