"""The wire formats the simulator speaks, one class each, in a registry.

A format knows its endpoints and how its clients send the API key, its error shape, its
rate-limit headers, how it reads a prompt, and how to render a planned response: whole (JSON)
or as a stream of SSE frames. Streams are produced as `Step`s: (target send time or None for
"right after the previous one", bytes, kind). Token frames are pre-rendered from byte
templates: one streamed token costs a few byte concatenations.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, ClassVar

from simulator.config import Provider
from simulator.generation import Plan, Usage

# Step kinds
FRAME = 0  # bytes that carry no generated token
REASONING = 1  # a reasoning token
ANSWER = 2  # an answer token
END = 3  # finish the response normally
ABORT = 4  # break the connection (HTTP/2: reset the stream)
STALL = 5  # send nothing more; keep the connection open until the client leaves

Step = tuple[float | None, bytes, int]

MAX_CACHE_BREAKPOINTS = 4
CACHE_TTLS_S = {"5m": 300.0, "1h": 3600.0}


class HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or []
        self.body = body  # a whole error body, when the dialect's usual shape does not apply


@dataclass(frozen=True)
class Waiting:
    """SSE comments a stream sends while the request waits (before any data event)."""

    comment: bytes
    interval_s: float
    until_first_token: bool  # False: only during the queue delay


@dataclass(slots=True)
class Endpoint:
    kind: str  # "generate" | "models"
    model: str | None = None  # a model named by the URL (Azure deployments, Gemini, Bedrock)
    stream: bool | None = None  # the URL says whether to stream (Gemini, Bedrock)


@dataclass
class Prompt:
    """A request's prompt as blocks, in the order the provider renders them."""

    parts: list[str]
    # (block index, ttl seconds) of each cache_control breakpoint (Anthropic)
    breakpoints: list[tuple[int, float]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.parts)


@lru_cache(maxsize=4096)
def _js(text: str) -> bytes:
    return json.dumps(text).encode()


def _dumps(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + _dumps(data) + b"\n\n"


def go_duration(seconds: float) -> str:
    """A duration the way OpenAI's rate-limit reset headers write it (Go's format):
    "20ms", "1s", "1.5s", "6m0s", "1h2m3s"."""
    ms = max(0, round(seconds * 1000))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    out = f"{hours}h" if hours else ""
    if hours or minutes:
        out += f"{minutes}m"
    return out + f"{secs}s"


def rfc3339(seconds_from_now: float) -> str:
    at = datetime.now(UTC) + timedelta(seconds=max(0.0, seconds_from_now))
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class Limits:
    """Rate-limit figures for the headers of one response."""

    requests_limit: int
    tokens_limit: int
    usage: Usage
    inf: bool  # the ratelimit_inf fault: non-numeric values

    @classmethod
    def of(cls, provider: Provider, usage: Usage, inf: bool) -> Limits:
        return cls(
            provider.requests_per_minute or provider.advertised_requests_per_minute,
            provider.tokens_per_minute or provider.advertised_tokens_per_minute,
            usage,
            inf,
        )

    def count(self, value: int) -> str:
        return "inf" if self.inf else str(max(0, value))

    @staticmethod
    def reset_s(used: int, limit: int) -> float:
        """Until the limit is back to full, replenishing continuously over a minute."""
        return min(60.0, 60.0 * used / limit) if limit else 0.0


@dataclass(slots=True)
class StreamContext:
    plan: Plan
    request_id: str
    model: str
    base_at: float  # perf_counter of request receipt; plan offsets are relative to it
    include_usage: bool
    faults: frozenset[str]
    reasoning_key: str = "reasoning_content"
    waiting: Waiting | None = None
    thinking: bool = False  # Anthropic: the response has a thinking block
    # What else the request asked of the rendering (Responses: obfuscation; Bedrock: the
    # latency mode), from the model profile.
    options: dict[str, Any] = field(default_factory=dict)
    # The provider's own time for the request as the stream reports it (Bedrock's
    # metrics.latencyMs), set when rendered: ground truth for server_ms.
    server_ms: float | None = None

    @property
    def cut(self) -> int | None:
        """How many tokens go out before a mid-stream fault (stall, error, truncation)."""
        if self.faults & {"stall_mid", "truncated", "stream_error", "stream_throttled"}:
            return min(5, self.plan.shown_tokens)
        return None

    @property
    def malformed_at(self) -> int | None:
        if "malformed_chunk" in self.faults:
            return min(3, self.plan.shown_tokens - 1)
        return None

    def pieces(self) -> Iterator[tuple[int, float, str, int]]:
        """(index, target send time, text, kind) of every shown token, up to the cut."""
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

    @property
    def data_at(self) -> float | None:
        """When a stream that sends waiting comments sends its first data event."""
        if self.waiting is None:
            return None
        plan = self.plan
        return self.base_at + (plan.ttft_s if self.waiting.until_first_token else plan.queue_s)

    def waiting_steps(self) -> Iterator[Step]:
        """The waiting comments, each at its time, until data may start."""
        until = self.data_at
        if self.waiting is None or until is None:
            return
        at = self.base_at + self.waiting.interval_s
        while at < until:
            yield at, self.waiting.comment, FRAME
            at += self.waiting.interval_s


class WireFormat:
    name: ClassVar[str]
    path: ClassVar[str]
    models_path: ClassVar[str] = "/v1/models"
    # True: prompt caching only at cache_control breakpoints (Anthropic); False: automatic
    # prefix caching (OpenAI and most OpenAI-compatible servers).
    explicit_cache: ClassVar[bool] = False
    stream_content_type: ClassVar[str] = "text/event-stream; charset=utf-8"

    def authenticate(self, provider: Provider, request: Any) -> None:
        """Refuse a request whose credentials are not the provider's (an HttpError)."""
        if self.api_key(request.headers) not in provider.api_keys:
            raise self.unauthorized()

    def normalize(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body as the API reads it, before anything looks at it (Gemini: field names in
        either of proto3 JSON's spellings)."""
        return body

    def check_body(self, body: dict[str, Any]) -> None:
        """Refuse a body without what the API requires (after the model is known)."""
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise HttpError(400, "messages: a non-empty list is required.", param="messages")

    def streams(self, body: dict[str, Any], endpoint: Endpoint) -> bool:
        return endpoint.stream if endpoint.stream is not None else bool(body.get("stream"))

    def timing_headers(self, received_at: float) -> list[tuple[str, str]]:
        """Headers reporting the provider's own time so far, taken when the headers go out."""
        return []

    def endpoint(self, method: str, path: str) -> Endpoint:
        """Which endpoint a request is for; HttpError when none."""
        if path == self.models_path and method == "GET":
            return Endpoint("models")
        if path != self.path:
            raise HttpError(404, f"Unknown request URL: {method} {path}")
        if method != "POST":
            raise HttpError(405, f"Method {method} not allowed on {path}")
        return Endpoint("generate")

    def check_query(self, query: str) -> None:
        """Refuse a request whose query string the API requires to differ (before auth)."""

    def check_headers(self, headers: dict[str, str]) -> None:
        """Refuse a request without a header the API requires (after auth)."""

    def api_key(self, headers: dict[str, str]) -> str:
        return headers.get("authorization", "").removeprefix("Bearer ").strip()

    def unauthorized(self) -> HttpError:
        return HttpError(401, "Incorrect API key provided.", code="invalid_api_key")

    def model_not_found(self, model: object) -> HttpError:
        return HttpError(
            404,
            f"The model `{model}` does not exist or you do not have access to it.",
            code="model_not_found",
        )

    def invalid_body(self, detail: str) -> HttpError:
        raise NotImplementedError

    def error_body(self, err: HttpError) -> bytes:
        raise NotImplementedError

    def limit_headers(self, limits: Limits) -> list[tuple[str, str]]:
        raise NotImplementedError

    def response_headers(self, request_id: str) -> list[tuple[str, str]]:
        """Headers every response of this dialect carries (besides the simulator's own)."""
        return []

    @staticmethod
    def _add(parts: list[str], content: Any) -> None:
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for item in content:
                if isinstance(item, dict) and isinstance(item.get("text"), str):
                    parts.append(item["text"])

    def prompt(self, body: dict[str, Any]) -> Prompt:
        parts: list[str] = []
        self._add(parts, body.get("system"))
        for message in body.get("messages") or []:
            if isinstance(message, dict):
                self._add(parts, message.get("content"))
        return Prompt(parts)

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
        elif "stream_throttled" in ctx.faults:
            yield None, self.stream_throttled(), FRAME
            yield None, b"", END
        elif "stall_mid" in ctx.faults:
            yield None, b"", STALL
        else:  # truncated
            yield None, b"", ABORT

    def stream_error(self) -> bytes:
        raise NotImplementedError

    def stream_throttled(self) -> bytes:
        """An in-stream rate-limit error; a dialect without one sends its stream error."""
        return self.stream_error()

    def error_headers(self, err: HttpError) -> list[tuple[str, str]]:
        """Headers of an error response, beyond the error's own (Bedrock's error type)."""
        return []


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
        before, after = frames.before, frames.after
        reasoning_key = b'{"' + ctx.reasoning_key.encode() + b'":'
        malformed_at = ctx.malformed_at
        for i, at, text, kind in ctx.pieces():
            if i == malformed_at:
                yield None, b'data: {"choices": [{"delta": {"content": "oops"\n\n', FRAME
            key = reasoning_key if kind == REASONING else b'{"content":'
            yield at, before + key + _js(text) + b"}" + after, kind
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


_SAFE = {"filtered": False, "severity": "safe"}
# Azure's default content filter verdicts on a harmless prompt and completion.
PROMPT_FILTER_RESULTS = {
    "hate": _SAFE,
    "jailbreak": {"filtered": False, "detected": False},
    "self_harm": _SAFE,
    "sexual": _SAFE,
    "violence": _SAFE,
}
CONTENT_FILTER_RESULTS = {"hate": _SAFE, "self_harm": _SAFE, "sexual": _SAFE, "violence": _SAFE}
AZURE_DEPLOYMENT = re.compile(r"^/openai/deployments/([^/]+)/chat/completions$")
AZURE_API_VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}(-preview)?$")


class AzureChat(OpenAIChat):
    """Azure OpenAI: the OpenAI Chat Completions wire format behind an Azure resource's URLs
    (/openai/deployments/<deployment>/chat/completions?api-version=YYYY-MM-DD), the api-key
    header, Azure's own error shapes for routing and auth, and content filter results: a
    first chunk with no choices carrying prompt_filter_results, content_filter_results on
    every choice after it."""

    name = "azure"
    path = "/openai/deployments/{deployment}/chat/completions"

    def endpoint(self, method: str, path: str) -> Endpoint:
        match = AZURE_DEPLOYMENT.match(path)
        if match is None:
            raise self._not_found()
        if method != "POST":
            raise HttpError(405, f"Method {method} not allowed on {path}")
        return Endpoint("generate", model=match.group(1))

    def check_query(self, query: str) -> None:
        versions = [
            v for k, _, v in (p.partition("=") for p in query.split("&")) if k == "api-version"
        ]
        if not versions or not versions[0]:
            raise self._not_found()
        if not AZURE_API_VERSION.match(versions[0]):
            raise HttpError(
                400,
                "API version not supported",
                body={"error": {"code": "BadRequest", "message": "API version not supported"}},
            )

    @staticmethod
    def _not_found() -> HttpError:
        return HttpError(
            404,
            "Resource not found",
            body={"error": {"code": "404", "message": "Resource not found"}},
        )

    def api_key(self, headers: dict[str, str]) -> str:
        return headers.get("api-key", "").strip()

    def unauthorized(self) -> HttpError:
        message = (
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to "
            "provide a valid key for an active subscription and use a correct regional API "
            "endpoint for your resource."
        )
        return HttpError(401, message, body={"error": {"code": "401", "message": message}})

    def model_not_found(self, model: object) -> HttpError:
        message = (
            "The API deployment for this resource does not exist. If you created the deployment "
            "within the last 5 minutes, please wait a moment and try again."
        )
        return HttpError(
            404, message, body={"error": {"code": "DeploymentNotFound", "message": message}}
        )

    def error_body(self, err: HttpError) -> bytes:
        if err.body is None and (err.status == 429 or err.status >= 500):
            return _dumps({"error": {"code": str(err.status), "message": err.message}})
        return super().error_body(err)

    def response_headers(self, request_id: str) -> list[tuple[str, str]]:
        return [("apim-request-id", request_id), ("x-request-id", request_id)]

    def _choice(self, ctx: StreamContext) -> dict[str, Any]:
        return {"content_filter_results": CONTENT_FILTER_RESULTS, **super()._choice(ctx)}

    def whole_body(self, ctx: StreamContext) -> bytes:
        data = json.loads(super().whole_body(ctx))
        data["prompt_filter_results"] = [
            {"prompt_index": 0, "content_filter_results": PROMPT_FILTER_RESULTS}
        ]
        return _dumps(data)

    def _frames(self, ctx: StreamContext) -> Frames:
        usage_null = b',"usage":null' if ctx.include_usage else b""
        tail = (
            b'"created":'
            + str(int(time.time())).encode()
            + b',"id":"chatcmpl-'
            + ctx.request_id.encode()
            + b'","model":'
            + _js(ctx.model)
            + b',"object":"chat.completion.chunk","system_fingerprint":"fp_sim"'
        )
        filters = _dumps(CONTENT_FILTER_RESULTS)

        def chunk(results: bytes, delta: bytes, finish: bytes) -> bytes:
            return (
                b'data: {"choices":[{"content_filter_results":'
                + results
                + b',"delta":'
                + delta
                + b',"finish_reason":'
                + finish
                + b',"index":0,"logprobs":null}],'
                + tail
                + usage_null
                + b"}\n\n"
            )

        prompt_filter = _dumps(
            {
                "choices": [],
                "created": 0,
                "id": "",
                "model": "",
                "object": "",
                "prompt_filter_results": [
                    {"prompt_index": 0, "content_filter_results": PROMPT_FILTER_RESULTS}
                ],
            }
        )
        before, after = chunk(filters, b"\x00", b"null").split(b"\x00")
        return Frames(
            opening=b"data: "
            + prompt_filter
            + b"\n\n"
            + chunk(b"{}", b'{"content":"","refusal":null,"role":"assistant"}', b"null"),
            before=before,
            after=after,
            final=chunk(b"{}", b"{}", _js(ctx.plan.finish_reason)),
            usage_head=b'data: {"choices":[],' + tail + b',"usage":',
            usage_tail=b"}\n\n",
        )


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
