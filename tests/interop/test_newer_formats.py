"""The engine against an independent server of the newer wire formats: llmock (PyPI, pinned in
servers.py), which serves OpenAI Responses (`/v1/responses`) and Gemini native
(`/gemini/v1beta/models/M:streamGenerateContent?alt=sse`) from the openai SDK's and Google's
documented shapes, paced by a pause between chunks.

What no independent server could be installed for (Bedrock ConverseStream) is said in
docs/interop.md; the official SDKs read the simulator's streams in
tests/simulator/test_sdks_newer_formats.py."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from probes import ProbeSpec
from tests.interop.conftest import ANSWER, LLMOCK_CHUNK_DELAY_MS
from tests.interop.probing import ok_fields, run_one
from tests.interop.servers import Server

pytestmark = [pytest.mark.interop, pytest.mark.timeout(1800)]
PROMPT = "Say one thing about latency."
FORMATS = {
    # format: (base path, model, streaming path)
    "responses": ("/v1", "gpt-4o", "/v1/responses"),
    "gemini": (
        "/gemini/v1beta",
        "gemini-2.0-flash",
        "/gemini/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse",
    ),
}


def _script(llmock: Server, *behaviors: dict[str, Any]) -> None:
    """Queue llmock's next behaviours (each for one request unless it says otherwise)."""
    response = httpx2.post(
        llmock.origin + "/_llmock/scenario", json={"behaviors": list(behaviors)}, timeout=5
    )
    assert response.status_code == 201, response.text


def _spec(llmock: Server, fmt: str) -> ProbeSpec:
    base, model, _ = FORMATS[fmt]
    return ProbeSpec(
        base_url=llmock.origin + base,
        format=fmt,
        model=model,
        api_key="llmock-takes-any-key",
        user_prompt=PROMPT,
        max_tokens=256,
        total_timeout_s=30.0,
        first_token_timeout_s=20.0,
    )


def _raw(llmock: Server, fmt: str) -> list[dict[str, Any]]:
    """llmock's own stream, read without the engine: the ground truth for usage."""
    _, model, path = FORMATS[fmt]
    if fmt == "responses":
        body: dict[str, Any] = {"model": model, "input": PROMPT, "stream": True}
    else:
        body = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}
    events = []
    with httpx2.stream("POST", llmock.origin + path, json=body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return events


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_stream_is_read_whole_with_the_servers_usage(llmock: Server, fmt: str) -> None:
    _script(llmock, {"type": "reply", "text": ANSWER, "times": 2})
    events = _raw(llmock, fmt)
    result = run_one(_spec(llmock, fmt))
    assert not ok_fields(result), ok_fields(result)
    assert result.text == ANSWER
    assert result.token_source == "usage"
    if fmt == "responses":
        usage = events[-1]["response"]["usage"]
        assert events[-1]["type"] == "response.completed"
        assert (result.output_tokens, result.input_tokens) == (
            usage["output_tokens"],
            usage["input_tokens"],
        )
        assert result.cached_tokens == usage["input_tokens_details"]["cached_tokens"]
        assert result.served_model == events[-1]["response"]["model"]
    else:
        usage = events[-1]["usageMetadata"]  # only on the last chunk: llmock's way
        assert (result.output_tokens, result.input_tokens) == (
            usage["candidatesTokenCount"],
            usage["promptTokenCount"],
        )
        assert result.served_model == events[-1]["modelVersion"]
    assert not result.reasoning_tokens


def test_responses_lifecycle_events_are_not_the_first_token(llmock: Server) -> None:
    """llmock pauses before every event: response.created comes with the headers, then
    in_progress, output_item.added and content_part.added, each a pause apart, before the
    first output_text delta. Counting a lifecycle event as a token would put TTFT at TTFB."""
    _script(llmock, {"type": "reply", "text": ANSWER})
    result = run_one(_spec(llmock, "responses"))
    assert result.ok, result.error_detail
    assert result.ttft_ms is not None
    assert result.ttfb_ms is not None
    assert result.ttft_ms - result.ttfb_ms >= 3 * LLMOCK_CHUNK_DELAY_MS * 0.9
    # Between tokens: the server's own pause (and never less).
    assert result.itl_p50_ms is not None
    assert LLMOCK_CHUNK_DELAY_MS * 0.9 <= result.itl_p50_ms < LLMOCK_CHUNK_DELAY_MS * 3


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize(
    ("behavior", "kind"),
    [
        # Ends cleanly but early: no response.completed, no finishReason. "The nasty one: many
        # clients accept it as a full answer" (llmock's words).
        ({"type": "stream_fault", "kind": "truncate", "after_chunks": 6}, "truncated"),
        ({"type": "stream_fault", "kind": "malformed", "after_chunks": 6}, "malformed_stream"),
        ({"type": "fail", "status": 429, "retry_after": 1}, "http_429"),
        ({"type": "fail", "status": 503}, "http_5xx"),
    ],
    ids=["truncate", "malformed", "429", "503"],
)
def test_each_broken_stream_has_its_kind(
    llmock: Server, fmt: str, behavior: dict[str, Any], kind: str
) -> None:
    _script(llmock, {"type": "reply", "text": ANSWER}, behavior)
    result = run_one(_spec(llmock, fmt))
    assert (result.outcome, result.error_kind) == ("error", kind), result.error_detail
