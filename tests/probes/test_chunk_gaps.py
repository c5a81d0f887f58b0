"""What OpenTelemetry's per-chunk and failure metrics need from the engine: each gap between
content chunks (bounded), and for a failed probe the time from sending to the failure. Against
a real HTTP server on loopback that records when it wrote each chunk (the ground truth)."""

from __future__ import annotations

import itertools

import pytest

from probes import ProbeSpec
from probes.model import MAX_CHUNK_GAPS
from tests.probes.loopback import LoopbackServer, Received, Reply, sse
from tests.probes.real_apis import SSE_HEADERS, _chunk
from tests.probes.support import run

USAGE = {"prompt_tokens": 12, "completion_tokens": 0, "total_tokens": 12}


def _stream(delays: list[float], *, finish: bool = True) -> Reply:
    """A role chunk, one content chunk after each delay, then (when `finish`) the finish chunk,
    usage and [DONE]; without it the stream just ends (truncated)."""
    words = [_chunk({"content": f" w{i}"}) for i in range(len(delays))]
    tail = [_chunk({}, "stop"), {**_chunk({}), "choices": [], "usage": USAGE}] if finish else []
    head, *rest = sse(_chunk({"role": "assistant", "content": ""}), *words, *tail, done=finish)
    chunks = [(0.0, head)] + [(d, data) for d, data in zip(delays, rest, strict=False)]
    chunks += [(0.0, data) for data in rest[len(delays) :]]
    return Reply(200, SSE_HEADERS, chunks)


def _spec(url: str, **kw: object) -> ProbeSpec:
    return ProbeSpec(
        base_url=url + "/v1",
        format="openai",
        model="m",
        api_key="sk-test",
        max_tokens=400,
        **kw,  # type: ignore[arg-type]
    )


def test_each_gap_between_content_chunks_is_kept_as_the_server_wrote_them() -> None:
    delays = [0.0, 0.04, 0.01, 0.08, 0.02, 0.06]

    def handler(request: Received) -> Reply:
        return _stream(delays)

    with LoopbackServer(handler) as server:
        result = run(_spec(server.url))
    assert result.ok, result.error_detail
    assert result.failed_after_ms is None
    sent = server.replies[0].sent_at[1 : 1 + len(delays)]  # the content chunks' writes
    truth = [(b - a) * 1000 for a, b in itertools.pairwise(sent)]
    assert result.chunk_gaps_ms is not None
    assert len(result.chunk_gaps_ms) == len(delays) - 1
    for ours, theirs in zip(result.chunk_gaps_ms, truth, strict=True):
        assert ours == pytest.approx(theirs, abs=15), (result.chunk_gaps_ms, truth)
    # The aggregates still agree with the gaps they summarise.
    assert result.itl_max_ms == pytest.approx(max(result.chunk_gaps_ms), abs=0.01)


def test_a_long_stream_keeps_a_bounded_number_of_gaps() -> None:
    n = MAX_CHUNK_GAPS + 100

    def handler(request: Received) -> Reply:
        return _stream([0.0] * n)

    with LoopbackServer(handler) as server:
        result = run(_spec(server.url))
    assert result.ok, result.error_detail
    assert result.chunk_gaps_ms is not None
    assert len(result.chunk_gaps_ms) == MAX_CHUNK_GAPS  # n - 1 gaps streamed


def test_a_truncated_stream_says_when_it_failed() -> None:
    def handler(request: Received) -> Reply:
        return _stream([0.0, 0.05, 0.05], finish=False)

    with LoopbackServer(handler) as server:
        result = run(_spec(server.url))
    assert (result.outcome, result.error_kind) == ("error", "truncated"), result.error_detail
    assert result.e2e_ms is None  # e2e is a completed stream's
    assert result.failed_after_ms is not None
    assert result.failed_after_ms >= 100  # it had streamed for 0.1 s
    assert result.failed_after_ms < 1000
    assert result.ttft_ms is not None
    assert result.failed_after_ms > result.ttft_ms


def test_a_first_token_timeout_fails_at_its_deadline() -> None:
    def handler(request: Received) -> Reply:
        return _stream([0.6])

    with LoopbackServer(handler) as server:
        result = run(_spec(server.url, first_token_timeout_s=0.2))
    assert (result.outcome, result.error_kind) == ("error", "timeout_first_token")
    assert result.failed_after_ms == pytest.approx(200, abs=60)
    assert result.chunk_gaps_ms is None
