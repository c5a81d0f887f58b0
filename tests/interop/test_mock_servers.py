"""The engine against three independent mock servers (mockllm, fakellm, stubllm): streamed
answers measured and counted right, their errors and their own protocol bugs classified
truthfully, and servers that die, freeze or never start ending in the right error_kind."""

from __future__ import annotations

import asyncio
import time

import pytest

from probes.engine import Progress
from probes.tokenizer import count_tokens
from tests.interop.conftest import (
    ANSWER,
    LONG_ANSWER,
    SHORT_ANSWER,
    STUB_CHUNK_DELAY_MS,
    STUB_FIRST_TOKEN_DELAY_MS,
)
from tests.interop.probing import ok_fields, run_one, run_while, spec, until_output
from tests.interop.servers import Server

# The first use installs the servers (LiteLLM: minutes); pytest-timeout counts fixture setup.
pytestmark = [pytest.mark.interop, pytest.mark.timeout(1800)]


def _span_ms(result) -> float:
    """First content chunk to end of stream."""
    return result.e2e_ms - result.ttft_ms


# mockllm 0.0.8: OpenAI chunks of one character each, 10 ms (+-50%) apart; no usage, ever.


@pytest.mark.parametrize("stream_options", [True, False])
def test_mockllm_openai_stream_is_timed_and_counted(mockllm: Server, stream_options: bool) -> None:
    result = run_one(spec(mockllm.origin, "openai", "gpt-4o", stream_options=stream_options))
    assert not ok_fields(result), ok_fields(result)
    assert result.text == SHORT_ANSWER
    assert result.http_version == "HTTP/1.1"
    # No usage in the stream, asked for or not: counted with our tokenizer, inputs unknown.
    assert result.token_source == "tokenizer"
    assert result.output_tokens == count_tokens(SHORT_ANSWER)
    assert result.input_tokens is None
    assert result.cached_tokens is None
    # One character every ~10 ms: the stream lasts (characters - 1) gaps.
    gaps = len(SHORT_ANSWER) - 1
    assert gaps * 5 <= _span_ms(result) <= gaps * 40 + 200
    assert result.itl_p50_ms is not None
    assert 4 <= result.itl_p50_ms <= 40
    # Speed is tokens after the first over the time between first and last content chunk.
    assert result.tps is not None
    expected = (result.output_tokens - 1) / (_span_ms(result) / 1000)
    assert result.tps == pytest.approx(expected, rel=0.25)


def test_mockllm_anthropic_endpoint_is_not_anthropic_and_the_engine_says_so(
    mockllm: Server,
) -> None:
    """mockllm's /v1/messages stream has no message_start/stop: every event is a
    `data: {"type":"message_delta","delta":{"type":"content_block_delta",...}}` and it ends
    with an OpenAI `data: [DONE]`. The server's bug; the engine must not call it an answer."""
    result = run_one(spec(mockllm.origin, "anthropic", "claude-3-haiku-20240307"))
    assert result.outcome == "error"
    assert result.error_kind == "malformed_stream", result.error_detail
    assert "[DONE]" in result.error_detail
    assert result.ttft_ms is None


def test_mockllm_unknown_path_is_a_4xx(mockllm: Server) -> None:
    result = run_one(spec(mockllm.origin + "/nowhere", "openai", "gpt-4o"))
    assert (result.outcome, result.error_kind) == ("error", "http_4xx")
    assert "404" in result.error_detail


def test_a_body_the_server_cannot_read_is_classified_by_its_status(
    mockllm: Server, fakellm: Server, stubllm: Server
) -> None:
    """A msgpack+gzip body sent to JSON-only servers: all three crash on it and answer 500 (their
    bug: an unreadable body is a 400). The engine reports the 500 as what it is."""
    for server in (mockllm, fakellm, stubllm):
        result = run_one(spec(server.origin, "openai", "gpt-4o", body_encoding="msgpack-gzip"))
        assert (result.outcome, result.error_kind) == ("error", "http_5xx"), server.name
        assert result.ttfb_ms is not None


# fakellm 0.3.5: word by word, 10 ms apart; Anthropic with usage (its own estimate).


def test_fakellm_openai_stream(fakellm: Server) -> None:
    result = run_one(spec(fakellm.origin, "openai", "gpt-4o-mini"))
    assert not ok_fields(result), ok_fields(result)
    assert result.text == ANSWER
    assert result.token_source == "tokenizer"
    assert result.output_tokens == count_tokens(ANSWER)
    assert result.itl_p50_ms is not None
    assert 5 <= result.itl_p50_ms <= 40  # asyncio.sleep(0.01) between words


def test_fakellm_anthropic_stream_reports_the_servers_usage(fakellm: Server) -> None:
    """fakellm's message_start says input_tokens 1 and its message_delta says output_tokens =
    len(text) // 4: not true counts, but what the server reports, which is what usage is."""
    result = run_one(spec(fakellm.origin, "anthropic", "claude-sonnet-4-5"))
    assert not ok_fields(result), ok_fields(result)
    assert result.text == ANSWER
    assert result.token_source == "usage"
    assert result.output_tokens == len(ANSWER) // 4
    assert result.input_tokens == 1
    assert result.cached_tokens is None  # not reported, which differs from 0


# stubllm 0.1.5: chunks of up to 4 characters, a configured delay apart; a configured wait
# before the first; errors as JSON bodies with their status.


def test_stubllm_openai_gaps_match_the_servers_pace(stubllm: Server) -> None:
    result = run_one(spec(stubllm.origin, "openai", "gpt-4o"))
    assert not ok_fields(result), ok_fields(result)
    assert result.text == ANSWER
    assert result.token_source == "tokenizer"
    assert result.output_tokens == count_tokens(ANSWER)
    assert result.itl_p50_ms is not None
    assert STUB_CHUNK_DELAY_MS * 0.8 <= result.itl_p50_ms <= STUB_CHUNK_DELAY_MS * 3


def test_stubllm_anthropic_stream_as_sent(stubllm: Server) -> None:
    """stubllm's Anthropic stream has no message_start and turns its last chunk into the
    message_delta, dropping that chunk's text; its usage is a fixed output_tokens 20. The
    engine reports the text that came and the count the server gave."""
    result = run_one(spec(stubllm.origin, "anthropic", "claude-opus-4-6"))
    assert not ok_fields(result), ok_fields(result)
    assert ANSWER.startswith(result.text)
    assert 0 < len(ANSWER) - len(result.text) <= 4  # the last chunk, lost by the server
    assert result.token_source == "usage"
    assert result.output_tokens == 20
    assert result.input_tokens is None


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_stubllm_wait_before_the_first_token_is_in_ttft_not_ttfb(stubllm: Server, fmt: str) -> None:
    """Headers go out at once; the first chunk comes after latency_ms."""
    result = run_one(spec(stubllm.origin, fmt, "m", user_prompt="slow start please"))
    assert not ok_fields(result), ok_fields(result)
    assert result.ttfb_ms is not None
    assert result.ttft_ms is not None
    waited = result.ttft_ms - result.ttfb_ms
    assert STUB_FIRST_TOKEN_DELAY_MS - 5 <= waited <= STUB_FIRST_TOKEN_DELAY_MS + 300


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_stubllm_headers_but_no_token_is_timeout_first_token(stubllm: Server, fmt: str) -> None:
    started = time.monotonic()
    result = run_one(
        spec(stubllm.origin, fmt, "m", user_prompt="never starts", first_token_timeout_s=1.0)
    )
    assert (result.outcome, result.error_kind) == ("error", "timeout_first_token")
    assert result.ttfb_ms is not None
    assert time.monotonic() - started < 4


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("prompt", "key", "kind", "message"),
    [
        ("rate limit me", "", "http_429", "Rate limit reached"),
        ("fail please", "", "http_5xx", "The server had an error"),
        ("Who am I?", "sk-wrong-key", "http_4xx", ""),
    ],
)
def test_stubllm_error_answers(
    stubllm: Server, fmt: str, prompt: str, key: str, kind: str, message: str
) -> None:
    result = run_one(spec(stubllm.origin, fmt, "m", user_prompt=prompt, api_key=key))
    assert (result.outcome, result.error_kind) == ("error", kind)
    if kind == "http_4xx":  # 401 with the provider's own words, and never our key
        assert "401" in result.error_detail
        assert (
            "invalid" in result.error_detail.lower() or "incorrect" in result.error_detail.lower()
        )
        assert key not in result.error_detail
    else:
        assert message in result.error_detail
    assert result.retry_after_s is None  # stubllm sends no retry-after


# Servers that die or freeze: a mockllm of its own, streaming a long answer slowly.


def test_server_killed_mid_stream_is_truncated(doomed_mockllm: Server) -> None:
    async def kill_after_output(progress: Progress) -> None:
        await until_output(progress)
        doomed_mockllm.kill()

    result, _ = run_while(spec(doomed_mockllm.origin, "openai", "gpt-4o"), kill_after_output)
    assert (result.outcome, result.error_kind) == ("error", "truncated"), result.error_detail
    assert result.ttft_ms is not None
    assert result.e2e_ms is None
    assert result.text
    assert LONG_ANSWER.startswith(result.text)
    assert len(result.text) < len(LONG_ANSWER)
    assert result.output_tokens == count_tokens(result.text)
    assert result.token_source == "tokenizer"
    # and now nothing listens there
    after = run_one(spec(doomed_mockllm.origin, "openai", "gpt-4o"))
    assert (after.outcome, after.error_kind) == ("error", "connect")


def test_server_that_never_answers_is_timeout_headers(slow_mockllm: Server) -> None:
    """SIGSTOP: the kernel completes the TCP handshake and takes the request; no answer."""
    slow_mockllm.pause()
    try:
        started = time.monotonic()
        result = run_one(
            spec(slow_mockllm.origin, "openai", "gpt-4o", first_token_timeout_s=1.0, cold=True)
        )
        elapsed = time.monotonic() - started
    finally:
        slow_mockllm.resume()
    assert (result.outcome, result.error_kind) == ("error", "timeout_headers")
    assert result.connect_ms is not None  # the connection itself worked
    assert result.ttfb_ms is None
    assert elapsed < 3


def test_server_frozen_mid_stream_is_timeout_total(slow_mockllm: Server) -> None:
    async def freeze_after_output(progress: Progress) -> None:
        await until_output(progress)
        slow_mockllm.pause()
        await asyncio.sleep(30)

    started = time.monotonic()
    try:
        result, _ = run_while(
            spec(slow_mockllm.origin, "openai", "gpt-4o", total_timeout_s=2.0, cold=True),
            freeze_after_output,
        )
    finally:
        slow_mockllm.resume()
    assert (result.outcome, result.error_kind) == ("error", "timeout_total")
    assert result.ttft_ms is not None
    assert result.text
    assert LONG_ANSWER.startswith(result.text)
    assert time.monotonic() - started < 5
