"""The two wire formats the simulator speaks, one class each, in a registry.

A format knows its endpoint path, how its clients send the API key, its error shape, and how to
render a planned response: whole (JSON) or as a stream of SSE frames. Streams are produced as
`Step`s: (target send time or None for "right after the previous one", bytes, kind). Token frames
are pre-rendered from byte templates: one streamed token costs a few byte concatenations.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

from simulator.config import Provider
from simulator.generation import Plan

# Step kinds
FRAME = 0  # bytes that carry no generated token
REASONING = 1  # a reasoning token
ANSWER = 2  # an answer token
END = 3  # finish the response normally
ABORT = 4  # break the connection (HTTP/2: reset the stream)
STALL = 5  # send nothing more; keep the connection open until the client leaves

Step = tuple[float | None, bytes, int]


class HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers = headers or []


@lru_cache(maxsize=4096)
def _js(text: str) -> bytes:
    return json.dumps(text).encode()


def _dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + _dumps(data) + b"\n\n"


@dataclass
class StreamContext:
    plan: Plan
    request_id: str
    model: str
    base_at: float  # perf_counter of request receipt; plan offsets are relative to it
    include_usage: bool
    faults: frozenset[str]

    @property
    def cut(self) -> int | None:
        """How many tokens go out before a mid-stream fault (stall, error, truncation)."""
        if self.faults & {"stall_mid", "truncated", "stream_error"}:
            return min(5, self.plan.output_tokens)
        return None

    @property
    def malformed_at(self) -> int | None:
        if "malformed_chunk" in self.faults:
            return min(3, self.plan.output_tokens - 1)
        return None

    def pieces(self) -> Iterator[tuple[int, float, str, int]]:
        """(index, target send time, text, kind) of every output token, up to the cut."""
        offsets, base = self.plan.offsets_s, self.base_at
        cut = self.cut
        i = 0
        for text in self.plan.reasoning:
            if i == cut:
                return
            yield i, base + offsets[i], text, REASONING
            i += 1
        for text in self.plan.answer:
            if i == cut:
                return
            yield i, base + offsets[i], text, ANSWER
            i += 1


class WireFormat:
    name: ClassVar[str]
    path: ClassVar[str]

    def api_key(self, headers: dict[str, str]) -> str:
        return headers.get("authorization", "").removeprefix("Bearer ").strip()

    def error_body(self, err: HttpError) -> bytes:
        raise NotImplementedError

    def prompt_text(self, body: dict[str, Any]) -> str:
        parts: list[str] = []

        def add(content: Any) -> None:
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                for item in content:
                    if isinstance(item, dict) and isinstance(item.get("text"), str):
                        parts.append(item["text"])

        add(body.get("system"))
        for message in body.get("messages") or []:
            if isinstance(message, dict):
                add(message.get("content"))
        return "\n".join(parts)

    def models_body(self, provider: Provider) -> bytes:
        raise NotImplementedError

    def whole_body(self, ctx: StreamContext) -> bytes:
        raise NotImplementedError

    def steps(self, ctx: StreamContext) -> Iterator[Step]:
        raise NotImplementedError

    def huge_chunk(self) -> bytes:
        raise NotImplementedError

    def _cut_steps(self, ctx: StreamContext) -> Iterator[Step]:
        if "stream_error" in ctx.faults:
            yield None, self.stream_error(), FRAME
            yield None, b"", END
        elif "stall_mid" in ctx.faults:
            yield None, b"", STALL
        else:  # truncated
            yield None, b"", ABORT

    def stream_error(self) -> bytes:
        raise NotImplementedError


class OpenAIChat(WireFormat):
    name = "openai"
    path = "/v1/chat/completions"
    _types: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        401: "invalid_request_error",
        404: "invalid_request_error",
        413: "invalid_request_error",
        429: "requests",
        500: "server_error",
        503: "server_error",
    }

    def error_body(self, err: HttpError) -> bytes:
        kind = self._types.get(err.status, "server_error")
        return _dumps(
            {"error": {"message": err.message, "type": kind, "param": None, "code": err.code}}
        )

    def models_body(self, provider: Provider) -> bytes:
        listing = [
            {"id": m, "object": "model", "created": 1767225600, "owned_by": provider.slug}
            for m in provider.models
        ]
        return _dumps({"object": "list", "data": listing})

    @staticmethod
    def usage(plan: Plan) -> dict[str, Any]:
        return {
            "prompt_tokens": plan.input_tokens,
            "completion_tokens": plan.output_tokens,
            "total_tokens": plan.input_tokens + plan.output_tokens,
            "prompt_tokens_details": {"cached_tokens": plan.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": len(plan.reasoning),
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def whole_body(self, ctx: StreamContext) -> bytes:
        plan = ctx.plan
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(plan.answer),
            "refusal": None,
        }
        if plan.reasoning:
            message["reasoning_content"] = "".join(plan.reasoning)
        data: dict[str, Any] = {
            "id": f"chatcmpl-{ctx.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": ctx.model,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": plan.finish_reason,
                }
            ],
        }
        if "no_usage" not in ctx.faults:
            data["usage"] = self.usage(plan)
        return _dumps(data)

    def steps(self, ctx: StreamContext) -> Iterator[Step]:
        plan = ctx.plan
        head = (
            b'data: {"id":"chatcmpl-'
            + ctx.request_id.encode()
            + b'","object":"chat.completion.chunk","created":'
            + str(int(time.time())).encode()
            + b',"model":'
            + _js(ctx.model)
            + b',"system_fingerprint":null,"choices":[{"index":0,"delta":'
        )
        usage_null = b',"usage":null' if ctx.include_usage else b""
        open_tail = b',"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"
        yield None, head + b'{"role":"assistant","content":"","refusal":null}' + open_tail, FRAME
        malformed_at = ctx.malformed_at
        for i, at, text, kind in ctx.pieces():
            if i == malformed_at:
                yield None, b'data: {"choices": [{"delta": {"content": "oops"\n\n', FRAME
            key = b'{"reasoning_content":' if kind == REASONING else b'{"content":'
            yield at, head + key + _js(text) + b"}" + open_tail, kind
        if ctx.cut is not None:
            yield from self._cut_steps(ctx)
            return
        final = (
            head
            + b'{},"logprobs":null,"finish_reason":'
            + _js(plan.finish_reason)
            + b"}]"
            + usage_null
            + b"}\n\n"
        )
        send_usage = "no_usage" not in ctx.faults
        usage = b""
        if send_usage and (ctx.include_usage or "usage_after_done" in ctx.faults):
            usage = (
                b'data: {"id":"chatcmpl-'
                + ctx.request_id.encode()
                + b'","object":"chat.completion.chunk","created":'
                + str(int(time.time())).encode()
                + b',"model":'
                + _js(ctx.model)
                + b',"system_fingerprint":null,"choices":[],"usage":'
                + _dumps(self.usage(plan))
                + b"}\n\n"
            )
        if "usage_after_done" in ctx.faults:
            yield None, final + b"data: [DONE]\n\n" + usage, FRAME
        else:
            yield None, final + usage + b"data: [DONE]\n\n", FRAME
        yield None, b"", END

    def huge_chunk(self) -> bytes:
        return (
            b'data: {"choices":[{"index":0,"delta":{"content":' + _js(" the" * 8000) + b"}}]}\n\n"
        )

    def stream_error(self) -> bytes:
        return (
            b"data: "
            + _dumps(
                {
                    "error": {
                        "message": "The server had an error while processing your request.",
                        "type": "server_error",
                        "param": None,
                        "code": None,
                    }
                }
            )
            + b"\n\n"
        )


class AnthropicMessages(WireFormat):
    name = "anthropic"
    path = "/v1/messages"
    _types: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        503: "overloaded_error",
        529: "overloaded_error",
    }

    def api_key(self, headers: dict[str, str]) -> str:
        # The API takes x-api-key; the SDKs can also send a bearer token: accept both.
        return headers.get("x-api-key", "") or super().api_key(headers)

    def error_body(self, err: HttpError) -> bytes:
        kind = self._types.get(err.status, "api_error")
        return _dumps({"type": "error", "error": {"type": kind, "message": err.message}})

    def models_body(self, provider: Provider) -> bytes:
        data = [
            {
                "type": "model",
                "id": m,
                "display_name": f"{m} (simulated)",
                "created_at": "2026-01-01T00:00:00Z",
            }
            for m in provider.models
        ]
        ids = list(provider.models)
        return _dumps(
            {
                "data": data,
                "has_more": False,
                "first_id": ids[0] if ids else None,
                "last_id": ids[-1] if ids else None,
            }
        )

    @staticmethod
    def usage(plan: Plan, output_tokens: int) -> dict[str, Any]:
        # input_tokens excludes cache reads, as in Anthropic's API. The simulator's cache is
        # automatic (no cache_control breakpoints), so nothing is reported as cache creation.
        return {
            "input_tokens": plan.input_tokens - plan.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": plan.cached_tokens,
            "output_tokens": output_tokens,
        }

    @staticmethod
    def _stop_reason(plan: Plan) -> str:
        return "end_turn" if plan.finish_reason == "stop" else "max_tokens"

    def whole_body(self, ctx: StreamContext) -> bytes:
        plan = ctx.plan
        content: list[dict[str, Any]] = []
        if plan.reasoning:
            content.append(
                {
                    "type": "thinking",
                    "thinking": "".join(plan.reasoning),
                    "signature": f"sim-{ctx.request_id}",
                }
            )
        content.append({"type": "text", "text": "".join(plan.answer)})
        data: dict[str, Any] = {
            "id": f"msg_{ctx.request_id}",
            "type": "message",
            "role": "assistant",
            "model": ctx.model,
            "content": content,
            "stop_reason": self._stop_reason(plan),
            "stop_sequence": None,
        }
        if "no_usage" not in ctx.faults:
            data["usage"] = self.usage(plan, plan.output_tokens)
        return _dumps(data)

    def steps(self, ctx: StreamContext) -> Iterator[Step]:
        plan = ctx.plan
        send_usage = "no_usage" not in ctx.faults
        message: dict[str, Any] = {
            "id": f"msg_{ctx.request_id}",
            "type": "message",
            "role": "assistant",
            "model": ctx.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
        }
        if send_usage:
            message["usage"] = self.usage(plan, 1)
        opening = _sse("message_start", {"type": "message_start", "message": message})
        ping = b'event: ping\ndata: {"type":"ping"}\n\n'
        if plan.reasoning:
            opening += self._block_start(0, {"type": "thinking", "thinking": "", "signature": ""})
            opening += ping
        yield None, opening, FRAME
        index = 0
        thinking_head = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
            b'"delta":{"type":"thinking_delta","thinking":'
        )
        text_head = b""
        malformed_at = ctx.malformed_at
        for i, at, text, kind in ctx.pieces():
            before = b""
            if i == malformed_at:
                before = (
                    b"event: content_block_delta\n"
                    b'data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "oops"\n\n'
                )
            if kind == REASONING:
                yield at, before + thinking_head + _js(text) + b"}}\n\n", kind
                continue
            if not text_head:
                if plan.reasoning:
                    before += _sse(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {
                                "type": "signature_delta",
                                "signature": f"sim-{ctx.request_id}",
                            },
                        },
                    )
                    before += self._block_stop(0)
                    index = 1
                before += self._block_start(index, {"type": "text", "text": ""})
                if not plan.reasoning:
                    before += ping
                text_head = (
                    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
                    + str(index).encode()
                    + b',"delta":{"type":"text_delta","text":'
                )
            yield at, before + text_head + _js(text) + b"}}\n\n", kind
        if ctx.cut is not None:
            yield from self._cut_steps(ctx)
            return
        delta: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": self._stop_reason(plan), "stop_sequence": None},
        }
        if send_usage:
            delta["usage"] = self.usage(plan, plan.output_tokens)
        closing = (
            self._block_stop(index)
            + _sse("message_delta", delta)
            + b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
        )
        yield None, closing, FRAME
        yield None, b"", END

    @staticmethod
    def _block_start(index: int, block: dict[str, Any]) -> bytes:
        return _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": block},
        )

    @staticmethod
    def _block_stop(index: int) -> bytes:
        return _sse("content_block_stop", {"type": "content_block_stop", "index": index})

    def huge_chunk(self) -> bytes:
        return _sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": " the" * 8000},
            },
        )

    def stream_error(self) -> bytes:
        return _sse(
            "error",
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        )


FORMATS: dict[str, WireFormat] = {f.name: f for f in (OpenAIChat(), AnthropicMessages())}
