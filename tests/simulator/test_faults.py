"""Every fault the simulator injects looks on the wire the way it does from a real provider."""

from __future__ import annotations

import json
import socket
import time

import anthropic
import httpx2
import openai
import pytest

from simulator.testing import SimulatorProcess
from tests.sim_fixtures import ANTHROPIC_KEY, OPENAI_KEY


def _request(sim: SimulatorProcess, fmt: str, fault: str = "", **body: object) -> tuple[str, dict]:
    headers = {"x-sim-fault": fault} if fault else {}
    if fmt == "openai":
        url = f"{sim.base_url}/fastchip/v1/chat/completions"
        headers["authorization"] = f"Bearer {OPENAI_KEY}"
        payload = {"model": "fast-small", "max_tokens": 20, "stream": True}
    else:
        url = f"{sim.base_url}/claudish/v1/messages"
        headers["x-api-key"] = ANTHROPIC_KEY
        headers["anthropic-version"] = "2023-06-01"
        payload = {"model": "claudish-mid", "max_tokens": 20, "stream": True}
    payload["messages"] = [{"role": "user", "content": "hello"}]
    payload.update(body)
    return url, {"json": payload, "headers": headers}


def _truth(sim: SimulatorProcess, request_id: str) -> dict:
    return httpx2.get(f"{sim.base_url}/_sim/requests/{request_id}").json()


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("fault", "status", "anthropic_type"),
    [
        ("http_500", 500, "api_error"),
        ("http_503", 503, "overloaded_error"),
        ("http_429", 429, "rate_limit_error"),
    ],
)
def test_http_errors_come_in_each_dialects_shape(
    sim: SimulatorProcess, fmt: str, fault: str, status: int, anthropic_type: str
) -> None:
    url, kw = _request(sim, fmt, fault)
    response = httpx2.post(url, **kw)
    assert response.status_code == status
    assert response.headers["x-sim-request-id"]
    body = response.json()
    if fmt == "anthropic":
        assert body == {
            "type": "error",
            "error": {"type": anthropic_type, "message": body["error"]["message"]},
        }
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
    if status == 429:
        assert int(response.headers["retry-after"]) >= 1
        prefix = "anthropic-ratelimit-requests" if fmt == "anthropic" else "x-ratelimit"
        assert f"{prefix}-remaining" in "".join(response.headers)
    assert _truth(sim, response.headers["x-sim-request-id"])["status"] == status


def test_the_sdks_raise_their_own_exceptions_for_them(sim: SimulatorProcess) -> None:
    oa = openai.OpenAI(base_url=f"{sim.base_url}/fastchip/v1", api_key=OPENAI_KEY, max_retries=0)
    an = anthropic.Anthropic(
        base_url=f"{sim.base_url}/claudish", api_key=ANTHROPIC_KEY, max_retries=0
    )
    cases = [
        ("http_500", openai.InternalServerError, anthropic.InternalServerError),
        ("http_429", openai.RateLimitError, anthropic.RateLimitError),
    ]
    for fault, oa_error, an_error in cases:
        with pytest.raises(oa_error):
            oa.chat.completions.create(
                model="fast-small",
                messages=[{"role": "user", "content": "x"}],
                extra_headers={"x-sim-fault": fault},
            )
        with pytest.raises(an_error):
            an.messages.create(
                model="claudish-mid",
                max_tokens=5,
                messages=[{"role": "user", "content": "x"}],
                extra_headers={"x-sim-fault": fault},
            )
    with pytest.raises(openai.NotFoundError):
        oa.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_a_stream_error_is_an_api_error_in_the_sdks(sim: SimulatorProcess, fmt: str) -> None:
    if fmt == "openai":
        client = openai.OpenAI(
            base_url=f"{sim.base_url}/fastchip/v1", api_key=OPENAI_KEY, max_retries=0
        )
        stream = client.chat.completions.create(
            model="fast-small",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            extra_headers={"x-sim-fault": "stream_error"},
        )
        with pytest.raises(openai.APIError, match="server had an error"):
            list(stream)
    else:
        an = anthropic.Anthropic(
            base_url=f"{sim.base_url}/claudish", api_key=ANTHROPIC_KEY, max_retries=0
        )
        events = an.messages.create(
            model="claudish-mid",
            max_tokens=20,
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            extra_headers={"x-sim-fault": "stream_error"},
        )
        with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
            list(events)


def test_stream_options_can_be_rejected(sim: SimulatorProcess) -> None:
    url, kw = _request(
        sim, "openai", "reject_stream_options", stream_options={"include_usage": True}
    )
    rejected = httpx2.post(url, **kw)
    assert rejected.status_code == 400
    assert "stream_options" in rejected.json()["error"]["message"]
    url, kw = _request(sim, "openai", "reject_stream_options")
    assert httpx2.post(url, **kw).status_code == 200


def _lines(sim: SimulatorProcess, fmt: str, fault: str, **body: object) -> list[str]:
    url, kw = _request(sim, fmt, fault, **body)
    with httpx2.stream("POST", url, timeout=10, **kw) as response:
        assert response.status_code == 200
        return list(response.iter_lines())


def test_usage_can_be_omitted_or_sent_after_done(sim: SimulatorProcess) -> None:
    include = {"stream_options": {"include_usage": True}}
    normal = [ln for ln in _lines(sim, "openai", "", **include) if ln.startswith("data: ")]
    assert normal[-1] == "data: [DONE]"
    assert json.loads(normal[-2][6:])["usage"]["completion_tokens"] == 20
    assert json.loads(normal[-2][6:])["choices"] == []
    omitted = [ln for ln in _lines(sim, "openai", "no_usage", **include) if ln.startswith("data: ")]
    assert omitted[-1] == "data: [DONE]"
    assert all('"usage":{' not in line for line in omitted)
    after = [ln for ln in _lines(sim, "openai", "usage_after_done") if ln.startswith("data: ")]
    assert after[-2] == "data: [DONE]"
    assert json.loads(after[-1][6:])["usage"]["completion_tokens"] == 20
    anthropic_lines = _lines(sim, "anthropic", "no_usage")
    assert all('"usage"' not in line for line in anthropic_lines)


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_a_malformed_chunk_is_a_data_line_that_is_not_json(sim: SimulatorProcess, fmt: str) -> None:
    bad = []
    for line in _lines(sim, fmt, "malformed_chunk"):
        if line.startswith("data: ") and line != "data: [DONE]":
            try:
                json.loads(line[6:])
            except ValueError:
                bad.append(line)
    assert len(bad) == 1


@pytest.mark.parametrize("http2", [False, True])
@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_a_truncated_stream_breaks_off_without_its_last_event(
    tls_sim: SimulatorProcess, fmt: str, http2: bool
) -> None:
    url, kw = _request(tls_sim, fmt, "truncated")
    seen: list[str] = []

    def read_all(client: httpx2.Client) -> None:
        with client.stream("POST", url, **kw) as response:
            seen.extend(response.iter_lines())

    with (
        httpx2.Client(http2=http2, verify=tls_sim.ssl_context(), timeout=10) as client,
        pytest.raises(httpx2.RemoteProtocolError),
    ):
        read_all(client)
    assert sum('"content' in line or "text_delta" in line for line in seen) >= 5
    assert not any("[DONE]" in line or "message_stop" in line for line in seen)


def test_stalls_and_trickles_keep_the_connection_open(sim: SimulatorProcess) -> None:
    url, kw = _request(sim, "openai", "stall_headers")
    with pytest.raises(httpx2.ReadTimeout):
        httpx2.post(url, timeout=httpx2.Timeout(5, read=0.5), **kw)

    url, kw = _request(sim, "openai", "stall_mid")
    lines: list[str] = []
    with (
        httpx2.stream("POST", url, timeout=httpx2.Timeout(5, read=0.5), **kw) as response,
        pytest.raises(httpx2.ReadTimeout),
    ):
        lines.extend(response.iter_lines())
    assert sum('"content":" ' in line for line in lines) == 5
    truth = _truth(sim, response.headers["x-sim-request-id"])
    assert truth["output_tokens"] == 5
    assert truth["end_at"] is None

    url, kw = _request(sim, "anthropic", "trickle")
    started = time.monotonic()
    comments = 0
    with httpx2.stream("POST", url, timeout=5, **kw) as response:
        for line in response.iter_lines():
            assert "content_block_delta" not in line
            comments += line == ": keep-alive"
            if time.monotonic() - started > 0.6:
                break
    assert 3 <= comments <= 7  # every ~100 ms


def test_huge_lines_and_responses_do_not_end_by_themselves(sim: SimulatorProcess) -> None:
    url, kw = _request(sim, "openai", "huge_line")
    received = 0
    with httpx2.stream("POST", url, timeout=10, **kw) as response:
        for chunk in response.iter_raw():
            assert b"\n" not in chunk.replace(b"\r\n", b"") or received == 0
            received += len(chunk)
            if received > 8 * 1024 * 1024:
                break
    assert received > 8 * 1024 * 1024

    url, kw = _request(sim, "anthropic", "huge_response")
    received = 0
    with httpx2.stream("POST", url, timeout=10, **kw) as response:
        for chunk in response.iter_bytes():
            received += len(chunk)
            if received > 8 * 1024 * 1024:
                break
    assert received > 8 * 1024 * 1024
    # The server noticed the client leave and is still healthy.
    assert httpx2.get(f"{sim.base_url}/_sim/health").status_code == 200


def test_faults_need_the_providers_permission_and_known_names(sim: SimulatorProcess) -> None:
    url, kw = _request(sim, "openai", "no_such_fault")
    assert httpx2.post(url, **kw).status_code == 400


def test_a_client_that_leaves_mid_stream_frees_the_stream(sim: SimulatorProcess) -> None:
    url = f"{sim.base_url}/fastchip/v1/chat/completions"
    body = json.dumps(
        {
            "model": "slow-large",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "max_tokens": 40,
        }
    ).encode()
    with socket.create_connection(("127.0.0.1", sim.port)) as sock:
        sock.sendall(
            b"POST /fastchip/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            b"authorization: Bearer " + OPENAI_KEY.encode() + b"\r\n"
            b"content-type: application/json\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        head = sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200")
    request_id = head.split(b"x-sim-request-id: ")[1].split(b"\r\n")[0].decode()
    time.sleep(0.6)  # slow-large would still be streaming
    truth = _truth(sim, request_id)
    assert truth["end_at"] is None
    assert truth["output_tokens"] < 40
    assert httpx2.get(f"{sim.base_url}/_sim/stats").json()["active_streams"] == 0
    assert url
