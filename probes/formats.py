"""Wire formats: one class per provider dialect, in a registry (no if/elif on the format).

A format builds the request (URL, headers, body object, from the spec's request settings) and
turns each SSE event into classified pieces. Classification is what the timing loop needs:
which events carry generated output (reasoning or answer), usage, an error, or the end of the
stream. After the stream, it reads usage, what served the probe (model, id, tier), and, for an
error response, whether the provider refused one of the parameters we sent.

What the formats rely on, from the providers' documentation and their public issue trackers:
- OpenAI reasoning models (o-series, GPT-5) refuse `max_tokens` with 400
  `{"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this
  model. Use 'max_completion_tokens' instead.", "type": "invalid_request_error", "param":
  "max_tokens", "code": "unsupported_parameter"}}`, and a non-default temperature with
  `"code": "unsupported_value"`, `"param": "temperature"`. They never stream their reasoning:
  it is billed in `usage.completion_tokens` and reported in
  `completion_tokens_details.reasoning_tokens`. Chunks carry `model` and `service_tier` (the
  tier actually used, which may differ from the one asked for).
- OpenAI-compatible servers that do stream reasoning use `delta.reasoning_content` (DeepSeek,
  vLLM) or `delta.reasoning` (OpenRouter); some reject unknown arguments with
  "Unrecognized request argument supplied: X" or pydantic's "X: Extra inputs are not
  permitted".
- Azure OpenAI: `{base}/chat/completions?api-version=V` with an `api-key` header; the first
  chunk may be `{"choices": [], "model": "", "prompt_filter_results": [...]}` and later ones
  may carry only `content_filter_results` (no delta).
- Anthropic Messages: prompt caching only where a block says
  `"cache_control": {"type": "ephemeral"}` (everything up to that block is the cached prefix;
  prompts under 1,024 tokens, more for some models, are not cached); extended thinking with
  `"thinking": {"type": "enabled", "budget_tokens": N}`, N >= 1024 and below max_tokens,
  streamed as `thinking_delta`s (Claude 4 models stream a summary but bill the full thinking in
  `output_tokens`); `service_tier` in usage; 400s say `"field: message"`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from probes.bedrock import BedrockConverse
from probes.errors import InvalidSpec, MalformedStream, UnknownWireFormat
from probes.gemini import GeminiNative
from probes.model import MAX_TOKENS, TOKEN_LIMIT_PARAMS, ProbeSpec
from probes.prompts import Prompt
from probes.responses import OpenAIResponses
from probes.sse import Event

# The shared vocabulary, re-exported: the engine, figures and tests read it from here.
from probes.wire import (
    ANSWER,
    DONE,
    ERROR,
    FINISH,
    MAX_COUNT,
    PROTECTED_BODY_KEYS,
    REASONING,
    TOOL,
    USAGE,
    Framing,
    Piece,
    Served,
    Usage,
    WireFormat,
    _label,
    count,
    error_message,
    merge_extra,
)

__all__ = [
    "ANSWER",
    "DONE",
    "ERROR",
    "FINISH",
    "MAX_COUNT",
    "PROTECTED_BODY_KEYS",
    "REASONING",
    "TOOL",
    "USAGE",
    "WIRE_FORMATS",
    "Framing",
    "MalformedStream",
    "Piece",
    "Served",
    "Usage",
    "WireFormat",
    "count",
    "error_message",
    "merge_extra",
    "wire_format",
]


class OpenAIChat(WireFormat):
    """OpenAI Chat Completions and OpenAI-compatible servers (vLLM, llama.cpp, Ollama...)."""

    name = "openai"
    label = "OpenAI Chat Completions"
    path = "/chat/completions"
    sends_stream_options = True

    def headers(self, spec: ProbeSpec) -> dict[str, str]:
        return {"authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}

    def body(self, spec: ProbeSpec, prompt: Prompt, stream_options: bool) -> dict[str, Any]:
        if spec.token_limit_param not in TOKEN_LIMIT_PARAMS:
            raise InvalidSpec(
                f"unknown token-limit parameter {spec.token_limit_param!r} "
                f"(one of {', '.join(TOKEN_LIMIT_PARAMS)})"
            )
        if spec.thinking_budget_tokens is not None:
            raise InvalidSpec(
                "thinking_budget_tokens is an Anthropic setting; OpenAI formats take "
                "reasoning_effort"
            )
        messages = []
        if prompt.system:
            messages.append({"role": "system", "content": prompt.head + prompt.system})
            user = prompt.document + prompt.question
        else:
            user = prompt.head + prompt.document + prompt.question
        messages.append({"role": "user", "content": user})
        body: dict[str, Any] = {
            "model": spec.model,
            "messages": messages,
            spec.token_limit_param: spec.max_tokens,
            "stream": True,
        }
        if stream_options:
            body["stream_options"] = {"include_usage": True}
        if spec.reasoning_effort:
            body["reasoning_effort"] = spec.reasoning_effort
        if spec.service_tier:
            body["service_tier"] = spec.service_tier
        if spec.temperature is not None:
            body["temperature"] = spec.temperature
        return merge_extra(body, spec)

    def parse(self, event: Event) -> list[Piece]:
        raw = event.data
        if not raw.startswith("{") and raw.strip() == "[DONE]":
            return [Piece(DONE)]
        data = self._json(raw)
        if data.get("error"):
            err = data["error"]
            message = err.get("message", "") if isinstance(err, dict) else str(err)
            return [Piece(ERROR, text=str(message))]
        pieces: list[Piece] = []
        choices = data.get("choices") or []
        if not isinstance(choices, list):
            raise MalformedStream("choices is not a list")
        for choice in choices:
            if not isinstance(choice, dict):
                raise MalformedStream("a choice is not an object")
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise MalformedStream("delta is not an object")
            if delta:  # every chunk but the last has one: each key looked up once
                value = delta.get("reasoning_content")
                if value and isinstance(value, str):
                    pieces.append(Piece(REASONING, value))
                value = delta.get("reasoning")
                if value and isinstance(value, str):
                    pieces.append(Piece(REASONING, value))
                value = delta.get("content")
                if value and isinstance(value, str):
                    pieces.append(Piece(ANSWER, value))
                value = delta.get("tool_calls")
                if value:
                    pieces.append(Piece(TOOL, json.dumps(value)))
            finish = choice.get("finish_reason")
            if finish:
                pieces.append(Piece(FINISH, str(finish), meta=data))
        usage = data.get("usage")
        if isinstance(usage, dict):
            pieces.append(Piece(USAGE, usage=usage, meta=data))
        return pieces

    def usage(self, raw: dict[str, Any]) -> Usage:
        details = raw.get("prompt_tokens_details")
        completion = raw.get("completion_tokens_details")
        cached = count(details.get("cached_tokens")) if isinstance(details, dict) else None
        if cached is None:
            # DeepSeek reports its cache hits in a field of its own (its context caching guide).
            cached = count(raw.get("prompt_cache_hit_tokens"))
        return Usage(
            input_tokens=count(raw.get("prompt_tokens")),
            cached_tokens=cached,
            output_tokens=count(raw.get("completion_tokens")),
            reasoning_tokens=(
                count(completion.get("reasoning_tokens")) if isinstance(completion, dict) else None
            ),
        )


class AzureOpenAIChat(OpenAIChat):
    """Azure OpenAI: the OpenAI body at a deployment URL, keyed by an `api-key` header. The
    deployment names the model; `model` is sent all the same (Azure ignores it)."""

    name = "azure"
    label = "Azure OpenAI (deployment URL, api-key header)"

    def url(self, spec: ProbeSpec) -> str:
        url = spec.base_url.rstrip("/") + self.path
        return f"{url}?api-version={quote(spec.api_version)}" if spec.api_version else url

    def headers(self, spec: ProbeSpec) -> dict[str, str]:
        return {"api-key": spec.api_key} if spec.api_key else {}


class AnthropicMessages(WireFormat):
    name = "anthropic"
    label = "Anthropic Messages"
    path = "/v1/messages"

    def headers(self, spec: ProbeSpec) -> dict[str, str]:
        headers = {"anthropic-version": "2023-06-01"}
        if spec.api_key:
            headers["x-api-key"] = spec.api_key
        return headers

    def body(self, spec: ProbeSpec, prompt: Prompt, stream_options: bool) -> dict[str, Any]:
        if spec.token_limit_param != MAX_TOKENS:
            raise InvalidSpec("Anthropic Messages takes max_tokens only")
        if spec.reasoning_effort:
            raise InvalidSpec(
                "reasoning_effort is an OpenAI setting; Anthropic takes thinking_budget_tokens"
            )
        body: dict[str, Any] = {
            "model": spec.model,
            "max_tokens": spec.max_tokens,
            "messages": [{"role": "user", "content": prompt.question}],
            "stream": True,
        }
        # The stable prefix (system prompt, then the padding) is one system block; marked for
        # caching unless the probe is meant to miss every cache.
        parts = [p for p in (prompt.system, prompt.document.rstrip()) if p]
        stable = "\n\n".join(parts)
        if prompt.head or stable:
            block: dict[str, Any] = {"type": "text", "text": prompt.head + stable}
            if stable and not spec.fresh_prefix:
                block["cache_control"] = {"type": "ephemeral"}
            body["system"] = [block]
        if spec.thinking_budget_tokens is not None:
            if spec.thinking_budget_tokens >= spec.max_tokens:
                raise InvalidSpec(
                    f"max_tokens ({spec.max_tokens}) must exceed thinking_budget_tokens "
                    f"({spec.thinking_budget_tokens}): thinking counts within max_tokens"
                )
            body["thinking"] = {"type": "enabled", "budget_tokens": spec.thinking_budget_tokens}
        if spec.service_tier:
            body["service_tier"] = spec.service_tier
        if spec.temperature is not None:
            body["temperature"] = spec.temperature
        return merge_extra(body, spec)

    def parse(self, event: Event) -> list[Piece]:
        kind = event.event
        if kind == "ping":
            return []
        data = self._json(event.data)
        kind = kind or str(data.get("type", ""))
        if kind == "error":
            err = data.get("error") or {}
            return [Piece(ERROR, text=str(err.get("message", "")) if isinstance(err, dict) else "")]
        if kind == "message_start":
            message = data.get("message")
            if not isinstance(message, dict):
                raise MalformedStream("message_start without a message")
            usage = message.get("usage")
            return [Piece(USAGE, usage=usage if isinstance(usage, dict) else None, meta=message)]
        if kind == "content_block_delta":
            delta = data.get("delta")
            if not isinstance(delta, dict):
                raise MalformedStream("content_block_delta without a delta")
            dtype = delta.get("type")
            if dtype == "text_delta":
                return [Piece(ANSWER, str(delta.get("text", "")))] if delta.get("text") else []
            if dtype == "thinking_delta":
                return (
                    [Piece(REASONING, str(delta.get("thinking", "")))]
                    if delta.get("thinking")
                    else []
                )
            if dtype == "input_json_delta":
                return [Piece(TOOL, str(delta.get("partial_json", "")))]
            return []
        if kind == "message_delta":
            pieces = []
            usage = data.get("usage")
            if isinstance(usage, dict):
                pieces.append(Piece(USAGE, usage=usage))
            delta = data.get("delta")
            stop = delta.get("stop_reason") if isinstance(delta, dict) else None
            if stop:
                pieces.append(Piece(FINISH, str(stop)))
            return pieces
        if kind == "message_stop":
            return [Piece(DONE)]
        return []  # content_block_start/stop and unknown future events

    def usage(self, raw: dict[str, Any]) -> Usage:
        read = count(raw.get("cache_read_input_tokens"))
        created = count(raw.get("cache_creation_input_tokens")) or 0
        uncached = count(raw.get("input_tokens"))
        total = None if uncached is None else count(uncached + (read or 0) + created)
        return Usage(
            input_tokens=total,
            cached_tokens=read,
            output_tokens=count(raw.get("output_tokens")),
            service_tier=_label(raw.get("service_tier"), 30),
        )

    def served(self, metas: Sequence[Mapping[str, Any]]) -> Served:
        served = super().served(metas)
        for meta in metas:  # the tier is in message_start's usage
            usage = meta.get("usage")
            if not served.service_tier and isinstance(usage, dict):
                served.service_tier = _label(usage.get("service_tier"), 30)
        return served


# In the admin's order (its choices, migration 0028): the registry is the one list of formats.
_ALL: tuple[WireFormat, ...] = (
    OpenAIChat(),
    AnthropicMessages(),
    AzureOpenAIChat(),
    OpenAIResponses(),
    GeminiNative(),
    BedrockConverse(),
)
WIRE_FORMATS: dict[str, WireFormat] = {f.name: f for f in _ALL}


def wire_format(name: str) -> WireFormat:
    fmt = WIRE_FORMATS.get(name)
    if fmt is None:
        raise UnknownWireFormat(
            f"unknown wire format {name!r} (one of {', '.join(sorted(WIRE_FORMATS))})"
        )
    return fmt
