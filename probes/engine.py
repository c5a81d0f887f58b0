"""One probe: send one streaming request, time every phase, classify every failure.

`await probe(spec)` never raises (cancellation aside): whatever happens becomes a Measurement
with an outcome, and a failure has one kind from probes.errors (a bug of ours is `engine`,
settings the provider refuses are `config`: neither is blamed on the provider). Timestamps
are time.perf_counter() times of when bytes arrived, before any parsing: headers, each
streamed event and the end carry the arrival of the read that completed them, which is the
kernel's receive time where it gives one (probes/netstream.py), so neither the parsers nor
other streams' work on the same event loop sit inside a measured time.
t0 is taken just before the request is handed to the HTTP client; the request (prompt, body
encoding, gzip) and the client are prepared before it. Derived figures (token counts, speed,
what served the probe) are computed after the stream has ended (probes/figures.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import json
import logging
import statistics
import time
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2
import msgpack

from probes import figures, prompts
from probes.errors import (
    EngineError,
    HTTPStatusFailure,
    InvalidSpec,
    Kind,
    NotAnEventStream,
    ProbeError,
    ProbeTimeout,
    ResponseTooLarge,
    StreamErrorEvent,
    Truncated,
    from_transport,
)
from probes.formats import (
    ANSWER,
    DONE,
    ERROR,
    FINISH,
    REASONING,
    TOOL,
    USAGE,
    WireFormat,
    error_message,
    wire_format,
)
from probes.model import (
    BODY_ENCODINGS,
    BODY_MSGPACK_GZIP,
    MAX_CHUNK_GAPS,
    SOURCE_USAGE,
    Measurement,
    ProbeSpec,
)
from probes.model import ERROR as OUTCOME_ERROR
from probes.redact import redact
from probes.request import build_request, send
from probes.transport import (
    HTTPCORE_ERRORS,
    Phases,
    arrival_clock,
    body_chunks,
    body_pump,
    current,
    make_client,
    warm_clients,
)

logger = logging.getLogger(__name__)

DETAIL_LIMIT = 500
ERROR_BODY_LIMIT = 64 * 1024
EXCERPT_CHARS = 160
# Endpoints that answered 400 to stream_options: later probes leave it out.
_REJECTS_STREAM_OPTIONS: set[str] = set()
# Content types that say nothing about the body: it is sniffed before being refused.
_UNLABELLED = ("", "application/octet-stream", "text/plain")
_SSE_STARTS = (b"data:", b"event:", b"id:", b"retry:", b":")


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
    sent: dict[str, Any]  # the body's settings (what a provider may refuse)


def _prepare(spec: ProbeSpec, fmt: WireFormat, stream_options: bool) -> _Prepared:
    if spec.body_encoding not in BODY_ENCODINGS:
        raise InvalidSpec(f"unknown body encoding {spec.body_encoding!r}")
    if spec.max_tokens < 1:
        raise InvalidSpec(f"max_tokens must be at least 1, not {spec.max_tokens}")
    if spec.connect_to is not None:
        host, _, port = spec.connect_to.rpartition(":")
        if not (host and port.isdigit()):
            raise InvalidSpec(f"connect_to must be host:port, not {spec.connect_to!r}")
    prompt = prompts.build(
        spec.system_prompt, spec.user_prompt, spec.input_tokens, spec.fresh_prefix
    )
    obj = fmt.body(spec, prompt, stream_options)
    headers = {"accept": fmt.content_type, "accept-encoding": "identity"}
    headers.update(fmt.headers(spec))
    headers.update(spec.extra_headers)
    headers.update(spec.secret_headers)
    if spec.body_encoding == BODY_MSGPACK_GZIP:
        body = gzip.compress(msgpack.packb(obj), compresslevel=6)
        headers["content-type"] = "application/vnd.msgpack"
        headers["content-encoding"] = "gzip"
    else:
        body = json.dumps(obj, separators=(",", ":")).encode()
        headers["content-type"] = "application/json"
    url = fmt.url(spec)
    fmt.sign(spec, url, headers, body)  # last: a signature covers the request as sent
    return _Prepared(url, headers, body, obj)


def _ms(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return (end - start) * 1000.0


def _excerpt(data: bytes | str) -> str:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return " ".join(text.split())[:EXCERPT_CHARS]


async def probe(spec: ProbeSpec, progress: Progress | None = None) -> Measurement:
    """Run one probe. Never raises except on cancellation."""
    progress = progress or Progress()
    try:
        fmt = wire_format(spec.format)
        endpoint = fmt.url(spec)
        use_options = (
            spec.stream_options
            and fmt.sends_stream_options
            and endpoint not in _REJECTS_STREAM_OPTIONS
        )
        await _load_async_backend()
        result = await _attempt(spec, fmt, _prepare(spec, fmt, use_options), progress)
        if (
            use_options
            and result.error_kind in (Kind.HTTP_4XX, Kind.CONFIG)
            and "stream_options" in result.error_detail
        ):
            _REJECTS_STREAM_OPTIONS.add(endpoint)
            progress.text_parts.clear()
            result = await _attempt(spec, fmt, _prepare(spec, fmt, False), progress)
        return result
    except asyncio.CancelledError:
        raise
    except ProbeError as failure:  # before any request: the spec cannot be sent as it is
        result = Measurement()
        _fail(result, failure, spec)
        return result
    except Exception as exc:  # the engine's last line of defence: a probe never raises
        result = Measurement()
        _fail(result, _engine_failure(exc, spec), spec)
        return result


_backend_loaded = False


async def _load_async_backend() -> None:
    """Load anyio's asyncio backend once per process, before any t0.

    httpcore2's connection-pool locks are anyio locks, and anyio imports its backend (and
    sniffio) on first use: 30-150 ms inside the first probe's timed path, in no phase
    (seen against independent servers: tests/interop/test_cli.py). anyio.sleep(0) is the
    public call that makes it load."""
    global _backend_loaded
    if not _backend_loaded:
        await anyio.sleep(0)
        _backend_loaded = True


def _h2c_refused(
    spec: ProbeSpec, origin: str, phases: Phases, state: _StreamState, failure: ProbeError
) -> bool:
    """An HTTP/2 probe over plain http whose connection was made and then dropped before any
    response: an HTTP/1.1-only server answers the h2c preface with a 400 and closes. Over TLS,
    ALPN settles the version instead, so this is a configuration of ours (seen against
    uvicorn: tests/interop/test_http_versions.py)."""
    return (
        spec.http2
        and origin.startswith("http://")
        and phases.connect_end is not None
        and state.headers_at is None
        and failure.kind in (Kind.CONNECT, Kind.TRUNCATED, Kind.MALFORMED_STREAM)
    )


def _engine_failure(exc: Exception, spec: ProbeSpec) -> EngineError:
    """A bug of ours: logged with its traceback (redacted), reported as `engine`."""
    trace = "".join(traceback.format_exception(exc))
    logger.error(
        "probe engine failure (%s, %s): %s", spec.format, spec.model, redact(trace, spec.secrets())
    )
    return EngineError(f"probe engine failure: {exc.__class__.__name__}: {exc}")


async def _attempt(
    spec: ProbeSpec, fmt: WireFormat, prepared: _Prepared, progress: Progress
) -> Measurement:
    """One request's whole life: connect, send, read the stream, end. Longer than our ~80
    lines on purpose: it reads top to bottom in the order the clock stamps each phase, and
    every stamp sits where its event happens (split up, the timing points hide in helpers)."""
    result = Measurement(request_bytes=len(prepared.body))
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(prepared.url))
    cold_client = (
        make_client(spec.http2, spec.verify, 4, cleartext=origin.startswith("http://"))
        if spec.cold
        else None
    )
    client = cold_client or warm_clients.acquire(origin, spec.http2, spec.verify)
    phases = Phases(
        allow_private=spec.allow_private,
        connect_to=spec.connect_to,
        plain_http=origin.startswith("http://"),
    )
    token = current.set(phases)
    response: httpx2.Response | None = None
    state = _StreamState(t0=0.0)
    try:
        outgoing = build_request(
            client, prepared.url, prepared.headers, prepared.body, phases.trace
        )
        t0 = time.perf_counter()
        result.t0_perf = phases.started = state.t0 = t0
        deadline_total = t0 + spec.total_timeout_s
        deadline_first = t0 + min(spec.first_token_timeout_s, spec.total_timeout_s)
        async with asyncio.timeout_at(_loop_time(deadline_first)) as scope:
            response = await send(client, outgoing)
            # Every stamp from here on is when the bytes arrived (the kernel's receive time where
            # it gives one), not when the parsers got to them.
            arrived_at = arrival_clock(response)
            state.headers_at = arrived_at()
            _read_headers(result, response)
            if response.status_code >= 400:
                failure = await _error_response(response, fmt, prepared)
                result.e2e_ms = _ms(t0, arrived_at())
                raise failure
            if response.is_redirect:
                raise InvalidSpec(
                    f"the provider redirects (HTTP {response.status_code}) to "
                    f"{response.headers.get('location', 'nowhere')!r}: the base URL is wrong"
                )
            parser = fmt.framing(spec)
            parse = fmt.reader()
            chunks = plain = body_chunks(response)
            content_type = response.headers.get("content-type", "")
            if not content_type.lower().startswith(fmt.content_type):
                chunks = await _sniffed(chunks, content_type, response.status_code, fmt)
            received = 0

            def consume(chunk: bytes, now: float) -> None:
                # A read's body bytes, stamped with its arrival. Called from the event loop's
                # callback for the read when the body is pumped (its exceptions end the pump);
                # there, a read can come after the deadline fired and before this task is
                # cancelled for it, and is left unread, as the task would have left it.
                nonlocal received
                if scope.expired():
                    return
                received += len(chunk)
                if received > spec.max_response_bytes:
                    raise ResponseTooLarge(f"the response exceeded {spec.max_response_bytes} bytes")
                for event in parser.feed(chunk):
                    if event.comment:
                        continue
                    for piece in parse(event):
                        state.take(piece, now, progress, spec.text_limit)
                if state.first_at is not None and not state.rescheduled:
                    scope.reschedule(_loop_time(deadline_total))
                    state.rescheduled = True
                if state.error is not None:
                    raise state.failure()

            pump = body_pump(response) if chunks is plain else None
            if pump is not None:
                await pump(consume)
            else:
                async for chunk in chunks:
                    consume(chunk, arrived_at())
            for event in parser.close():
                if not event.comment:
                    for piece in parse(event):
                        state.take(piece, arrived_at(), progress, spec.text_limit)
            state.end_at = arrived_at()
            if state.error is not None:
                raise state.failure()
            if not (state.complete or state.finished):
                if parser.foreign is not None and state.nothing_recognized():
                    raise NotAnEventStream(
                        f"the response is not an event stream (HTTP {response.status_code}, "
                        f"content-type {content_type or 'none'}): its first line is "
                        f"{_excerpt(parser.foreign)!r}"
                    )
                raise Truncated("the stream ended before the response was complete")
    except TimeoutError:
        state.failed_at = time.perf_counter()
        _fail(result, _timeout(spec, state), spec)
    except ProbeError as failure:
        state.failed_at = time.perf_counter()
        _fail(result, failure, spec)
    except (httpx2.HTTPError, httpx2.InvalidURL, *HTTPCORE_ERRORS, OSError) as exc:
        state.failed_at = time.perf_counter()
        seen = from_transport(exc, state.headers_at is not None)
        if _h2c_refused(spec, origin, phases, state, seen):
            seen = InvalidSpec(
                "the server did not take HTTP/2 over plain http (h2c with prior knowledge) and "
                f"closed the connection ({seen.detail}); it speaks HTTP/1.1 only here: "
                "untick the provider's HTTP/2 support"
            )
        _fail(result, seen, spec)
    except Exception as exc:  # a bug of ours, not the provider's: the timings so far are kept
        state.failed_at = time.perf_counter()
        _fail(result, _engine_failure(exc, spec), spec)
    finally:
        current.reset(token)
        if response is not None:
            await _close_quietly(response)
        if cold_client is not None:
            await cold_client.aclose()
        else:
            warm_clients.release(client)
    try:
        return _finish(result, phases, state, fmt, spec)
    except Exception as exc:
        _fail(result, _engine_failure(exc, spec), spec)
        return result


def _timeout(spec: ProbeSpec, state: _StreamState) -> ProbeTimeout:
    if state.headers_at is None:
        return ProbeTimeout(
            f"no response headers within {spec.first_token_timeout_s:g} s", Kind.TIMEOUT_HEADERS
        )
    if state.first_at is None:
        return ProbeTimeout(
            f"no output within {spec.first_token_timeout_s:g} s", Kind.TIMEOUT_FIRST_TOKEN
        )
    return ProbeTimeout(
        f"the stream did not finish within {spec.total_timeout_s:g} s", Kind.TIMEOUT_TOTAL
    )


async def _sniffed(
    chunks: AsyncIterator[bytes], content_type: str, status: int, fmt: WireFormat
) -> AsyncIterator[bytes]:
    """A 200 not labelled as this format's stream: refused with what it was (a captive
    portal's or gateway's HTML page, a JSON body from a server that ignored stream: true),
    unless it is unlabelled and its first bytes are SSE, in which case an SSE stream goes on
    from them."""
    first = await anext(chunks, b"")
    bare = content_type.split(";")[0].strip().lower()
    sse = fmt.content_type == "text/event-stream"
    if sse and bare in _UNLABELLED and first.lstrip(b"\xef\xbb\xbf\r\n ").startswith(_SSE_STARTS):
        return _prepend(first, chunks)
    raise NotAnEventStream(
        f"the response is not an event stream (HTTP {status}, content-type "
        f"{content_type or 'none'}): it begins {_excerpt(first)!r}"
    )


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


def _loop_time(perf_deadline: float) -> float:
    """Convert a perf_counter deadline into the event loop's clock."""
    return asyncio.get_running_loop().time() + (perf_deadline - time.perf_counter())


async def _close_quietly(response: httpx2.Response) -> None:
    # asyncio.timeout, not wait_for: no task of its own for every probe.
    with contextlib.suppress(httpx2.HTTPError, *HTTPCORE_ERRORS, OSError, TimeoutError):
        async with asyncio.timeout(2.0):
            await response.aclose()


def _fail(result: Measurement, failure: ProbeError, spec: ProbeSpec) -> None:
    result.outcome = OUTCOME_ERROR
    result.error_kind = failure.kind.value
    # Redacted whole, then cut: a cut first could leave half a key no pattern recognizes.
    result.error_detail = redact(failure.detail, spec.secrets())[:DETAIL_LIMIT]


def _read_headers(result: Measurement, response: httpx2.Response) -> None:
    headers = response.headers
    result.http_version = response.http_version
    result.ratelimit_remaining_requests = figures.header_count(
        headers, "x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining"
    )
    result.ratelimit_remaining_tokens = figures.header_count(
        headers, "x-ratelimit-remaining-tokens", "anthropic-ratelimit-tokens-remaining"
    )
    result.retry_after_s = figures.retry_after_s(headers)
    result.server_ms = figures.processing_ms(headers)
    result.request_id = (
        headers.get("x-request-id")
        or headers.get("request-id")
        or headers.get("apim-request-id")
        or headers.get("x-amzn-requestid")
        or headers.get("x-sim-request-id")
        or ""
    )[:100]


async def _error_response(
    response: httpx2.Response, fmt: WireFormat, prepared: _Prepared
) -> ProbeError:
    body = bytearray()
    try:
        async for chunk in body_chunks(response):
            body += chunk
            if len(body) >= ERROR_BODY_LIMIT:
                break
    except (httpx2.HTTPError, *HTTPCORE_ERRORS, OSError):
        pass
    status = response.status_code
    text = body.decode("utf-8", errors="replace")
    refused = fmt.refusal(status, text, prepared.sent)
    if refused is not None:
        return refused
    if status == 415:  # our body encoding (msgpack+gzip) is not one this provider takes
        return InvalidSpec(
            f"the provider does not accept this body encoding "
            f"({prepared.headers.get('content-type')}, HTTP 415: {error_message(text)[0]})"
        )
    return HTTPStatusFailure(status, f"HTTP {status}: {error_message(text)[0]}")


@dataclass
class _StreamState:
    t0: float
    headers_at: float | None = None
    first_at: float | None = None
    first_answer_at: float | None = None
    last_answer_at: float | None = None
    last_at: float | None = None
    end_at: float | None = None
    content_times: list[float] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    metas: list[dict[str, Any]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    text_len: int = 0
    reasoning: list[str] = field(default_factory=list)
    complete: bool = False
    finished: bool = False
    error: str | None = None
    error_kind: str = ""
    failed_at: float | None = None  # perf_counter when the attempt failed
    rescheduled: bool = False
    # The usage reported by the first answer chunk's arrival (multi-token chunks' speed).
    usage_at_first_answer: dict[str, Any] | None = None
    first_answer_text: list[str] = field(default_factory=list)

    def take(self, piece: Any, now: float, progress: Progress, text_limit: int) -> None:
        kind = piece.kind
        if kind in (ANSWER, TOOL):  # the common piece first
            text = piece.text
            if self.first_at is None:
                self.first_at = now
            if self.first_answer_at is None:
                self.first_answer_at = now
            if now == self.first_answer_at:
                self.first_answer_text.append(text)
            self.last_answer_at = self.last_at = now
            self.content_times.append(now)
            progress.output_chunks += 1
            self.text.append(text)
            progress.text_parts.append(text)
            self.text_len += len(text)
        elif kind == REASONING:
            if self.first_at is None:
                self.first_at = now
            self.last_at = now
            self.content_times.append(now)
            progress.output_chunks += 1
            self.reasoning.append(piece.text)
            progress.reasoning_parts.append(piece.text)
        elif kind == USAGE:
            if piece.usage:
                self.usage.update({k: v for k, v in piece.usage.items() if v is not None})
                if now == self.first_answer_at:
                    self.usage_at_first_answer = dict(self.usage)
            if piece.meta is not None:
                self.metas.append(piece.meta)
        elif kind == DONE:
            self.complete = True
        elif kind == FINISH:
            self.finished = True
            if piece.meta is not None:
                self.metas.append(piece.meta)
        elif kind == ERROR:
            self.error = piece.text or "the provider sent an error event"
            self.error_kind = piece.error_kind

    def failure(self) -> ProbeError:
        """The failure an error in the stream stands for: its kind as the format read it
        (a rate limit, a server error, our settings), else stream_error."""
        detail = self.error or "the provider sent an error event"
        if self.error_kind == Kind.CONFIG:
            return InvalidSpec(detail)
        return StreamErrorEvent(detail, Kind(self.error_kind) if self.error_kind else None)

    def nothing_recognized(self) -> bool:
        return not (self.content_times or self.usage or self.metas)


def _finish(
    result: Measurement, phases: Phases, state: _StreamState, fmt: WireFormat, spec: ProbeSpec
) -> Measurement:
    t0 = state.t0
    result.connection_reused = phases.connection_reused
    result.dns_ms = _ms(phases.dns_start, phases.dns_end)
    result.connect_ms = _ms(phases.connect_start, phases.connect_end)
    result.tls_ms = _ms(phases.tls_start, phases.tls_end)
    # The body-sent stamp is taken when the write returns in user space, so a busy event loop
    # can put it after the response headers' kernel arrival. Both bound the true send time
    # from above (the server answers once it has read the body): the earlier is the truer.
    body_sent = phases.body_sent
    if body_sent is not None and state.headers_at is not None:
        body_sent = min(body_sent, state.headers_at)
    result.upload_ms = _ms(t0, body_sent)
    result.ttfb_ms = _ms(t0, state.headers_at)
    result.ttft_ms = _ms(t0, state.first_at)
    result.ttfat_ms = _ms(t0, state.first_answer_at)
    if result.ok:
        result.e2e_ms = _ms(t0, state.end_at)
    elif t0 and state.failed_at is not None:
        result.failed_after_ms = _ms(t0, state.failed_at)
    text = "".join(state.text)
    result.text = text[: spec.text_limit]
    served = fmt.served(state.metas)
    result.served_model = served.model
    result.service_tier = served.service_tier
    result.request_id = result.request_id or served.response_id
    usage = fmt.usage(state.usage) if state.usage else None
    if usage is not None:
        result.input_tokens = usage.input_tokens
        result.cached_tokens = usage.cached_tokens
        result.reasoning_tokens = usage.reasoning_tokens
        result.service_tier = result.service_tier or usage.service_tier
        if usage.server_ms is not None:  # the whole request's, not the headers' time
            result.server_ms = usage.server_ms
    times = state.content_times
    if len(times) > 1:
        gaps = [(b - a) * 1000.0 for a, b in itertools.pairwise(times)]
        result.itl_p50_ms = statistics.median(gaps)
        result.itl_max_ms = max(gaps)
        result.chunk_gaps_ms = [round(g, 3) for g in gaps[:MAX_CHUNK_GAPS]]
    usage_output = (
        usage.output_tokens if usage is not None and (state.complete or state.finished) else None
    )
    if usage_output is None and not (
        state.content_times and (result.ok or state.text_len < 256 * 1024)
    ):
        return result  # nothing streamed, or a huge failed stream: not worth counting
    # Counted outside the timed path, after the stream ended.
    speed = figures.speed_tokens(
        usage_output,
        usage,
        state.reasoning,
        text,
        thinking_requested=bool(spec.thinking_budget_tokens or spec.reasoning_effort),
    )
    if usage_output is not None:
        result.output_tokens, result.token_source = usage_output, SOURCE_USAGE
    else:
        result.output_tokens, result.token_source = speed.streamed_tokens, speed.source
    result.reasoning_tokens = speed.reasoning_tokens
    result.hidden_reasoning_tokens = speed.hidden_reasoning_tokens
    result.streamed_output_tokens = speed.streamed_tokens
    result.tps_token_source = speed.source
    streamed = speed.streamed_tokens
    if fmt.multi_token_chunks:
        first_usage = state.usage_at_first_answer
        chunked = figures.chunk_speed(
            usage.answer_tokens if usage is not None and usage_output is not None else None,
            fmt.usage(first_usage).answer_tokens if first_usage else None,
            text,
            "".join(state.first_answer_text),
            state.first_answer_at,
            state.last_answer_at,
        )
        if chunked is not None:
            result.tps = chunked
            result.tpot_ms = 1000.0 / chunked
    elif streamed and streamed > 1 and len(times) > 1 and times[-1] > times[0]:
        result.tps = (streamed - 1) / (times[-1] - times[0])
        result.tpot_ms = 1000.0 / result.tps
    return result
