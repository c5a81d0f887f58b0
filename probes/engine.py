"""One probe: send one streaming request, time every phase, classify every failure.

`await probe(spec)` never raises (cancellation aside): whatever happens becomes a ProbeResult
with an outcome. Timestamps are time.perf_counter() times of when bytes arrived, before any
parsing: headers, each streamed event and the end carry the arrival of the read that completed
them, which is the kernel's receive time where it gives one (probes/netstream.py), so neither
the parsers nor other streams' work on the same event loop sit inside a measured time.
t0 is taken just before the request is handed to the HTTP client; the request (prompt, body
encoding, gzip) and the client are prepared before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import json
import re
import ssl
import statistics
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx
import msgpack

from probes import prompts
from probes.formats import (
    ANSWER,
    DONE,
    ERROR,
    FINISH,
    REASONING,
    TOOL,
    USAGE,
    WIRE_FORMATS,
    MalformedStream,
    WireFormat,
)
from probes.model import BODY_MSGPACK_GZIP, ProbeResult, ProbeSpec
from probes.model import ERROR as OUTCOME_ERROR
from probes.sse import LineTooLong, SSEParser
from probes.tokenizer import count_tokens
from probes.transport import (
    HTTPCORE_ERRORS,
    BlockedAddress,
    Phases,
    ResolutionError,
    arrival_clock,
    body_chunks,
    current,
    make_client,
    warm_clients,
)

DETAIL_LIMIT = 500
ERROR_BODY_LIMIT = 64 * 1024
# Endpoints that answered 400 to stream_options: later probes leave it out.
_REJECTS_STREAM_OPTIONS: set[str] = set()
_SECRETISH = re.compile(r"(?i)(bearer\s+|sk-|x-api-key[\"':\s]+)[A-Za-z0-9._\-]{6,}")


class ProbeFailure(Exception):
    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind, self.detail = kind, detail


def redact(text: str, secret: str) -> str:
    if secret:
        text = text.replace(secret, "[redacted]")
    return _SECRETISH.sub(lambda m: m.group(1) + "[redacted]", text)[:DETAIL_LIMIT]


@dataclass
class Progress:
    """What a probe has seen so far; read by races when a probe is cancelled."""

    output_chunks: int = 0
    text_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)


@dataclass
class _Prepared:
    url: str
    headers: dict[str, str]
    body: bytes
    endpoint: str
    used_stream_options: bool


def _prepare(spec: ProbeSpec, fmt: WireFormat, stream_options: bool) -> _Prepared:
    system, user = prompts.build(
        spec.system_prompt, spec.user_prompt, spec.input_tokens, spec.fresh_prefix
    )
    obj = fmt.body(spec, system, user, stream_options)
    headers = {"accept": "text/event-stream", "accept-encoding": "identity"}
    headers.update(fmt.headers(spec))
    headers.update(spec.extra_headers)
    if spec.body_encoding == BODY_MSGPACK_GZIP:
        body = gzip.compress(msgpack.packb(obj), compresslevel=6)
        headers["content-type"] = "application/vnd.msgpack"
        headers["content-encoding"] = "gzip"
    else:
        body = json.dumps(obj, separators=(",", ":")).encode()
        headers["content-type"] = "application/json"
    url = spec.base_url.rstrip("/") + fmt.path
    return _Prepared(url, headers, body, url, stream_options)


def _ms(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start) * 1000.0


def _int_header(headers: httpx.Headers, *names: str) -> int | None:
    for name in names:
        value = headers.get(name)
        if value is not None:
            try:
                return int(float(value))
            except ValueError:
                return None
    return None


def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _classify_exception(exc: BaseException, headers_seen: bool) -> tuple[str, str]:
    chain: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and node not in chain:
        chain.append(node)
        node = node.__cause__ or node.__context__
    for item in chain:
        if isinstance(item, ResolutionError):
            return "dns", str(item)
        if isinstance(item, BlockedAddress):
            return "blocked_url", str(item)
        if isinstance(item, ssl.SSLError):
            return "tls", f"TLS failed: {item.reason or item}"
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpcore.ConnectError):
        return "connect", f"connection failed: {exc}"
    if headers_seen:
        return "truncated", f"the stream broke off: {exc.__class__.__name__}"
    return "connect", f"{exc.__class__.__name__}: {exc}"


async def probe(spec: ProbeSpec, progress: Progress | None = None) -> ProbeResult:
    """Run one probe. Never raises except on cancellation."""
    fmt = WIRE_FORMATS.get(spec.format)
    if fmt is None:
        return ProbeResult(
            outcome=OUTCOME_ERROR,
            error_kind="http_4xx",
            error_detail=f"unknown wire format {spec.format!r}",
        )
    progress = progress or Progress()
    try:
        endpoint = spec.base_url.rstrip("/") + fmt.path
        use_options = (
            spec.stream_options
            and spec.format == "openai"
            and endpoint not in _REJECTS_STREAM_OPTIONS
        )
        result = await _attempt(spec, fmt, _prepare(spec, fmt, use_options), progress)
        if (
            use_options
            and result.error_kind == "http_4xx"
            and "stream_options" in result.error_detail
        ):
            _REJECTS_STREAM_OPTIONS.add(endpoint)
            progress.text_parts.clear()
            result = await _attempt(spec, fmt, _prepare(spec, fmt, False), progress)
        return result
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the engine's last line of defence: a probe never raises
        return ProbeResult(
            outcome=OUTCOME_ERROR,
            error_kind="malformed_stream",
            error_detail=redact(f"internal error: {exc.__class__.__name__}: {exc}", spec.api_key),
        )


async def _attempt(
    spec: ProbeSpec, fmt: WireFormat, prepared: _Prepared, progress: Progress
) -> ProbeResult:
    result = ProbeResult(request_bytes=len(prepared.body))
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(prepared.url))
    cold_client = (
        make_client(spec.http2, spec.verify, 4, cleartext=origin.startswith("http://"))
        if spec.cold
        else None
    )
    client = cold_client or warm_clients.acquire(origin, spec.http2, spec.verify)
    phases = Phases(allow_private=spec.allow_private, connect_to=spec.connect_to)
    token = current.set(phases)
    request = client.build_request(
        "POST",
        prepared.url,
        headers=prepared.headers,
        content=prepared.body,
        extensions={"trace": phases.trace},
    )
    response: httpx.Response | None = None
    t0 = time.perf_counter()
    result.t0_perf = phases.started = t0
    deadline_total = t0 + spec.total_timeout_s
    deadline_first = t0 + min(spec.first_token_timeout_s, spec.total_timeout_s)
    state = _StreamState(t0=t0)
    try:
        async with asyncio.timeout_at(_loop_time(deadline_first)) as scope:
            response = await client.send(request, stream=True)
            # Every stamp from here on is when the bytes arrived (the kernel's receive time where
            # it gives one), not when the parsers got to them.
            arrived_at = arrival_clock(response)
            state.headers_at = arrived_at()
            _read_headers(result, response)
            if response.status_code >= 400:
                await _error_response(result, response, spec)
                result.e2e_ms = _ms(t0, arrived_at())
                return _finish(result, phases, state, t0, spec)
            parser = SSEParser(max_line_bytes=spec.max_line_bytes)
            received = 0
            async for chunk in body_chunks(response):
                now = arrived_at()
                received += len(chunk)
                if received > spec.max_response_bytes:
                    raise ProbeFailure(
                        "too_large", f"the response exceeded {spec.max_response_bytes} bytes"
                    )
                for event in parser.feed(chunk):
                    if event.comment:
                        continue
                    for piece in fmt.parse(event):
                        state.take(piece, now, progress, spec.text_limit)
                if state.first_at is not None and not state.rescheduled:
                    scope.reschedule(_loop_time(deadline_total))
                    state.rescheduled = True
                if state.error is not None:
                    raise ProbeFailure("stream_error", state.error)
            for event in parser.close():
                if not event.comment:
                    for piece in fmt.parse(event):
                        state.take(piece, arrived_at(), progress, spec.text_limit)
            state.end_at = arrived_at()
            if state.error is not None:
                raise ProbeFailure("stream_error", state.error)
            if not (state.complete or state.finished):
                raise ProbeFailure("truncated", "the stream ended before the response was complete")
    except TimeoutError:
        if state.headers_at is None:
            kind, detail = (
                "timeout_headers",
                f"no response headers within {spec.first_token_timeout_s:g} s",
            )
        elif state.first_at is None:
            kind, detail = (
                "timeout_first_token",
                f"no output within {spec.first_token_timeout_s:g} s",
            )
        else:
            kind, detail = (
                "timeout_total",
                f"the stream did not finish within {spec.total_timeout_s:g} s",
            )
        _fail(result, kind, detail, spec)
    except ProbeFailure as failure:
        _fail(result, failure.kind, failure.detail, spec)
    except LineTooLong as exc:
        _fail(result, "too_large", str(exc), spec)
    except MalformedStream as exc:
        _fail(result, "malformed_stream", str(exc), spec)
    except (httpx.HTTPError, *HTTPCORE_ERRORS, OSError, ResolutionError, BlockedAddress) as exc:
        kind, detail = _classify_exception(exc, state.headers_at is not None)
        _fail(result, kind, detail, spec)
    finally:
        current.reset(token)
        if response is not None:
            await _close_quietly(response)
        if cold_client is not None:
            await cold_client.aclose()
        else:
            warm_clients.release(client)
    return _finish(result, phases, state, t0, spec)


def _loop_time(perf_deadline: float) -> float:
    """Convert a perf_counter deadline into the event loop's clock."""
    return asyncio.get_running_loop().time() + (perf_deadline - time.perf_counter())


async def _close_quietly(response: httpx.Response) -> None:
    with contextlib.suppress(httpx.HTTPError, *HTTPCORE_ERRORS, OSError, TimeoutError):
        await asyncio.wait_for(response.aclose(), 2.0)


def _fail(result: ProbeResult, kind: str, detail: str, spec: ProbeSpec) -> None:
    result.outcome = OUTCOME_ERROR
    result.error_kind = kind
    result.error_detail = redact(detail, spec.api_key)


def _read_headers(result: ProbeResult, response: httpx.Response) -> None:
    headers = response.headers
    result.http_version = response.http_version
    result.ratelimit_remaining_requests = _int_header(
        headers, "x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining"
    )
    result.ratelimit_remaining_tokens = _int_header(
        headers, "x-ratelimit-remaining-tokens", "anthropic-ratelimit-tokens-remaining"
    )
    result.retry_after_s = _retry_after(headers)
    result.request_id = (
        headers.get("x-request-id")
        or headers.get("request-id")
        or headers.get("x-sim-request-id")
        or ""
    )[:100]


async def _error_response(result: ProbeResult, response: httpx.Response, spec: ProbeSpec) -> None:
    body = bytearray()
    try:
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) >= ERROR_BODY_LIMIT:
                break
    except (httpx.HTTPError, OSError):
        pass
    status = response.status_code
    kind = "http_429" if status == 429 else "http_5xx" if status >= 500 else "http_4xx"
    text = body.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and err.get("message"):
            text = str(err["message"])
    except ValueError:
        pass
    _fail(result, kind, f"HTTP {status}: {text}", spec)


@dataclass
class _StreamState:
    t0: float
    headers_at: float | None = None
    first_at: float | None = None
    first_answer_at: float | None = None
    last_at: float | None = None
    end_at: float | None = None
    content_times: list[float] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    text: list[str] = field(default_factory=list)
    text_len: int = 0
    reasoning: list[str] = field(default_factory=list)
    complete: bool = False
    finished: bool = False
    error: str | None = None
    rescheduled: bool = False

    def take(self, piece: Any, now: float, progress: Progress, text_limit: int) -> None:
        kind = piece.kind
        if kind in (REASONING, ANSWER, TOOL):
            if self.first_at is None:
                self.first_at = now
            if kind != REASONING and self.first_answer_at is None:
                self.first_answer_at = now
            self.last_at = now
            self.content_times.append(now)
            progress.output_chunks += 1
            if kind == REASONING:
                self.reasoning.append(piece.text)
                progress.reasoning_parts.append(piece.text)
            else:
                self.text.append(piece.text)
                progress.text_parts.append(piece.text)
                self.text_len += len(piece.text)
        elif kind == USAGE and piece.usage:
            self.usage.update({k: v for k, v in piece.usage.items() if v is not None})
        elif kind == DONE:
            self.complete = True
        elif kind == FINISH:
            self.finished = True
        elif kind == ERROR:
            self.error = piece.text or "the provider sent an error event"


def _finish(
    result: ProbeResult, phases: Phases, state: _StreamState, t0: float, spec: ProbeSpec
) -> ProbeResult:
    fmt = WIRE_FORMATS[spec.format]
    result.dns_ms = _ms(phases.dns_start, phases.dns_end)
    result.connect_ms = _ms(phases.connect_start, phases.connect_end)
    result.tls_ms = _ms(phases.tls_start, phases.tls_end)
    result.upload_ms = _ms(t0, phases.body_sent)
    result.ttfb_ms = _ms(t0, state.headers_at)
    result.ttft_ms = _ms(t0, state.first_at)
    result.ttfat_ms = _ms(t0, state.first_answer_at)
    if result.ok:
        result.e2e_ms = _ms(t0, state.end_at)
    text = "".join(state.text)
    result.text = text[: spec.text_limit]
    usage = fmt.usage(state.usage) if state.usage else None
    if usage is not None:
        result.input_tokens = usage.input_tokens
        result.cached_tokens = usage.cached_tokens
        result.reasoning_tokens = usage.reasoning_tokens
    if usage is not None and usage.output_tokens is not None and (state.complete or state.finished):
        result.output_tokens, result.token_source = usage.output_tokens, "usage"
    elif state.content_times and (result.ok or state.text_len < 256 * 1024):
        # Counted outside the timed path, after the stream ended (not for a huge failed one).
        result.output_tokens = count_tokens("".join(state.reasoning) + text)
        result.token_source = "tokenizer"  # noqa: S105 (not a password)
    times = state.content_times
    if (
        result.output_tokens
        and result.output_tokens > 1
        and len(times) > 1
        and times[-1] > times[0]
    ):
        result.tps = (result.output_tokens - 1) / (times[-1] - times[0])
        result.tpot_ms = 1000.0 / result.tps
    if len(times) > 1:
        gaps = [(b - a) * 1000.0 for a, b in itertools.pairwise(times)]
        result.itl_p50_ms = statistics.median(gaps)
        result.itl_max_ms = max(gaps)
    return result
