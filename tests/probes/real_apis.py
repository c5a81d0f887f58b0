"""Replies shaped as the real APIs send them, for the loopback server (tests/probes/loopback.py).

Sources: the providers' API references and the error bodies users quote in public issue
reports (openai/openai-python, Azure SDKs, langchain, litellm...):
- OpenAI reasoning models: 400 `unsupported_parameter` for max_tokens, `unsupported_value` for
  a non-default temperature (pretty-printed JSON, an `x-request-id: req_...` header); streamed
  chunks carry `model` (the dated snapshot), `service_tier`, `"usage": null` until a last
  chunk with `choices: []` and the usage, where completion_tokens includes the hidden
  reasoning reported in completion_tokens_details.reasoning_tokens; no reasoning is streamed.
- Azure OpenAI: a first chunk with `choices: []`, `model: ""` and `prompt_filter_results`;
  content chunks with `content_filter_results`; `apim-request-id` and `x-request-id` headers.
- Anthropic Messages: message_start (usage with cache fields and service_tier), ping,
  content_block_start/delta/stop, message_delta (stop_reason, output_tokens), message_stop.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tests.probes.loopback import Received, Reply, sse

OPENAI_MODEL = "o4-mini-2025-04-16"
SSE_HEADERS = [("content-type", "text/event-stream; charset=utf-8")]
# Words that are one o200k token each, with their leading space.
WORDS = [" the", " route", " is", " fast", " and", " the", " answer", " is", " short", "."]


def openai_error(status: int, message: str, param: str | None, code: str | None) -> Reply:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": code,
            }
        },
        indent=2,
    ).encode()
    return Reply(
        status,
        [("content-type", "application/json"), ("x-request-id", "req_err0123456789")],
        [(0.0, body)],
    )


MAX_TOKENS_REFUSED = (
    "Unsupported parameter: 'max_tokens' is not supported with this model. "
    "Use 'max_completion_tokens' instead."
)
TEMPERATURE_REFUSED = (
    "Unsupported value: 'temperature' does not support 0.2 with this model. "
    "Only the default (1) value is supported."
)


def _chunk(delta: dict[str, Any], finish: str | None = None, **top: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-Bx1",
        "object": "chat.completion.chunk",
        "created": 1764000000,
        "model": OPENAI_MODEL,
        "service_tier": "default",
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
        **top,
    }


def openai_reasoning(
    request: Received,
    *,
    answer_tokens: int = 50,
    hidden_reasoning: int = 2000,
    gap_s: float = 0.01,
    think_s: float = 0.2,
) -> Reply:
    """An OpenAI reasoning model: 400 for max_tokens or a non-default temperature, else
    `think_s` of silence (hidden reasoning), then `answer_tokens` one-token chunks `gap_s`
    apart, and usage billing the hidden reasoning."""
    body = request.json()
    if "max_tokens" in body:
        return openai_error(400, MAX_TOKENS_REFUSED, "max_tokens", "unsupported_parameter")
    if body.get("temperature", 1) != 1:
        return openai_error(400, TEMPERATURE_REFUSED, "temperature", "unsupported_value")
    first = _chunk({"role": "assistant", "content": "", "refusal": None})
    usage = {
        "prompt_tokens": 21,
        "completion_tokens": answer_tokens + hidden_reasoning,
        "total_tokens": 21 + answer_tokens + hidden_reasoning,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": hidden_reasoning,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    last = _chunk({}, "stop")
    final = {**_chunk({}), "choices": [], "usage": usage}
    words = [_chunk({"content": WORDS[i % len(WORDS)]}) for i in range(answer_tokens)]
    head, *content = sse(first, *words, last, final)
    chunks = [(0.0, head)]
    chunks += [
        (think_s if i == 0 else gap_s, data) for i, data in enumerate(content[:answer_tokens])
    ]
    chunks += [(0.0, data) for data in content[answer_tokens:]]
    headers = [*SSE_HEADERS, ("x-request-id", "req_5f1c0ffee0123456789")]
    return Reply(200, headers, chunks)


def azure_stream(request: Received) -> Reply:
    """Azure OpenAI: the content-filter chunk first (choices: [], model: ""), then content."""
    filters = {"hate": {"filtered": False, "severity": "safe"}}
    prompt_filter = {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": filters}],
    }
    words = []
    for text in WORDS:
        chunk = _chunk({"content": text}, model="gpt-4o-2024-11-20")
        chunk["choices"][0]["content_filter_results"] = filters
        del chunk["service_tier"]
        words.append(chunk)
    last = _chunk({}, "stop", model="gpt-4o-2024-11-20")
    del last["service_tier"]
    usage = {"prompt_tokens": 12, "completion_tokens": len(WORDS), "total_tokens": 22}
    final = {**last, "choices": [], "usage": usage}
    headers = [
        *SSE_HEADERS,
        ("apim-request-id", "5d2c6f1e-azure"),
        ("x-ms-region", "Sweden Central"),
    ]
    return Reply(200, headers, [(0.001, data) for data in sse(prompt_filter, *words, last, final)])


def anthropic_event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def anthropic_stream(
    request: Received, *, thinking: Sequence[str] = (), output_tokens: int | None = None
) -> Reply:
    """A Messages stream: optional thinking deltas (a summary, when output_tokens bills more),
    then the answer words."""
    usage = {
        "input_tokens": 30,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
        "service_tier": "standard",
    }
    message = {
        "id": "msg_01XYZ",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    events = [
        anthropic_event("message_start", {"type": "message_start", "message": message}),
        anthropic_event("ping", {"type": "ping"}),
    ]
    index = 0
    if thinking:
        events.append(
            anthropic_event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "thinking", "thinking": ""},
                },
            )
        )
        for text in thinking:
            events.append(
                anthropic_event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "thinking_delta", "thinking": text},
                    },
                )
            )
        events.append(
            anthropic_event("content_block_stop", {"type": "content_block_stop", "index": 0})
        )
        index = 1
    events.append(
        anthropic_event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "text", "text": ""},
            },
        )
    )
    for text in WORDS:
        events.append(
            anthropic_event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": text},
                },
            )
        )
    events.append(
        anthropic_event("content_block_stop", {"type": "content_block_stop", "index": index})
    )
    billed = output_tokens if output_tokens is not None else len(WORDS)
    events.append(
        anthropic_event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": billed},
            },
        )
    )
    events.append(anthropic_event("message_stop", {"type": "message_stop"}))
    headers = [*SSE_HEADERS, ("request-id", "req_011CAnthropic")]
    return Reply(200, headers, [(0.002, e) for e in events])
