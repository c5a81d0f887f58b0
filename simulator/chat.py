"""OpenAI Chat Completions (POST /<slug>/v1/chat/completions), as the simulator speaks it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from simulator.config import Provider
from simulator.generation import Plan
from simulator.wire import (
    END,
    FRAME,
    REASONING,
    HttpError,
    Limits,
    Step,
    StreamContext,
    WireFormat,
    _dumps,
    _js,
    go_duration,
)


@dataclass(slots=True)
class Frames:
    """The byte templates of one OpenAI-style stream: a token chunk is before + delta + after."""

    opening: bytes  # before the first token (role chunk; Azure: its prompt filter chunk first)
    before: bytes
    after: bytes
    final: bytes  # the chunk carrying finish_reason
    usage_head: bytes  # the usage chunk (choices: []) is usage_head + usage + usage_tail
    usage_tail: bytes


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

    def invalid_body(self, detail: str) -> HttpError:
        return HttpError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
            "but what was sent was not valid JSON. If you have trouble figuring out how to fix "
            "this, please contact us through our help center at help.openai.com.)",
        )

    def error_body(self, err: HttpError) -> bytes:
        if err.body is not None:
            return _dumps(err.body)
        kind = self._types.get(err.status, "server_error")
        return _dumps(
            {"error": {"message": err.message, "type": kind, "param": err.param, "code": err.code}}
        )

    def limit_headers(self, limits: Limits) -> list[tuple[str, str]]:
        usage = limits.usage
        return [
            ("x-ratelimit-limit-requests", limits.count(limits.requests_limit)),
            ("x-ratelimit-limit-tokens", limits.count(limits.tokens_limit)),
            (
                "x-ratelimit-remaining-requests",
                limits.count(limits.requests_limit - usage.requests),
            ),
            ("x-ratelimit-remaining-tokens", limits.count(limits.tokens_limit - usage.tokens)),
            (
                "x-ratelimit-reset-requests",
                go_duration(limits.reset_s(usage.requests, limits.requests_limit)),
            ),
            (
                "x-ratelimit-reset-tokens",
                go_duration(limits.reset_s(usage.tokens, limits.tokens_limit)),
            ),
        ]

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
                "reasoning_tokens": plan.reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def _choice(self, ctx: StreamContext) -> dict[str, Any]:
        plan = ctx.plan
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(plan.answer),
            "refusal": None,
        }
        if plan.reasoning:
            message[ctx.reasoning_key] = "".join(plan.reasoning)
        return {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": plan.finish_reason,
        }

    def whole_body(self, ctx: StreamContext) -> bytes:
        data: dict[str, Any] = {
            "id": f"chatcmpl-{ctx.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": ctx.model,
        }
        if ctx.plan.service_tier is not None:
            data["service_tier"] = ctx.plan.service_tier
        data["system_fingerprint"] = None
        data["choices"] = [self._choice(ctx)]
        if "no_usage" not in ctx.faults:
            data["usage"] = self.usage(ctx.plan)
        return _dumps(data)

    def _frames(self, ctx: StreamContext) -> Frames:
        tier = b""
        if ctx.plan.service_tier is not None:
            tier = b'"service_tier":' + _js(ctx.plan.service_tier) + b","
        head = (
            b'data: {"id":"chatcmpl-'
            + ctx.request_id.encode()
            + b'","object":"chat.completion.chunk","created":'
            + str(int(time.time())).encode()
            + b',"model":'
            + _js(ctx.model)
            + b","
            + tier
            + b'"system_fingerprint":null,'
        )
        before = head + b'"choices":[{"index":0,"delta":'
        usage_null = b',"usage":null' if ctx.include_usage else b""
        after = b',"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"
        final = (
            before
            + b'{},"logprobs":null,"finish_reason":'
            + _js(ctx.plan.finish_reason)
            + b"}]"
            + usage_null
            + b"}\n\n"
        )
        return Frames(
            opening=before + b'{"role":"assistant","content":"","refusal":null}' + after,
            before=before,
            after=after,
            final=final,
            usage_head=head + b'"choices":[],"usage":',
            usage_tail=b"}\n\n",
        )

    def steps(self, ctx: StreamContext) -> Iterator[Step]:
        frames = self._frames(ctx)
        yield from ctx.waiting_steps()
        yield ctx.data_at, frames.opening, FRAME
        # A token's chunk is head + its JSON string + tail: two concatenations per token.
        before, tail = frames.before, b"}" + frames.after
        reasoning_head = before + b'{"' + ctx.reasoning_key.encode() + b'":'
        answer_head = before + b'{"content":'
        malformed_at = ctx.malformed_at
        for i, at, text, kind in ctx.pieces():
            if i == malformed_at:
                yield None, b'data: {"choices": [{"delta": {"content": "oops"\n\n', FRAME
            head = reasoning_head if kind == REASONING else answer_head
            yield at, head + _js(text) + tail, kind
        if ctx.cut is not None:
            yield from self._cut_steps(ctx)
            return
        # The end of generation (later than the last shown token when reasoning is hidden
        # and no answer was left room).
        end_at = ctx.base_at + ctx.plan.end_s if not ctx.plan.shown_tokens else None
        send_usage = "no_usage" not in ctx.faults
        usage = b""
        if send_usage and (ctx.include_usage or "usage_after_done" in ctx.faults):
            usage = frames.usage_head + _dumps(self.usage(ctx.plan)) + frames.usage_tail
        if "usage_after_done" in ctx.faults:
            yield end_at, frames.final + b"data: [DONE]\n\n" + usage, FRAME
        else:
            yield end_at, frames.final + usage + b"data: [DONE]\n\n", FRAME
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
