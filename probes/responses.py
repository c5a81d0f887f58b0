"""OpenAI Responses (`POST {base}/responses`), streamed.

What the format relies on, from OpenAI's API reference ("Streaming events") and its SDKs'
types:
- The stream is typed SSE events (`event:` names the type, the data repeats it in `type`),
  each with a `sequence_number` counting up from 0 by one. There is no `[DONE]`: it ends with
  one terminal event, `response.completed`, `response.incomplete` or `response.failed`,
  carrying the whole response object (model, service_tier, usage); a top-level `error` event
  can also arrive (`{"type": "error", "code", "message", "param"}`).
- Lifecycle events (`response.created`, `response.in_progress`, `...output_item.added`,
  `...content_part.added`, `...done` events) carry no generated output: TTFT is the first
  non-empty delta of `response.output_text.delta`, `response.reasoning_text.delta`,
  `response.reasoning_summary_text.delta`, `response.refusal.delta` or
  `response.function_call_arguments.delta`; the answer starts at the first output text,
  refusal or function-call delta.
- Usage comes only on the terminal event: `input_tokens` (cached ones included, counted in
  `input_tokens_details.cached_tokens`), `output_tokens` (reasoning included, counted in
  `output_tokens_details.reasoning_tokens`).
- `max_output_tokens` bounds reasoning plus answer. `store: false` keeps the probe out of the
  account's stored responses; `stream_options.include_obfuscation: false` turns off the random
  padding added to every delta (bytes that are not output).
- `response.incomplete` with `incomplete_details.reason` "max_output_tokens" means the
  route's token limit was too small for this model (ours to fix); a failed response's
  `error.code` says whose failure it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from probes.errors import InvalidSpec, Kind, MalformedStream
from probes.model import MAX_TOKENS, ProbeSpec
from probes.prompts import Prompt
from probes.sse import Event
from probes.wire import (
    ANSWER,
    DONE,
    ERROR,
    FINISH,
    REASONING,
    TOOL,
    USAGE,
    Piece,
    Served,
    Usage,
    WireFormat,
    _label,
    count,
    merge_extra,
)

# Deltas that carry generated output, and which kind each is.
_DELTAS = {
    "response.output_text.delta": ANSWER,
    "response.refusal.delta": ANSWER,
    "response.function_call_arguments.delta": TOOL,
    "response.reasoning_text.delta": REASONING,
    "response.reasoning_summary_text.delta": REASONING,
}
_TERMINAL = ("response.completed", "response.incomplete", "response.failed")
# Error codes (of an `error` event or a failed response) with a kind of their own: a rate
# limit is one wherever it arrives; any other error after the stream began is stream_error.
_ERROR_KINDS = {"rate_limit_exceeded": Kind.HTTP_429}
PROTECTED = frozenset({"model", "input", "instructions", "stream", "stream_options", "store"})


class OpenAIResponses(WireFormat):
    name = "responses"
    label = "OpenAI Responses"
    path = "/responses"

    def headers(self, spec: ProbeSpec) -> dict[str, str]:
        return {"authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}

    def body(self, spec: ProbeSpec, prompt: Prompt, stream_options: bool) -> dict[str, Any]:
        if spec.token_limit_param != MAX_TOKENS:
            raise InvalidSpec(
                "Responses takes its output cap as max_output_tokens (leave the token-limit "
                "parameter at max_tokens)"
            )
        if spec.thinking_budget_tokens is not None:
            raise InvalidSpec(
                "thinking_budget_tokens is an Anthropic or Gemini setting; Responses takes "
                "reasoning_effort"
            )
        if prompt.system:
            instructions = prompt.head + prompt.system
            user = prompt.document + prompt.question
        else:
            instructions, user = "", prompt.head + prompt.document + prompt.question
        body: dict[str, Any] = {"model": spec.model}
        if instructions:
            body["instructions"] = instructions
        body["input"] = [{"role": "user", "content": user}]
        body["max_output_tokens"] = spec.max_tokens
        body["stream"] = True
        body["stream_options"] = {"include_obfuscation": False}
        body["store"] = False
        if spec.reasoning_effort:
            body["reasoning"] = {"effort": spec.reasoning_effort}
        if spec.service_tier:
            body["service_tier"] = spec.service_tier
        if spec.temperature is not None:
            body["temperature"] = spec.temperature
        return merge_extra(body, spec, PROTECTED)

    def reader(self) -> Callable[[Event], list[Piece]]:
        return _Reader(self).parse

    def parse(self, event: Event) -> list[Piece]:
        """One event, without the stream's sequence check (reader() adds it)."""
        return self._pieces(self._json(event.data), event.event)

    def _pieces(self, data: dict[str, Any], name: str) -> list[Piece]:
        kind = str(data.get("type") or name)
        delta_kind = _DELTAS.get(kind)
        if delta_kind is not None:
            delta = data.get("delta")
            if not isinstance(delta, str):
                raise MalformedStream(f"{kind} without a string delta")
            return [Piece(delta_kind, delta)] if delta else []
        if kind == "error":
            code = data.get("code")
            return [_error(data.get("message"), code, "the provider sent an error event")]
        if kind not in _TERMINAL:
            return []  # lifecycle events, `.done` events and future events
        response = data.get("response")
        if not isinstance(response, dict):
            raise MalformedStream(f"{kind} without a response object")
        pieces = []
        usage = response.get("usage")
        if isinstance(usage, dict):
            pieces.append(Piece(USAGE, usage=usage, meta=response))
        if kind == "response.completed":
            return [*pieces, Piece(FINISH, "completed", meta=response), Piece(DONE)]
        if kind == "response.failed":
            err = response.get("error")
            err = err if isinstance(err, dict) else {}
            return [*pieces, _error(err.get("message"), err.get("code"), "the response failed")]
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        if reason == "max_output_tokens":
            pieces.append(
                Piece(
                    ERROR,
                    "the response was cut at max_output_tokens, which bounds reasoning and "
                    "answer together: the route's output cap is too small for this model",
                    error_kind=Kind.CONFIG,
                )
            )
            return pieces
        return [*pieces, Piece(ERROR, f"the response is incomplete ({reason or 'no reason'})")]

    def usage(self, raw: dict[str, Any]) -> Usage:
        inputs, outputs = raw.get("input_tokens_details"), raw.get("output_tokens_details")
        return Usage(
            input_tokens=count(raw.get("input_tokens")),
            cached_tokens=count(inputs.get("cached_tokens")) if isinstance(inputs, dict) else None,
            output_tokens=count(raw.get("output_tokens")),
            reasoning_tokens=(
                count(outputs.get("reasoning_tokens")) if isinstance(outputs, dict) else None
            ),
        )

    def served(self, metas: Sequence[Mapping[str, Any]]) -> Served:
        served = super().served(metas)
        for meta in metas:  # the response object's id is resp_...: the request id
            served.response_id = served.response_id or _label(meta.get("id"), 100)
        return served


def _error(message: Any, code: Any, default: str) -> Piece:
    text = message if isinstance(message, str) and message else default
    if isinstance(code, str) and code:
        text = f"{text} ({code})"
    kind = _ERROR_KINDS.get(code, Kind.STREAM_ERROR) if isinstance(code, str) else ""
    return Piece(ERROR, text, error_kind=kind)


class _Reader:
    """Parses one response's events, checking their sequence numbers: a gap means events were
    lost (a proxy dropped them), and what was measured from the rest is not the stream."""

    def __init__(self, fmt: OpenAIResponses) -> None:
        self.fmt = fmt
        self.expected: int | None = None  # the first number seen starts the count

    def parse(self, event: Event) -> list[Piece]:
        if event.data.strip() == "[DONE]":
            # Chat Completions' sentinel, which gateways append to Responses streams too
            # (LiteLLM 1.81's bridge does); the openai SDK's stream stops at it. It carries no
            # output: whether the response ended is for its terminal event to say.
            return []
        data = self.fmt._json(event.data)
        number = data.get("sequence_number")
        if isinstance(number, int) and not isinstance(number, bool):
            if self.expected is not None and number != self.expected:
                raise MalformedStream(
                    f"sequence_number {number} where {self.expected} was due: events were lost "
                    "or reordered"
                )
            self.expected = number + 1
        return self.fmt._pieces(data, event.event)
