"""What every wire format the simulator speaks is made of: the WireFormat base class, the step
kinds a stream is rendered into, and the helpers the dialects share.

Each dialect has a module of its own (chat.py, azure.py, messages.py, responses.py, gemini.py,
bedrock.py), and formats.py is their registry. A format knows its endpoints and how its clients
send the API key, its error shape, its rate-limit headers, how it reads a prompt, and how to
render a planned response: whole (JSON) or as a stream of SSE frames. Streams are produced as
`Step`s: (target send time or None for "right after the previous one", bytes, kind). Token
frames are pre-rendered from byte templates: one streamed token costs a few byte
concatenations."""

from __future__ import annotations

import json
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
