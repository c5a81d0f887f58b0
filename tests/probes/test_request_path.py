"""The probe's request goes straight to its client's transport (probes.request.build_request
and send), not through httpx2's client layers: what goes out and what is kept are httpx2's."""

from __future__ import annotations

import asyncio
import base64
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from probes import ProbeSpec, probe
from probes.request import build_request
from probes.transport import make_client, warm_clients
from tests.probes.loopback import LoopbackServer, Received, Reply, sse
from tests.probes.support import run_all

STREAM = [
    (0.0, chunk)
    for chunk in sse(
        {"choices": [{"index": 0, "delta": {"content": " hello"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    )
]
EVENTS = [("content-type", "text/event-stream")]
HEADERS = {
    "accept": "text/event-stream",
    "accept-encoding": "identity",
    "authorization": "Bearer sk-test-loopback-0123456789",
    "content-type": "application/json",
}


def _spec(url: str, **kw: object) -> ProbeSpec:
    return ProbeSpec(
        base_url=url + "/v1",
        format="openai",
        model="m",
        api_key="sk-test-loopback-0123456789",
        max_tokens=20,
        first_token_timeout_s=5,
        total_timeout_s=5,
        **kw,  # type: ignore[arg-type]
    )


def _answer(*replies: Reply) -> LoopbackServer:
    queue = list(replies)

    def handler(request: Received) -> Reply:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return LoopbackServer(handler)


def test_a_providers_cookie_goes_back_with_the_next_probe_on_the_same_client() -> None:
    # Cloudflare's bot-management cookie: set on one answer, sent back with the requests after.
    cookie = Reply(200, [*EVENTS, ("set-cookie", "__cf_bm=abc123; path=/; HttpOnly")], STREAM)
    with _answer(cookie, Reply(200, EVENTS, STREAM)) as server:
        results = run_all(_spec(server.url), _spec(server.url), _spec(server.url))
    assert [r.outcome for r in results] == ["ok", "ok", "ok"], [r.error_detail for r in results]
    assert [r.headers.get("cookie") for r in server.received] == [
        None,
        "__cf_bm=abc123",
        "__cf_bm=abc123",
    ]


def test_a_cold_probe_starts_without_the_warm_clients_cookies() -> None:
    cookie = Reply(200, [*EVENTS, ("set-cookie", "__cf_bm=abc123; path=/")], STREAM)
    with _answer(cookie, Reply(200, EVENTS, STREAM)) as server:
        results = run_all(_spec(server.url), _spec(server.url, cold=True))
    assert [r.outcome for r in results] == ["ok", "ok"]
    assert [r.headers.get("cookie") for r in server.received] == [None, None]


def test_the_request_goes_out_as_httpx2_would_send_it() -> None:
    with _answer(Reply(200, EVENTS, STREAM)) as server:
        (result,) = run_all(_spec(server.url))
        (received,) = server.received
    assert result.outcome == "ok"
    client = make_client(False, True)
    expected = client.build_request(
        "POST", server.url + "/v1/chat/completions", headers=HEADERS, content=received.body
    )
    # Names, values and order: the head httpx2's own client builds for the same request.
    assert received.method == "POST"
    assert received.target == "/v1/chat/completions"
    assert received.head == [(k.decode(), v.decode()) for k, v in expected.headers.raw]


def test_the_head_is_httpx2s_with_the_clients_cookies_and_a_query() -> None:
    async def trace(name: str, info: dict[str, object]) -> None:
        pass

    async def go(http2: bool) -> None:
        # HTTP/1.1 only: the client's own HTTP/1.1 path (DirectRequest); HTTP/2: httpcore2's.
        client = make_client(http2, True)
        url = "https://api.example.com:8443/v1beta/models/m:streamGenerateContent?alt=sse"
        for cookies in ({}, {"__cf_bm": "abc"}, {"__cf_bm": "abc", "other": "x y"}):
            for name, value in cookies.items():
                client.cookies.set(name, value, domain="api.example.com")
            client.cookies.set("elsewhere", "1", domain="other.example.com")
            for body in (b"{}", b'{"a":"' + b"x" * 5000 + b'"}'):
                ours = build_request(client, url, HEADERS, body, trace)
                theirs = client.build_request("POST", url, headers=HEADERS, content=body)
                sent = ours.core if http2 else ours.direct
                assert sent is not None
                assert (ours.core is None) != (ours.direct is None)
                assert sent.headers == theirs.headers.raw
                assert sent.url.target == theirs.url.raw_path
                assert sent.url.host == theirs.url.raw_host
                assert sent.url.port == theirs.url.port
        await client.aclose()

    asyncio.run(go(False))
    asyncio.run(go(True))


def test_a_user_and_password_in_the_url_are_sent_as_httpx2s_basic_auth() -> None:
    with _answer(Reply(200, EVENTS, STREAM)) as server:
        url = server.url.replace("http://", "http://probe:s3cret@")
        (result,) = run_all(_spec(url))
        (received,) = server.received
    assert result.outcome == "ok", result.error_detail
    assert (
        received.headers["authorization"] == "Basic " + base64.b64encode(b"probe:s3cret").decode()
    )


def test_a_redirect_is_answered_not_followed() -> None:
    moved = Reply(307, [("location", "/v2/chat/completions"), ("set-cookie", "seen=1; path=/")])
    with _answer(moved) as server:
        results = run_all(_spec(server.url), _spec(server.url))
    assert [r.error_kind for r in results] == ["config", "config"]
    assert [r.target for r in server.received] == ["/v1/chat/completions"] * 2
    # The redirect's cookie is kept, as httpx2's client keeps it.
    assert server.received[1].headers.get("cookie") == "seen=1"


@contextmanager
def _socket_sends(port: int) -> Iterator[list[str]]:
    """This thread's socket send() calls to `port` while inside (the loopback server runs on a
    thread of its own, unseen): watched with sys.setprofile, nothing replaced."""
    calls: list[str] = []

    def watch(frame: FrameType, event: str, arg: object) -> None:
        if event != "c_call" or getattr(arg, "__name__", "") not in ("send", "sendall"):
            return
        sock = getattr(arg, "__self__", None)
        if isinstance(sock, socket.socket) and sock.fileno() >= 0:
            try:
                if sock.getpeername()[1] == port:
                    calls.append(arg.__name__)  # type: ignore[attr-defined]
            except OSError:
                pass

    sys.setprofile(watch)
    try:
        yield calls
    finally:
        sys.setprofile(None)


def test_a_requests_head_and_body_go_out_in_one_write() -> None:
    # httpcore2 writes the head and the body apart: two sends and two packets a probe. On a
    # kept-alive connection too, and with no body at all (the head alone, once).
    async def go(url: str) -> list[int]:
        counts = []
        try:
            for _ in range(2):
                with _socket_sends(server.port) as sends:
                    result = await probe(_spec(url))
                assert result.outcome == "ok", result.error_detail
                counts.append(len(sends))
            client = make_client(False, True)
            for method, body in (("GET", None), ("POST", b"")):
                with _socket_sends(server.port) as sends:
                    response = await client.request(method, url + "/v1/models", content=body)
                assert response.status_code == 200
                counts.append(len(sends))
            await client.aclose()
        finally:
            await warm_clients.aclose()
        return counts

    with _answer(Reply(200, EVENTS, STREAM)) as server:
        counts = asyncio.run(go(server.url))
        received = server.received
    assert counts == [1, 1, 1, 1]
    assert [r.method for r in received] == ["POST", "POST", "GET", "POST"]
    assert received[0].json()["model"] == "m"
    assert received[1].body == received[0].body
    assert received[2].body == received[3].body == b""
