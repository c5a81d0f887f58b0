"""Anthropic Messages (POST /<slug>/v1/messages), as the simulator speaks it: thinking blocks
and prompt caching at cache_control breakpoints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, ClassVar

from simulator.config import Provider
from simulator.generation import Plan
from simulator.wire import (
    END,
    FRAME,
    REASONING,
    HttpError,
    Limits,
    Prompt,
    Step,
    StreamContext,
    WireFormat,
    _dumps,
    _js,
    _sse,
    rfc3339,
)

MAX_CACHE_BREAKPOINTS = 4
CACHE_TTLS_S = {"5m": 300.0, "1h": 3600.0}


class AnthropicMessages(WireFormat):
    name = "anthropic"
    path = "/v1/messages"
    explicit_cache = True
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

    def unauthorized(self) -> HttpError:
        return HttpError(401, "invalid x-api-key")

    def check_headers(self, headers: dict[str, str]) -> None:
        if not headers.get("anthropic-version"):
            raise HttpError(400, "anthropic-version: header is required")

    def model_not_found(self, model: object) -> HttpError:
        return HttpError(404, f"model: {model}")

    def invalid_body(self, detail: str) -> HttpError:
        return HttpError(400, f"The request body is not valid JSON: {detail}")

    def error_body(self, err: HttpError) -> bytes:
        if err.body is not None:
            return _dumps(err.body)
        kind = self._types.get(err.status, "api_error")
        return _dumps({"type": "error", "error": {"type": kind, "message": err.message}})

    def limit_headers(self, limits: Limits) -> list[tuple[str, str]]:
        # The simulator enforces one token budget: input + max_tokens per minute. tokens-*
        # is that budget; input-tokens-* and output-tokens-* show each side's share of it.
        usage, tokens_limit = limits.usage, limits.tokens_limit
        out = [
            ("requests", limits.requests_limit, usage.requests),
            ("tokens", tokens_limit, usage.tokens),
            ("input-tokens", tokens_limit, usage.input_tokens),
            ("output-tokens", tokens_limit, usage.output_tokens),
        ]
        headers = []
        for name, limit, used in out:
            headers += [
                (f"anthropic-ratelimit-{name}-limit", limits.count(limit)),
                (f"anthropic-ratelimit-{name}-remaining", limits.count(limit - used)),
                (f"anthropic-ratelimit-{name}-reset", rfc3339(limits.reset_s(used, limit))),
            ]
        return headers

    def response_headers(self, request_id: str) -> list[tuple[str, str]]:
        return [("request-id", request_id)]  # probes may read this one first

    def prompt(self, body: dict[str, Any]) -> Prompt:
        """Blocks in the order the API renders them: tools, system, messages. A block with
        `cache_control` is a breakpoint; a top-level `cache_control` (automatic caching) puts
        one on the last block."""
        parts: list[str] = []
        breakpoints: list[tuple[int, float]] = []

        def block(text: str, item: Any) -> None:
            parts.append(text)
            if isinstance(item, dict) and item.get("cache_control") is not None:
                breakpoints.append((len(parts) - 1, _cache_ttl(item["cache_control"])))

        for tool in body.get("tools") or []:
            if isinstance(tool, dict):
                rest = {k: v for k, v in tool.items() if k != "cache_control"}
                block(json.dumps(rest, sort_keys=True), tool)
        contents = [body.get("system")]
        contents += [m.get("content") for m in body.get("messages") or [] if isinstance(m, dict)]
        for content in contents:
            if isinstance(content, str):
                block(content, None)
            elif isinstance(content, list):
                for item in content:
                    text = item.get("text") if isinstance(item, dict) else None
                    block(text if isinstance(text, str) else "", item)
        if body.get("cache_control") is not None and parts:
            automatic = (len(parts) - 1, _cache_ttl(body["cache_control"]))
            if automatic[0] not in {b for b, _ in breakpoints}:
                breakpoints.append(automatic)
        if len(breakpoints) > MAX_CACHE_BREAKPOINTS:
            raise HttpError(
                400,
                f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be "
                f"provided. Found {len(breakpoints)}.",
            )
        return Prompt(parts, breakpoints)

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
        # input_tokens excludes cache reads and cache writes, as in Anthropic's API.
        return {
            "input_tokens": plan.input_tokens - plan.cached_tokens - plan.cache_creation_tokens,
            "cache_creation_input_tokens": plan.cache_creation_tokens,
            "cache_read_input_tokens": plan.cached_tokens,
            "output_tokens": output_tokens,
        }

    @staticmethod
    def _stop_reason(plan: Plan) -> str:
        return "end_turn" if plan.finish_reason == "stop" else "max_tokens"

    def whole_body(self, ctx: StreamContext) -> bytes:
        plan = ctx.plan
        content: list[dict[str, Any]] = []
        if ctx.thinking:
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
        if ctx.thinking:
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
                before, index = before + self._close_thinking(ctx), int(ctx.thinking)
                before += self._block_start(index, {"type": "text", "text": ""})
                if not ctx.thinking:
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
        # With no answer token at all, the thinking block still has to close.
        closing = self._block_stop(index) if text_head else self._close_thinking(ctx)
        closing += (
            _sse("message_delta", delta) + b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
        )
        end_at = ctx.base_at + plan.end_s if not plan.answer else None
        yield end_at, closing, FRAME
        yield None, b"", END

    def _close_thinking(self, ctx: StreamContext) -> bytes:
        if not ctx.thinking:
            return b""
        signature = _sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "signature_delta", "signature": f"sim-{ctx.request_id}"},
            },
        )
        return signature + self._block_stop(0)

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


def _cache_ttl(cache_control: Any) -> float:
    if not isinstance(cache_control, dict) or cache_control.get("type") != "ephemeral":
        raise HttpError(400, "cache_control.type: Input should be 'ephemeral'")
    ttl = cache_control.get("ttl", "5m")
    if ttl not in CACHE_TTLS_S:
        raise HttpError(400, "cache_control.ttl: Input should be '5m' or '1h'")
    return CACHE_TTLS_S[ttl]
