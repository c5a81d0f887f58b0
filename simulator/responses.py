"""OpenAI Responses, as the simulator speaks it (POST /<slug>/v1/responses).

Typed SSE events, each with a `sequence_number` counting from 0; no `[DONE]`. A stream opens
with response.created and response.in_progress; a reasoning model's reasoning item is announced
(output_item.added) and closed (output_item.done) even when its reasoning stays hidden;
summaries stream as reasoning_summary_text deltas; the answer as output_text deltas inside a
message item; it ends with response.completed (usage, model, service_tier), or
response.incomplete when max_output_tokens cut it. Errors mid-stream are `error` events. Every
delta carries an `obfuscation` field of random padding unless the request turned it off with
`stream_options.include_obfuscation: false`. Sources: simulator/README.md.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

from simulator.chat import OpenAIChat
from simulator.generation import Plan
from simulator.wire import (
    END,
    FRAME,
    REASONING,
    HttpError,
    Prompt,
    Step,
    StreamContext,
    _dumps,
    _js,
)

# Padding for the obfuscation field: its length varies with the delta's (the real one evens
# out payload sizes); the characters are not output.
_PAD = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


class OpenAIResponses(OpenAIChat):
    name = "responses"
    path = "/v1/responses"

    def check_body(self, body: dict[str, Any]) -> None:
        if body.get("input") in (None, "", []):
            raise HttpError(
                400,
                "Missing required parameter: 'input'.",
                param="input",
                code="missing_required_parameter",
            )

    def prompt(self, body: dict[str, Any]) -> Prompt:
        parts: list[str] = []
        self._add(parts, body.get("instructions"))
        items = body.get("input")
        if isinstance(items, str):
            parts.append(items)
        elif isinstance(items, list):
            for item in items:
                if isinstance(item, dict):
                    self._add(parts, item.get("content"))
        return Prompt(parts)

    def timing_headers(self, received_at: float) -> list[tuple[str, str]]:
        # Up to the headers, which is all a stream's header can tell.
        return [("openai-processing-ms", str(round((time.perf_counter() - received_at) * 1000)))]

    @staticmethod
    def usage(plan: Plan) -> dict[str, Any]:
        return {
            "input_tokens": plan.input_tokens,
            "input_tokens_details": {"cached_tokens": plan.cached_tokens},
            "output_tokens": plan.output_tokens,
            "output_tokens_details": {"reasoning_tokens": plan.reasoning_tokens},
            "total_tokens": plan.input_tokens + plan.output_tokens,
        }

    def _response(self, ctx: StreamContext, status: str) -> dict[str, Any]:
        plan = ctx.plan
        data: dict[str, Any] = {
            "id": f"resp_{ctx.request_id}",
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "model": ctx.model,
            "output": [],
            "service_tier": plan.service_tier or "default",
            "store": ctx.options.get("store", True),
            "usage": None,
        }
        if status in ("completed", "incomplete"):
            data["output"] = self._output(ctx)
            if "no_usage" not in ctx.faults:
                data["usage"] = self.usage(plan)
        if status == "incomplete":
            data["incomplete_details"] = {"reason": "max_output_tokens"}
        return data

    def _output(self, ctx: StreamContext) -> list[dict[str, Any]]:
        plan = ctx.plan
        out: list[dict[str, Any]] = []
        if plan.reasoning_tokens:  # hidden reasoning: an item with no summary
            summary = [{"type": "summary_text", "text": "".join(plan.reasoning)}]
            item: dict[str, Any] = {
                "id": f"rs_{ctx.request_id}",
                "type": "reasoning",
                "summary": [],
            }
            if plan.reasoning:
                item["summary"] = summary
            out.append(item)
        if plan.answer:
            text: dict[str, Any] = {
                "type": "output_text",
                "text": "".join(plan.answer),
                "annotations": [],
            }
            out.append(
                {
                    "id": f"msg_{ctx.request_id}",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [text],
                }
            )
        return out

    def whole_body(self, ctx: StreamContext) -> bytes:
        status = "incomplete" if ctx.plan.finish_reason == "length" else "completed"
        return _dumps(self._response(ctx, status))

    def steps(self, ctx: StreamContext) -> Iterator[Step]:
        numbers: Iterator[int] = itertools.count()
        if "sequence_gap" in ctx.faults:
            numbers = _gap(numbers, at=8)  # a few deltas in
        event = _Events(numbers, bool(ctx.options.get("obfuscation", True)))
        rid = ctx.request_id
        yield (
            None,
            event("response.created", {"response": self._response(ctx, "in_progress")})
            + event("response.in_progress", {"response": self._response(ctx, "in_progress")}),
            FRAME,
        )
        index = 0  # the message's output index: after the reasoning item, when there is one
        reasoning_item = {"id": f"rs_{rid}", "type": "reasoning", "summary": []}
        if ctx.plan.reasoning_tokens:
            yield None, self._open_reasoning(ctx, event, reasoning_item), FRAME
            index = 1
        message = {
            "id": f"msg_{rid}",
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        started = False
        malformed_at = ctx.malformed_at
        for i, at, text, kind in ctx.pieces():
            before = b""
            if i == malformed_at:
                before = b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", "delta": "oops"\n\n'
            if kind == REASONING:
                delta = event.delta(
                    "response.reasoning_summary_text.delta",
                    {"item_id": f"rs_{rid}", "output_index": 0, "summary_index": 0},
                    text,
                )
                yield at, before + delta, kind
                continue
            if not started:
                started = True
                before += self._close_reasoning(ctx, event, reasoning_item)
                before += self._open_message(ctx, event, message, index)
            delta = event.delta(
                "response.output_text.delta",
                {"item_id": f"msg_{rid}", "output_index": index, "content_index": 0},
                text,
                logprobs=True,
            )
            yield at, before + delta, kind
        if ctx.cut is not None:
            yield from self._cut(ctx, event)
            return
        if started:
            closing = self._close_message(ctx, event, message, index)
        else:
            closing = self._close_reasoning(ctx, event, reasoning_item)
        if ctx.plan.finish_reason == "length":
            closing += event("response.incomplete", {"response": self._response(ctx, "incomplete")})
        else:
            closing += event("response.completed", {"response": self._response(ctx, "completed")})
        end_at = ctx.base_at + ctx.plan.end_s if not ctx.plan.answer else None
        yield end_at, closing, FRAME
        yield None, b"", END

    @staticmethod
    def _open_reasoning(ctx: StreamContext, event: _Events, item: dict[str, Any]) -> bytes:
        """The reasoning item, and its summary part when the summary is streamed."""
        opening = event("response.output_item.added", {"output_index": 0, "item": item})
        if ctx.plan.reasoning:
            opening += event(
                "response.reasoning_summary_part.added",
                {
                    "item_id": item["id"],
                    "output_index": 0,
                    "summary_index": 0,
                    "part": {"type": "summary_text", "text": ""},
                },
            )
        return opening

    @staticmethod
    def _open_message(
        ctx: StreamContext, event: _Events, message: dict[str, Any], index: int
    ) -> bytes:
        """The message item and its text part, before the first answer delta."""
        return event(
            "response.output_item.added", {"output_index": index, "item": message}
        ) + event(
            "response.content_part.added",
            {
                "item_id": f"msg_{ctx.request_id}",
                "output_index": index,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
        )

    def _close_message(
        self, ctx: StreamContext, event: _Events, message: dict[str, Any], index: int
    ) -> bytes:
        """The text, its part and the message item, each done, with the whole answer."""
        answer = "".join(ctx.plan.answer)
        ids = {"item_id": f"msg_{ctx.request_id}", "output_index": index, "content_index": 0}
        closing = event("response.output_text.done", {**ids, "text": answer, "logprobs": []})
        closing += event(
            "response.content_part.done",
            {**ids, "part": {"type": "output_text", "text": answer, "annotations": []}},
        )
        done = {**message, "status": "completed", "content": self._output(ctx)[-1]["content"]}
        return closing + event("response.output_item.done", {"output_index": index, "item": done})

    @staticmethod
    def _close_reasoning(ctx: StreamContext, event: _Events, item: dict[str, Any]) -> bytes:
        plan = ctx.plan
        if not plan.reasoning_tokens:
            return b""
        out = b""
        if plan.reasoning:
            summary = "".join(plan.reasoning)
            ids = {"item_id": item["id"], "output_index": 0, "summary_index": 0}
            out += event("response.reasoning_summary_text.done", {**ids, "text": summary})
            out += event(
                "response.reasoning_summary_part.done",
                {**ids, "part": {"type": "summary_text", "text": summary}},
            )
            item = {**item, "summary": [{"type": "summary_text", "text": summary}]}
        return out + event("response.output_item.done", {"output_index": 0, "item": item})

    def _cut(self, ctx: StreamContext, event: _Events) -> Iterator[Step]:
        if "stream_error" in ctx.faults:
            body = {
                "code": "server_error",
                "message": "The server had an error while processing your request.",
                "param": None,
            }
            yield None, event("error", body), FRAME
            yield None, b"", END
        elif "stream_throttled" in ctx.faults:
            body = {
                "code": "rate_limit_exceeded",
                "message": "Rate limit reached for requests. Please try again later.",
                "param": None,
            }
            yield None, event("error", body), FRAME
            yield None, b"", END
        else:
            yield from self._cut_steps(ctx)

    def huge_chunk(self) -> bytes:
        return _Events(itertools.count(), False).delta(
            "response.output_text.delta", {}, " the" * 8000
        )


def _gap(numbers: Iterator[int], at: int) -> Iterator[int]:
    for n in numbers:
        if n != at:
            yield n


class _Events:
    """Renders one stream's events, numbering them in order."""

    def __init__(self, numbers: Iterator[int], obfuscation: bool) -> None:
        self.numbers = numbers
        self.obfuscation = obfuscation

    def __call__(self, kind: str, fields: dict[str, Any]) -> bytes:
        data = {"type": kind, **fields, "sequence_number": next(self.numbers)}
        return b"event: " + kind.encode() + b"\ndata: " + _dumps(data) + b"\n\n"

    def delta(self, kind: str, ids: dict[str, Any], text: str, logprobs: bool = False) -> bytes:
        head = b'{"type":"' + kind.encode() + b'",' + _dumps(ids)[1:-1]
        if ids:
            head += b","
        out = head + b'"delta":' + _js(text)
        if logprobs:
            out += b',"logprobs":[]'
        if self.obfuscation:
            out += b',"obfuscation":"' + _PAD[: 16 - min(len(text), 15)] + b'"'
        out += b',"sequence_number":' + str(next(self.numbers)).encode() + b"}"
        return b"event: " + kind.encode() + b"\ndata: " + out + b"\n\n"
