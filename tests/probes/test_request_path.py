"""The probe's request goes straight to its client's transport (probes.request.build_request
and send), not through httpx2's client layers: what goes out and what is kept are httpx2's."""

from __future__ import annotations

import asyncio
import base64

from probes import ProbeSpec
from probes.request import build_request
from probes.transport import make_client
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

    async def go() -> None:
        client = make_client(False, True)
        url = "https://api.example.com:8443/v1beta/models/m:streamGenerateContent?alt=sse"
        for cookies in ({}, {"__cf_bm": "abc"}, {"__cf_bm": "abc", "other": "x y"}):
            for name, value in cookies.items():
                client.cookies.set(name, value, domain="api.example.com")
            client.cookies.set("elsewhere", "1", domain="other.example.com")
            for body in (b"{}", b'{"a":"' + b"x" * 5000 + b'"}'):
                ours = build_request(client, url, HEADERS, body, trace)
                theirs = client.build_request("POST", url, headers=HEADERS, content=body)
                assert ours.core is not None
                assert ours.core.headers == theirs.headers.raw
                assert ours.core.url.target == theirs.url.raw_path
                assert ours.core.url.host == theirs.url.raw_host
                assert ours.core.url.port == theirs.url.port
        await client.aclose()

    asyncio.run(go())


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
