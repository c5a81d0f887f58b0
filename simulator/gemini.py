"""Gemini's native API, as the simulator speaks it.

    POST /<slug>/v1beta/models/<model>:streamGenerateContent?alt=sse   (streamed)
    POST /<slug>/v1beta/models/<model>:generateContent                 (whole)
    GET  /<slug>/v1beta/models

The key comes in `x-goog-api-key` (or `?key=`). Each `data:` line is a whole
GenerateContentResponse carrying several tokens (chunk_tokens); thought summaries are parts
with `"thought": true`; `usageMetadata` rides on every chunk and is cumulative, proto3-style
(a count of 0 is left out); the last chunk has the finishReason; no `[DONE]`. A blocked prompt
is one chunk with `promptFeedback.blockReason`; an error mid-stream is `{"error": {...}}`.
Sources: simulator/README.md.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any, ClassVar

from simulator.config import Provider
from simulator.wire import (
    ANSWER,
    END,
    FRAME,
    Endpoint,
    HttpError,
    Limits,
    Prompt,
    Step,
    StreamContext,
    WireFormat,
    _dumps,
)

_ENDPOINT = re.compile(r"^/v1beta/models/([^/:]+):(streamGenerateContent|generateContent)$")
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


class GeminiNative(WireFormat):
    name = "gemini"
    path = "/v1beta/models/{model}:streamGenerateContent"
    models_path = "/v1beta/models"
    _finish: ClassVar[dict[str, str]] = {"stop": "STOP", "length": "MAX_TOKENS"}

    def endpoint(self, method: str, path: str) -> Endpoint:
        if path == self.models_path and method == "GET":
            return Endpoint("models")
        match = _ENDPOINT.match(path)
        if match is None:
            raise HttpError(404, f"Method not found: {method} {path}")
        if method != "POST":
            raise HttpError(405, f"Method {method} not allowed on {path}")
        stream = match.group(2) == "streamGenerateContent"
        return Endpoint("generate", model=match.group(1), stream=stream)

    def authenticate(self, provider: Provider, request: Any) -> None:
        query = dict(p.partition("=")[::2] for p in request.query.split("&") if p)
        key = request.headers.get("x-goog-api-key", "") or query.get("key", "")
        if key not in provider.api_keys:
            raise self.unauthorized()
        if request.path.endswith(":streamGenerateContent") and query.get("alt") != "sse":
            # Without alt=sse the real API streams one JSON array; the simulator speaks SSE only.
            raise HttpError(400, "The simulator streams with alt=sse only.")

    def unauthorized(self) -> HttpError:
        return HttpError(400, "API key not valid. Please pass a valid API key.")

    def model_not_found(self, model: object) -> HttpError:
        return HttpError(
            404,
            f"models/{model} is not found for API version v1beta, or is not supported for "
            "generateContent. Call ListModels to see the list of available models and their "
            "supported methods.",
        )

    def invalid_body(self, detail: str) -> HttpError:
        return HttpError(400, f"Invalid JSON payload received. {detail}")

    def error_body(self, err: HttpError) -> bytes:
        if err.body is not None:
            return _dumps(err.body)
        status = _STATUS.get(err.status, "UNKNOWN")
        return _dumps({"error": {"code": err.status, "message": err.message, "status": status}})

    def limit_headers(self, limits: Limits) -> list[tuple[str, str]]:
        return []  # Gemini sends no rate-limit headers

    def normalize(self, body: dict[str, Any]) -> dict[str, Any]:
        """Proto3 JSON: a parser accepts each field by its lowerCamelCase name or by its proto
        name (snake_case), and Google's does. The google-genai SDK writes
        `thinkingConfig: {"thinking_budget", "include_thoughts", "thinking_level"}`; the
        documentation's examples the camelCase names. Both are read as one; a field given
        twice is refused, as a parser refuses a repeated field."""
        data: dict[str, Any] = _camel(body, "")
        return data

    def check_body(self, body: dict[str, Any]) -> None:
        if not isinstance(body.get("contents"), list) or not body["contents"]:
            raise HttpError(400, "* GenerateContentRequest.contents: contents is not specified")

    def prompt(self, body: dict[str, Any]) -> Prompt:
        parts: list[str] = []
        system = body.get("systemInstruction")
        if isinstance(system, dict):
            self._add(parts, system.get("parts"))
        for content in body.get("contents") or []:
            if isinstance(content, dict):
                self._add(parts, content.get("parts"))
        return Prompt(parts)

    def models_body(self, provider: Provider) -> bytes:
        models = [
            {
                "name": f"models/{m}",
                "displayName": f"{m} (simulated)",
                "supportedGenerationMethods": ["generateContent", "streamGenerateContent"],
            }
            for m in provider.models
        ]
        return _dumps({"models": models})

    @staticmethod
    def usage(ctx: StreamContext, answer: int, thoughts: int) -> dict[str, Any]:
        """usageMetadata so far, as proto3 JSON writes it: zero counts left out."""
        plan = ctx.plan
        usage: dict[str, Any] = {"promptTokenCount": plan.input_tokens}
        if plan.cached_tokens:
            usage["cachedContentTokenCount"] = plan.cached_tokens
        if answer:
            usage["candidatesTokenCount"] = answer
        usage["totalTokenCount"] = plan.input_tokens + answer + thoughts
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        return usage

    def _chunk(
        self, ctx: StreamContext, parts: list[dict[str, Any]], usage: dict[str, Any], finish: str
    ) -> bytes:
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
        if finish:
            candidate["finishReason"] = finish
        candidate["index"] = 0
        data = {
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": ctx.model,
            "responseId": ctx.request_id,
        }
        return b"data: " + _dumps(data) + b"\r\n\r\n"

    def whole_body(self, ctx: StreamContext) -> bytes:
        plan = ctx.plan
        parts: list[dict[str, Any]] = []
        if plan.reasoning:
            parts.append({"text": "".join(plan.reasoning), "thought": True})
        parts.append({"text": "".join(plan.answer)})
        usage = self.usage(ctx, len(plan.answer), plan.reasoning_tokens)
        return self._chunk(ctx, parts, usage, self._finish[plan.finish_reason])[6:-4]

    def steps(self, ctx: StreamContext) -> Iterator[Step]:
        plan = ctx.plan
        if "prompt_blocked" in ctx.faults:
            data = {
                "promptFeedback": {"blockReason": "SAFETY"},
                "usageMetadata": self.usage(ctx, 0, 0),
                "modelVersion": ctx.model,
                "responseId": ctx.request_id,
            }
            yield ctx.base_at + plan.queue_s, b"data: " + _dumps(data) + b"\r\n\r\n", FRAME
            yield None, b"", END
            return
        size = max(1, int(ctx.options.get("chunk_tokens", 8)))
        # Billed thoughts up to each shown token: the hidden ones before it, and itself.
        hidden = plan.hidden_before or [0] * plan.shown_tokens
        billed_thoughts = list(
            itertools.accumulate(h + (i < len(plan.reasoning)) for i, h in enumerate(hidden))
        )
        pieces = list(ctx.pieces())
        finish = self._finish[plan.finish_reason]
        answered = 0
        malformed_at = ctx.malformed_at
        start = 0
        while start < len(pieces):
            kind = pieces[start][3]
            end = start + 1
            while end < len(pieces) and end - start < size and pieces[end][3] == kind:
                end += 1
            group = pieces[start:end]
            text = "".join(p[2] for p in group)
            part: dict[str, Any] = {"text": text}
            if kind != ANSWER:
                part["thought"] = True
            else:
                answered += len(group)
            last = end == len(pieces) and ctx.cut is None and plan.answer
            usage = self.usage(ctx, answered, billed_thoughts[end - 1])
            after = b""
            if malformed_at is not None and start <= malformed_at < end:
                after = b'data: {"candidates": [{"content": {"parts": [{"text": "oops"\r\n\r\n'
            chunk = self._chunk(ctx, [part], usage, finish if last else "")
            yield group[-1][1], chunk + after, kind
            for _ in group[1:]:
                yield None, b"", kind  # the chunk's other tokens: sent with it
            start = end
        if ctx.cut is not None:
            yield from self._cut_steps(ctx)
            return
        if not plan.answer:  # thinking used the whole budget: a last chunk with no text
            usage = self.usage(ctx, 0, plan.reasoning_tokens)
            yield ctx.base_at + plan.end_s, self._chunk(ctx, [], usage, finish), FRAME
        yield None, b"", END

    def huge_chunk(self) -> bytes:
        return (
            b'data: {"candidates":[{"content":{"parts":[{"text":"'
            + b" the" * 8000
            + b'"}]}}]}\r\n\r\n'
        )

    def stream_error(self) -> bytes:
        error = {"code": 500, "message": "An internal error has occurred.", "status": "INTERNAL"}
        return b"data: " + _dumps({"error": error}) + b"\r\n\r\n"

    def stream_throttled(self) -> bytes:
        error = {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
        }
        return b"data: " + _dumps({"error": error}) + b"\r\n\r\n"


# Free-form values (google.protobuf.Struct and JSON Schema): their keys are data, not fields.
_FREE_FORM = frozenset({"args", "response", "responseSchema", "responseJsonSchema", "parameters"})


def _camel(value: Any, path: str) -> Any:
    if isinstance(value, list):
        return [_camel(v, path) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), key)
        if name in out:
            where = f"{path}.{name}" if path else name
            raise HttpError(
                400,
                f'Invalid JSON payload received. Duplicate field "{where}" (given by both its '
                "names).",
            )
        out[name] = item if name in _FREE_FORM else _camel(item, f"{path}.{name}" if path else name)
    return out
