"""`python -m simulator --processes 2`: two workers on one port keep up with a burst of
connections, and a request behaves the same whichever worker serves it (faults, seeded plans,
the provider's prompt cache and rate limits, ground truth and statistics)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from simulator.testing import ROOT, SimulatorProcess

KEY = "sk-test-wide-0123456789"
LIMITED_KEY = "sk-test-limited-0123456789"
STREAMS = 1500
TOKENS = 8
CONFIG = f"""
[[providers]]
slug = "wide"
format = "openai"
api_keys = ["{KEY}"]
allow_fault_header = true

[[providers.models]]
id = "drip"
queue_ms = 0
queue_sigma = 0.0
prefill_tokens_per_s = 1000000
decode_tokens_per_s = 8
decode_sigma = 0.0
output_tokens = {TOKENS}

[[providers.models]]
id = "jitter"
queue_ms = 40
queue_sigma = 0.5
prefill_tokens_per_s = 1000000
decode_tokens_per_s = 500
decode_sigma = 0.3
itl_sigma = 0.5
output_tokens = 12

[[providers]]
slug = "limited"
format = "openai"
api_keys = ["{LIMITED_KEY}"]
requests_per_minute = 5

[[providers.models]]
id = "tiny"
queue_ms = 0
queue_sigma = 0.0
decode_tokens_per_s = 1000
decode_sigma = 0.0
output_tokens = 3
"""


@pytest.fixture(scope="module")
def sim2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatorProcess]:
    config = tmp_path_factory.mktemp("processes") / "wide.toml"
    config.write_text(CONFIG)
    with SimulatorProcess(config, processes=2) as process:
        yield process


def _worker(request_id: str) -> str:
    """The serving process, from a request id ("sim<pid>-<n>")."""
    return request_id.rsplit("-", 1)[0]


class _Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status_code, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


def _post(
    sim: SimulatorProcess,
    body: dict[str, Any],
    *,
    slug: str = "wide",
    key: str = KEY,
    headers: dict[str, str] | None = None,
) -> _Answer:
    """On a new connection each time: the kernel picks the worker by the connection."""
    connection = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    try:
        connection.request(
            "POST",
            f"/{slug}/v1/chat/completions",
            body=json.dumps(body),
            headers={
                "authorization": f"Bearer {key}",
                "content-type": "application/json",
                **(headers or {}),
            },
        )
        response = connection.getresponse()
        return _Answer(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        connection.close()


def _through_both(sim: SimulatorProcess, send: Any) -> dict[str, _Answer]:
    """`send()` on new connections until each worker has answered one."""
    seen: dict[str, _Answer] = {}
    for _ in range(60):
        response = send()
        seen.setdefault(_worker(response.headers["x-sim-request-id"]), response)
        if len(seen) == 2:
            return seen
    raise AssertionError(f"60 new connections all reached {sorted(seen)}")


async def _stream(port: int, index: int) -> tuple[int, str, bytes]:
    body = json.dumps(
        {
            "model": "drip",
            "stream": True,
            "messages": [{"role": "user", "content": f"stream {index}"}],
        }
    ).encode()
    head = (
        f"POST /wide/v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + body)
        data = await reader.read()  # the server closes after the response (connection: close)
    finally:
        writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    headers = rest.partition(b"\r\n\r\n")[0].decode("latin-1").lower()
    request_id = next(
        line.split(":", 1)[1].strip()
        for line in headers.split("\r\n")
        if line.startswith("x-sim-request-id:")
    )
    return int(status_line.split()[1]), request_id, data


async def _burst(port: int) -> tuple[list[tuple[int, str, bytes]], float]:
    started = time.monotonic()
    results = await asyncio.wait_for(
        asyncio.gather(*(_stream(port, i) for i in range(STREAMS))), timeout=60
    )
    return list(results), time.monotonic() - started


def test_two_workers_accept_and_serve_a_burst_of_streams(sim2: SimulatorProcess) -> None:
    """1,500 streams opened at once (each 8 tokens over about a second), all accepted and
    served in full, by both workers."""
    results, elapsed = asyncio.run(_burst(sim2.port))
    assert [status for status, _, _ in results] == [200] * STREAMS
    for _, _, data in results:
        events = [json.loads(line[6:]) for line in data.split(b"\n") if line[:7] == b"data: {"]
        content = [e["choices"][0]["delta"].get("content") for e in events if e["choices"]]
        assert len([c for c in content if c]) == TOKENS
        assert b"data: [DONE]" in data
        assert data.endswith(b"\r\n0\r\n\r\n")  # the chunked body's end: served in full
    served = {}
    for _, request_id, _ in results:
        served[_worker(request_id)] = served.get(_worker(request_id), 0) + 1
    assert len(served) == 2, served
    # The kernel spreads connections by a hash of their ports: neither worker gets them all.
    assert min(served.values()) > STREAMS // 4, served
    # Each stream lasts about a second: they ran at once, not in turns.
    assert elapsed < 20, elapsed
    stats = httpx2.get(f"{sim2.base_url}/_sim/stats").json()
    assert stats["processes"] == 2
    assert stats["requests"] >= STREAMS  # both workers' counts, whichever one was asked
    assert stats["send_lag_ms"]["count"] >= STREAMS * TOKENS


def test_a_fault_is_the_same_through_either_worker(sim2: SimulatorProcess) -> None:
    body = {"model": "drip", "messages": [{"role": "user", "content": "hi"}]}
    both = _through_both(sim2, lambda: _post(sim2, body, headers={"x-sim-fault": "http_503"}))
    answers = [(r.status_code, r.json()) for r in both.values()]
    assert answers[0] == answers[1]
    assert answers[0][0] == 503


def test_a_seeded_request_is_planned_the_same_by_either_worker(sim2: SimulatorProcess) -> None:
    body = {"model": "jitter", "messages": [{"role": "user", "content": "the same question"}]}
    both = _through_both(sim2, lambda: _post(sim2, body, headers={"x-sim-seed": "4242"}))
    truths = [
        httpx2.get(f"{sim2.base_url}/_sim/requests/{r.headers['x-sim-request-id']}").json()
        for r in both.values()
    ]
    assert truths[0]["id"] != truths[1]["id"]
    for field in ("planned_ttft_ms", "planned_tokens_per_s", "output_tokens", "correct"):
        assert truths[0][field] == truths[1][field], field
    texts = [r.json()["choices"][0]["message"]["content"] for r in both.values()]
    assert texts[0] == texts[1]


def test_the_prompt_cache_is_the_providers_not_a_workers(sim2: SimulatorProcess) -> None:
    """A long prompt sent once is cached for the next request whichever worker takes it."""
    long = "cache me " * 1500
    first = _post(sim2, {"model": "drip", "messages": [{"role": "user", "content": long}]})
    assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    owner = _worker(first.headers["x-sim-request-id"])
    for _ in range(60):
        again = _post(sim2, {"model": "drip", "messages": [{"role": "user", "content": long}]})
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 2000
        if _worker(again.headers["x-sim-request-id"]) != owner:
            return
    raise AssertionError("no request reached the other worker")


def test_rate_limits_are_the_providers_and_truths_found_through_either(
    sim2: SimulatorProcess,
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    answers = [_post(sim2, body, slug="limited", key=LIMITED_KEY) for _ in range(12)]
    assert [r.status_code for r in answers] == [200] * 5 + [429] * 7
    remaining = [r.headers["x-ratelimit-remaining-requests"] for r in answers[:5]]
    assert remaining == ["4", "3", "2", "1", "0"]
    assert len({_worker(r.headers["x-sim-request-id"]) for r in answers}) == 2
    # Each request's ground truth from either worker (new connections, so both are asked).
    for response in answers:
        request_id = response.headers["x-sim-request-id"]
        for _ in range(2):
            truth = httpx2.get(f"{sim2.base_url}/_sim/requests/{request_id}").json()
            assert truth["id"] == request_id
            assert truth["status"] == response.status_code
    # Reset through one worker resets both.
    assert httpx2.post(f"{sim2.base_url}/_sim/stats/reset").status_code == 200
    assert httpx2.get(f"{sim2.base_url}/_sim/stats").json()["send_lag_ms"]["count"] == 0


def test_each_worker_leads_a_session_of_its_own(sim2: SimulatorProcess) -> None:
    """With autogroups Linux shares the CPUs between sessions first: workers left in their
    parent's session would share one process's CPU share between them (on bench-load's busy
    machine, 3 workers got 0.2 cores together and probes timed out waiting for headers)."""
    assert sim2.proc is not None
    parent = sim2.proc.pid
    workers = [p["pid"] for p in httpx2.get(f"{sim2.base_url}/_sim/stats").json()["per_process"]]
    assert len(set(workers)) == 2
    for pid in workers:
        assert pid != parent
        assert os.getsid(pid) == pid  # the leader of its own session
    assert os.getsid(parent) != parent  # the parent stays in its caller's session (Ctrl-C)


def test_stats_count_the_requests_waiting_for_headers_and_their_wait(
    sim2: SimulatorProcess,
) -> None:
    """A request held before its headers (a stalled fault) is counted as awaiting headers
    until it leaves; a served one adds its read-to-headers time."""
    httpx2.post(f"{sim2.base_url}/_sim/stats/reset")
    body = {"model": "jitter", "messages": [{"role": "user", "content": "hi"}]}
    assert _post(sim2, body).status_code == 200

    def awaiting() -> int:
        return int(httpx2.get(f"{sim2.base_url}/_sim/stats").json()["awaiting_headers"])

    assert awaiting() == 0
    stalled = socket.create_connection(("127.0.0.1", sim2.port))
    try:
        payload = json.dumps(body).encode()
        stalled.sendall(
            b"POST /wide/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            b"authorization: Bearer " + KEY.encode() + b"\r\ncontent-type: application/json\r\n"
            b"x-sim-fault: stall_headers\r\ncontent-length: %d\r\n\r\n%b" % (len(payload), payload)
        )
        deadline = time.monotonic() + 10
        while awaiting() != 1:
            assert time.monotonic() < deadline, "the stalled request was never counted"
            time.sleep(0.02)
    finally:
        stalled.close()
    deadline = time.monotonic() + 10
    while awaiting() != 0:
        assert time.monotonic() < deadline, "the stalled request stayed counted after it left"
        time.sleep(0.02)
    stats = httpx2.get(f"{sim2.base_url}/_sim/stats").json()
    waits = stats["headers_wait_ms"]
    assert waits["count"] == 1  # the served request; the stalled one never sent headers
    assert 0 <= waits["max"] < 5000
    assert [p["awaiting_headers"] for p in stats["per_process"]] == [0, 0]


def test_the_cli_says_why_it_cannot_listen(tmp_path: Path) -> None:
    config = tmp_path / "wide.toml"
    config.write_text(CONFIG)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for processes in ("1", "2"):
            argv = [sys.executable, "-m", "simulator", "--config", str(config), "--port"]
            done = subprocess.run(
                [*argv, str(port), "--processes", processes],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode != 0
            assert f"simulator: cannot listen on 127.0.0.1:{port}" in done.stderr
