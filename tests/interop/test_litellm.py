"""The engine against the LiteLLM proxy gateway: its own mock models (mock_response) and models
it routes to an upstream (fakellm), in both of its wire formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest

from probes import ProbeSpec
from probes.engine import Progress
from probes.tokenizer import count_tokens
from tests.interop.conftest import (
    ANSWER,
    LITELLM_KEY,
    LONG_ANSWER,
    LiteLLM,
    _start,
    mockllm_server,
)
from tests.interop.probing import ok_fields, run_one, run_while, spec, until_output
from tests.probes.support import run_all

# The first use installs the servers (LiteLLM: minutes); pytest-timeout counts fixture setup.
pytestmark = [pytest.mark.interop, pytest.mark.timeout(1800)]
PROMPT = "Say one thing about latency."


def _raw_events(litellm: LiteLLM, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The gateway's own stream, read without the engine: the ground truth for usage."""
    headers = {"authorization": f"Bearer {LITELLM_KEY}", "anthropic-version": "2023-06-01"}
    events = []
    with httpx2.stream(
        "POST", litellm.server.origin + path, json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_openai_stream_with_usage_matches_what_the_gateway_says(litellm: LiteLLM) -> None:
    """LiteLLM sends usage (with completion_tokens_details) in a chunk after the finish."""
    first, second = run_all(
        *(
            spec(
                litellm.server.origin,
                "openai",
                "gpt-4o-mock",
                api_key=LITELLM_KEY,
                user_prompt=PROMPT,
            )
            for _ in range(2)
        )
    )
    events = _raw_events(
        litellm,
        "/v1/chat/completions",
        {
            "model": "gpt-4o-mock",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 256,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    usage = next(e["usage"] for e in events if e.get("usage"))
    for result in (first, second):
        assert not ok_fields(result), ok_fields(result)
        assert result.text == ANSWER
        assert result.token_source == "usage"
        assert result.output_tokens == usage["completion_tokens"]
        assert result.input_tokens == usage["prompt_tokens"]
        assert result.reasoning_tokens == usage["completion_tokens_details"]["reasoning_tokens"]
        assert result.cached_tokens is None  # no prompt_tokens_details: not reported
        assert result.http_version == "HTTP/1.1"
    assert second.connect_ms is None  # warm


def test_openai_stream_without_stream_options_is_counted_by_the_tokenizer(
    litellm: LiteLLM,
) -> None:
    result = run_one(
        spec(
            litellm.server.origin,
            "openai",
            "gpt-4o-mock",
            api_key=LITELLM_KEY,
            stream_options=False,
        )
    )
    assert not ok_fields(result), ok_fields(result)
    assert result.text == ANSWER
    assert result.token_source == "tokenizer"
    assert result.output_tokens == count_tokens(ANSWER)
    assert result.input_tokens is None


def test_a_json_answer_to_a_streaming_request_is_malformed_stream(litellm: LiteLLM) -> None:
    """LiteLLM 1.81.13's /v1/messages ignores stream=true for mock_response models and answers
    200 application/json with the whole message (its bug). PRODUCT.md: malformed_stream
    includes a 200 that is not an event stream."""
    result = run_one(spec(litellm.server.origin, "anthropic", "claude-mock", api_key=LITELLM_KEY))
    assert result.outcome == "error"
    assert result.error_kind == "malformed_stream", (result.error_kind, result.error_detail)


@pytest.mark.parametrize(
    ("fmt", "model"),
    [
        ("openai", "up-openai"),  # OpenAI in, OpenAI upstream
        ("openai", "up-claude"),  # OpenAI in, translated from an Anthropic upstream
        ("anthropic", "up-claude"),  # Anthropic in, Anthropic upstream
        ("anthropic", "up-openai"),  # Anthropic in, translated from an OpenAI upstream
    ],
)
def test_routed_to_an_upstream_in_either_format(litellm: LiteLLM, fmt: str, model: str) -> None:
    result = run_one(spec(litellm.server.origin, fmt, model, api_key=LITELLM_KEY))
    assert not ok_fields(result), ok_fields(result)
    assert result.text == ANSWER
    assert result.token_source == "usage"
    assert result.output_tokens is not None
    if model == "up-claude":  # fakellm's own figure (len // 4), relayed by the gateway
        assert result.output_tokens == len(ANSWER) // 4
    else:  # the gateway counts an upstream that sent none
        assert abs(result.output_tokens - count_tokens(ANSWER)) <= 2
    assert result.input_tokens is not None


def test_the_result_names_the_model_that_served_it(litellm: LiteLLM) -> None:
    events = _raw_events(
        litellm,
        "/v1/messages",
        {
            "model": "up-claude",
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 256,
            "stream": True,
        },
    )
    served = next(e["message"]["model"] for e in events if e.get("type") == "message_start")
    result = run_one(spec(litellm.server.origin, "anthropic", "up-claude", api_key=LITELLM_KEY))
    assert result.ok
    assert getattr(result, "served_model", None) == served


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("key", "model", "status", "words"),
    [
        # Without a database LiteLLM looks any key but the master key up in one: 400, not 401.
        ("sk-not-the-key", "gpt-4o-mock", "400", "No connected db"),
        ("", "gpt-4o-mock", "401", "No api key passed"),
        (LITELLM_KEY, "no-such-model", "400", "Invalid model name"),
    ],
)
def test_gateway_refusals_are_4xx_with_its_words(
    litellm: LiteLLM, fmt: str, key: str, model: str, status: str, words: str
) -> None:
    result = run_one(spec(litellm.server.origin, fmt, model, api_key=key))
    assert (result.outcome, result.error_kind) == ("error", "http_4xx")
    assert f"HTTP {status}" in result.error_detail
    assert words in result.error_detail
    assert LITELLM_KEY not in result.error_detail


def test_msgpack_body_is_refused_as_a_4xx(litellm: LiteLLM) -> None:
    result = run_one(
        spec(
            litellm.server.origin,
            "openai",
            "gpt-4o-mock",
            api_key=LITELLM_KEY,
            body_encoding="msgpack-gzip",
        )
    )
    assert (result.outcome, result.error_kind) == ("error", "http_4xx")


def test_an_upstream_dying_mid_stream_is_passed_off_as_complete_by_the_gateway(
    litellm: LiteLLM, mocks_bin: Path, tmp_path: Path
) -> None:
    """LiteLLM 1.81.13 ends the client's stream normally (finish_reason "stop", usage, [DONE])
    when its upstream is killed mid-stream: the gateway's bug, which no client can see through.
    The engine reports what it was told: ok, with the partial text."""
    upstream = _start(
        mockllm_server(
            mocks_bin, tmp_path, LONG_ANSWER, name="dying", port=litellm.dying_upstream_port
        )
    )

    async def kill_upstream(progress: Progress) -> None:
        await until_output(progress)
        upstream.kill()

    try:
        result, _ = run_while(
            spec(litellm.server.origin, "openai", "up-dying", api_key=LITELLM_KEY), kill_upstream
        )
    finally:
        upstream.stop()
    assert result.ok, result.error_detail
    assert result.text
    assert LONG_ANSWER.startswith(result.text)
    assert len(result.text) < len(LONG_ANSWER)


def _newer(litellm: LiteLLM, fmt: str, model: str) -> ProbeSpec:
    base = "/v1" if fmt == "responses" else "/v1beta"
    return ProbeSpec(
        base_url=litellm.server.origin + base,
        format=fmt,
        model=model,
        api_key=LITELLM_KEY,
        user_prompt=PROMPT,
        max_tokens=256,
        total_timeout_s=30.0,
        first_token_timeout_s=20.0,
    )


@pytest.mark.parametrize(
    ("fmt", "model"),
    [
        # OpenAI Responses in, from an Anthropic upstream: the gateway's own bridge writes the
        # Responses events (its "litellm_completion_transformation"), then `data: [DONE]`.
        ("responses", "up-claude"),
        # Gemini native in (its /v1beta/models/M:streamGenerateContent), from an OpenAI or an
        # Anthropic upstream: the gateway writes the Gemini chunks.
        ("gemini", "up-openai"),
        ("gemini", "up-claude"),
    ],
)
def test_the_newer_formats_from_the_gateway(litellm: LiteLLM, fmt: str, model: str) -> None:
    result = run_one(_newer(litellm, fmt, model))
    assert not ok_fields(result), ok_fields(result)
    assert result.text == ANSWER
    assert result.output_tokens is not None
    assert result.input_tokens is not None


def test_a_responses_mock_model_fails_the_gateway_on_a_stream_request(litellm: LiteLLM) -> None:
    """LiteLLM 1.81.13's /v1/responses returns a mock_response model's whole response object
    before streaming (responses/main.py), and its streaming path then iterates it: HTTP 500
    "'async for' requires an object with __aiter__ method, got ResponsesAPIResponse" (its bug).
    The engine reports what it was told, with the gateway's words."""
    result = run_one(_newer(litellm, "responses", "gpt-4o-mock"))
    assert (result.outcome, result.error_kind) == ("error", "http_5xx"), result.error_detail
    assert "HTTP 500" in result.error_detail
    assert "ResponsesAPIResponse" in result.error_detail
    assert LITELLM_KEY not in result.error_detail
