"""The simulated provider: routing, API keys, faults, rate limits, timing and ground truth.

Routes, per provider slug:
    POST /<slug>/v1/chat/completions     OpenAI Chat Completions (format = "openai")
    POST /<slug>/v1/messages             Anthropic Messages (format = "anthropic")
    GET  /<slug>/v1/models
    POST /<slug>/openai/deployments/<deployment>/chat/completions?api-version=YYYY-MM-DD
                                         Azure OpenAI (format = "openai", profile = "azure-openai")
Ground truth and health (no auth):
    GET /_sim/health    GET /_sim/stats    GET|POST /_sim/stats/reset
    GET /_sim/requests/<x-sim-request-id>
Times in ground truth are time.perf_counter() seconds (CLOCK_MONOTONIC on Linux, the same
clock for every process on the host), taken right after each piece was handed to the transport.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import os
import random
import re
import time
from array import array
from collections import OrderedDict, deque
from typing import Any

import msgpack

from simulator import generation
from simulator.cluster import Cluster, SharedState
from simulator.config import FAULTS, Config, Profile, Provider
from simulator.formats import FORMATS
from simulator.player import Player, Truth
from simulator.profiles import PROFILES, ShapedRequest
from simulator.server import Request, Responder
from simulator.wire import (
    FRAME,
    REASONING,
    Endpoint,
    HttpError,
    Limits,
    Prompt,
    StreamContext,
    WireFormat,
)

KEEP_TRUTHS = 10_000
KEEP_LAGS = 2_000_000
# Prompts longer than this are tokenized in a thread, off the event loop.
TOKENIZE_INLINE_CHARS = 20_000
# A fault named in the prompt, like the x-sim-fault header (providers that allow it).
PROMPT_FAULT = re.compile(r"\[sim-fault:\s*([a-z0-9_]+)\s*\]")
PROMPT_DELAY = re.compile(r"\[sim-delay-ms:\s*(\d{1,6})\s*\]")
_clock = time.perf_counter


def _percentiles(values: list[float]) -> dict[str, float | int | None]:
    values = sorted(values)

    def pick(q: float) -> float | None:
        return values[min(len(values) - 1, int(q * len(values)))] if values else None

    return {
        "count": len(values),
        "p50": pick(0.5),
        "p90": pick(0.9),
        "p99": pick(0.99),
        "max": values[-1] if values else None,
    }


_ids = itertools.count(1)


class SimulatorApp:
    def __init__(
        self, config: Config, seed: int | None = None, cluster: Cluster | None = None
    ) -> None:
        self.config = config
        # One of `--processes N` workers: the caches and rate limits are the cluster's.
        self.cluster = cluster
        self.truths: OrderedDict[str, Truth] = OrderedDict()
        # The providers' prompt caches (OpenAI-style providers cache prompt prefixes
        # automatically; Anthropic only at cache_control breakpoints) and rate-limit windows:
        # this process's own; a cluster's worker asks the parent's for the ones it shares.
        self.state = SharedState(config)
        # Each worker draws its own sequence, repeatable with --seed.
        self.rng = random.Random(
            seed if cluster is None or seed is None else f"{seed}/{cluster.index}"
        )
        self.lags_ms: deque[float] = deque(maxlen=KEEP_LAGS)
        self.active_streams = 0
        self.requests_served = 0
        # Provider requests read but not yet answered with headers, and the time from a
        # request's read to its headers (the truth's headers_sent_at - received_at), for
        # /_sim/stats: where a client waits for headers, this says whether the server held it.
        self.awaiting_headers = 0
        self.headers_waits_ms: deque[float] = deque(maxlen=KEEP_LAGS)
        self.id_prefix = f"sim{os.getpid() % 100000}"

    def warm_up(self) -> None:
        generation.vocabulary()  # loads the tokenizer before the first request

    # --- entry --------------------------------------------------------------------------

    async def __call__(self, request: Request, responder: Responder) -> None:
        path = request.path
        if path.startswith("/_sim/"):
            await self._internal(request, responder)
            return
        slug, _, rest = path.strip("/").partition("/")
        provider = self.config.providers.get(slug)
        if provider is None:
            self._json(responder, 404, {"error": {"message": f"no provider {slug!r}"}})
            return
        await self._provider(provider, "/" + rest, request, responder)

    # --- plumbing -----------------------------------------------------------------------

    @staticmethod
    def _json(responder: Responder, status: int, data: Any) -> None:
        responder.respond(status, [("content-type", "application/json")], json.dumps(data).encode())

    async def _internal(self, request: Request, responder: Responder) -> None:
        path, cluster = request.path, self.cluster
        if path == "/_sim/health":
            self._json(responder, 200, {"status": "ok", "providers": list(self.config.providers)})
        elif path == "/_sim/stats":
            own = self._counts()
            processes = [own]
            lags, waits = list(self.lags_ms), list(self.headers_waits_ms)
            if cluster is not None:
                for _, payload in await cluster.ask_siblings("GET", "/peer/stats"):
                    head, _, raw = payload.partition(b"\n")
                    counts = json.loads(head)
                    processes.append(counts)
                    more = array("d")
                    more.frombytes(raw)
                    n = counts.pop("lags", len(more))  # send lags first, then header waits
                    lags += more[:n]
                    waits += more[n:]
            requests = sum(p["requests"] for p in processes)
            active = sum(p["active_streams"] for p in processes)
            self._json(
                responder,
                200,
                {
                    "requests": requests,
                    "active_streams": active,
                    "send_lag_ms": _percentiles(lags),
                    "awaiting_headers": sum(p["awaiting_headers"] for p in processes),
                    "headers_wait_ms": _percentiles(waits),
                    "processes": 1 if cluster is None else cluster.processes,
                    "per_process": processes,
                },
            )
        elif path == "/_sim/stats/reset":
            self.lags_ms.clear()
            self.headers_waits_ms.clear()
            if cluster is not None:
                await cluster.ask_siblings("POST", "/peer/stats/reset")
            self._json(responder, 200, {"status": "reset"})
        elif path.startswith("/_sim/requests/"):
            request_id = path.rsplit("/", 1)[1]
            truth = self.truths.get(request_id)
            if truth is not None:
                self._json(responder, 200, truth.to_json())
                return
            if cluster is not None:
                # Served by another worker: its answer, as it gives it.
                for status, payload in await cluster.ask_siblings(
                    "GET", f"/peer/requests/{request_id}"
                ):
                    if status == 200:
                        responder.respond(200, [("content-type", "application/json")], payload)
                        return
            self._json(responder, 404, {"error": "unknown request id"})
        else:
            self._json(responder, 404, {"error": "not found"})

    async def peer(self, request: Request, responder: Responder) -> None:
        """A sibling worker's questions, on this worker's Unix socket (never over TCP)."""
        path = request.path
        if path == "/peer/stats":
            head = json.dumps({**self._counts(), "lags": len(self.lags_ms)}).encode()
            raw = array("d", self.lags_ms)
            raw.extend(self.headers_waits_ms)
            body = head + b"\n" + raw.tobytes()
            responder.respond(200, [("content-type", "application/octet-stream")], body)
        elif path == "/peer/stats/reset":
            self.lags_ms.clear()
            self.headers_waits_ms.clear()
            self._json(responder, 200, {"status": "reset"})
        elif path.startswith("/peer/requests/"):
            truth = self.truths.get(path.rsplit("/", 1)[1])
            if truth is None:
                self._json(responder, 404, {"error": "unknown request id"})
            else:
                self._json(responder, 200, truth.to_json())
        else:
            self._json(responder, 404, {"error": "not found"})

    def _counts(self) -> dict[str, Any]:
        """This process's counters, for /_sim/stats (the cluster's sums them)."""
        return {
            "pid": os.getpid(),
            "requests": self.requests_served,
            "active_streams": self.active_streams,
            "awaiting_headers": self.awaiting_headers,
        }

    @staticmethod
    def _decode(provider: Provider, wire: WireFormat, request: Request) -> dict[str, Any]:
        """The body as the provider reads it: msgpack only where the provider takes it
        (Cerebras does); everywhere else the bytes are parsed as JSON, whatever the
        content-type says, and fail as JSON does. gzip is undone first."""
        body, headers = request.body, request.headers
        if headers.get("content-encoding", "").strip().lower() == "gzip":
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError, ValueError):
                raise HttpError(400, "The request body is not valid gzip.") from None
        if provider.accepts_msgpack and "msgpack" in headers.get("content-type", ""):
            try:
                data = msgpack.unpackb(body, raw=False)
            except msgpack.StackError:
                raise HttpError(400, "The request body is nested too deeply.") from None
            except (ValueError, msgpack.UnpackException):
                raise HttpError(400, "The request body is not valid msgpack.") from None
        else:
            try:
                data = json.loads(body)
            except ValueError as exc:
                raise wire.invalid_body(str(exc)) from None
            except RecursionError:
                raise HttpError(400, "The request body is nested too deeply.") from None
        if not isinstance(data, dict):
            raise HttpError(400, "The request body must be an object.")
        return data

    def _faults(self, provider: Provider, headers: dict[str, str]) -> frozenset[str]:
        chosen = {name for name, p in provider.faults.items() if p and self.rng.random() < p}
        forced = headers.get("x-sim-fault", "")
        if provider.allow_fault_header and forced:
            names = {f.strip() for f in forced.split(",") if f.strip()}
            unknown = names - set(FAULTS)
            if unknown:
                raise HttpError(400, f"x-sim-fault: unknown faults {sorted(unknown)}")
            chosen |= names
        return frozenset(chosen)

    @staticmethod
    def _prompt_faults(text: str) -> frozenset[str]:
        """Faults a prompt asks for ("[sim-fault: stall_headers]"), where the fault header is
        allowed: a scenario's step can then fail on its own while the others run clean."""
        names = {m.strip() for m in PROMPT_FAULT.findall(text)}
        unknown = names - set(FAULTS)
        if unknown:
            raise HttpError(400, f"[sim-fault:]: unknown faults {sorted(unknown)}")
        return frozenset(names)

    @staticmethod
    def _prompt_delay_s(text: str) -> float:
        """Extra queue time a prompt asks for ("[sim-delay-ms: 300]"; the last one counts),
        where the fault header is allowed: one branch of a fan-out can be the slow one."""
        found = PROMPT_DELAY.findall(text)
        return min(int(found[-1]), 60_000) / 1000.0 if found else 0.0

    def _remember(self, truth: Truth) -> None:
        self.truths[truth.id] = truth
        while len(self.truths) > KEEP_TRUTHS:
            self.truths.popitem(last=False)

    # --- provider endpoints -------------------------------------------------------------

    async def _provider(
        self, provider: Provider, path: str, request: Request, responder: Responder
    ) -> None:
        wire = FORMATS[provider.wire]
        self.requests_served += 1
        truth = Truth(
            id=f"{self.id_prefix}-{next(_ids)}",
            provider=provider.slug,
            model="",
            http_version=request.http_version,
            received_at=request.received_at,
        )
        headers = [
            ("x-sim-request-id", truth.id),
            ("x-sim-label", "simulated"),
            *wire.response_headers(truth.id),
        ]
        self._remember(truth)
        self.awaiting_headers += 1
        try:
            wire.check_query(request.query)
            wire.authenticate(provider, request)
            wire.check_headers(request.headers)
            endpoint = wire.endpoint(request.method, path)
            if endpoint.kind == "models":
                at = responder.respond(
                    200,
                    [("content-type", "application/json"), *headers],
                    wire.models_body(provider),
                )
                self._headers_out(truth, at)
                return
            await self._generate(provider, wire, endpoint, request, responder, truth, headers)
        except HttpError as err:
            truth.status = err.status
            truth.end_at = responder.respond(
                err.status,
                [
                    ("content-type", "application/json"),
                    *headers,
                    *err.headers,
                    *wire.error_headers(err),
                ],
                wire.error_body(err),
            )
            self._headers_out(truth, truth.end_at)
        finally:
            if truth.headers_sent_at is None:  # no answer (the client left, a stalled fault)
                self.awaiting_headers -= 1

    def _headers_out(self, truth: Truth, at: float) -> None:
        if truth.headers_sent_at is None:
            self.awaiting_headers -= 1
            self.headers_waits_ms.append((at - truth.received_at) * 1000.0)
        truth.headers_sent_at = at

    async def _tokens(self, wire: WireFormat, parts: list[str]) -> tuple[list[int], list[int]]:
        """The prompt's tokens and, for block-aware caching, the token count at each block's
        end. Long prompts are tokenized in a thread, off the event loop."""
        count = sum(map(len, parts))
        if wire.explicit_cache:
            if count > TOKENIZE_INLINE_CHARS:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(None, generation.tokenize_parts, parts)
            return generation.tokenize_parts(parts)
        text = "\n".join(parts)
        if count > TOKENIZE_INLINE_CHARS:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, generation.prompt_tokens, text), []
        return generation.prompt_tokens(text), []

    async def _generate(
        self,
        provider: Provider,
        wire: WireFormat,
        endpoint: Endpoint,
        request: Request,
        responder: Responder,
        truth: Truth,
        headers: list[tuple[str, str]],
    ) -> None:
        body = wire.normalize(self._decode(provider, wire, request))
        faults = self._faults(provider, request.headers)
        truth.faults = sorted(faults)
        if "reject_stream_options" in faults and "stream_options" in body:
            raise HttpError(400, "Unrecognized request argument supplied: stream_options")
        model = endpoint.model or body.get("model")
        profile = provider.models.get(str(model))
        if profile is None:
            raise wire.model_not_found(model)
        truth.model = profile.id
        wire.check_body(body)
        shaped = PROFILES[profile.profile].read(body, profile)
        prompt = wire.prompt(body)
        if provider.allow_fault_header and "[sim-fault:" in prompt.text:
            faults = faults | self._prompt_faults(prompt.text)
            truth.faults = sorted(faults)
        tokens, block_ends = await self._tokens(wire, prompt.parts)
        truth.input_tokens = len(tokens)
        await self._admit(provider, wire, faults, len(tokens), shaped.shape.max_tokens, headers)
        cached, created = await self._cached(provider, wire, profile, prompt, tokens, block_ends)
        plan = self._plan(provider, profile, prompt, tokens, cached, created, shaped, request)
        truth.cached_tokens = plan.cached_tokens
        truth.cache_creation_tokens = plan.cache_creation_tokens
        truth.service_tier = plan.service_tier
        truth.options = dict(shaped.options)
        truth.correct = plan.correct
        truth.planned_ttft_ms = plan.ttft_s * 1000
        truth.planned_tokens_per_s = plan.decode_tokens_per_s
        truth.stream = wire.streams(body, endpoint)
        ctx = StreamContext(
            plan=plan,
            request_id=truth.id,
            model=profile.model_name,
            base_at=truth.received_at,
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            faults=faults,
            reasoning_key=shaped.reasoning_key,
            waiting=shaped.waiting,
            thinking=shaped.thinking,
            options=shaped.options,
        )
        if "stall_headers" in faults:
            await responder.wait_closed()
            return
        if provider.headers_after_queue:
            await asyncio.sleep(max(0.0, truth.received_at + plan.queue_s - _clock()))
        if truth.stream:
            self.active_streams += 1
            try:
                await self._stream(wire, ctx, responder, truth, headers)
            finally:
                self.active_streams -= 1
        else:
            await self._whole(wire, ctx, responder, truth, headers)

    async def _admit(
        self,
        provider: Provider,
        wire: WireFormat,
        faults: frozenset[str],
        input_tokens: int,
        max_tokens: int,
        headers: list[tuple[str, str]],
    ) -> None:
        """Count the request against the provider's rate limits and add their headers to
        `headers` (a 429 raised here or later carries them too); an HttpError where the limits
        or an injected fault refuse it."""
        if self.cluster is None:
            usage = self.state.limits[provider.slug].check(input_tokens, max_tokens)
        else:
            usage = await self.cluster.limit(provider.slug, input_tokens, max_tokens)
        allowed, retry_after_s = usage.allowed, usage.retry_after_s
        if "http_429" in faults:
            allowed, retry_after_s = False, max(retry_after_s, 1.0)
        limits = Limits.of(provider, usage, inf="ratelimit_inf" in faults)
        headers.extend(wire.limit_headers(limits))
        if not allowed:
            raise HttpError(
                429,
                "Rate limit reached for requests. Please try again later.",
                code="rate_limit_exceeded",
                headers=[("retry-after", f"{max(1, round(retry_after_s))}")],
            )
        if "http_500" in faults:
            raise HttpError(500, "The server had an error while processing your request.")
        if "http_503" in faults:
            raise HttpError(503, "The engine is currently overloaded, please try again later.")
        if "http_529" in faults:
            raise HttpError(529, "Overloaded")

    async def _cached(
        self,
        provider: Provider,
        wire: WireFormat,
        profile: Profile,
        prompt: Prompt,
        tokens: list[int],
        block_ends: list[int],
    ) -> tuple[int, int]:
        """(cached tokens, cache creation tokens): the provider's prompt cache looked up and
        filled; the cluster's when this is one of several workers (only for a prompt the
        cache could hold: one that is long enough, or has breakpoints)."""
        slug, cluster = provider.slug, self.cluster
        if wire.explicit_cache:
            if cluster is not None and prompt.breakpoints:
                return await cluster.cache(
                    slug,
                    profile.id,
                    tokens,
                    block_ends,
                    prompt.breakpoints,
                    profile.min_cacheable_tokens,
                )
            return self.state.breakpoint_caches[slug].lookup_and_store(
                profile.id, tokens, block_ends, prompt.breakpoints, profile.min_cacheable_tokens
            )
        if cluster is not None and len(tokens) >= generation.MIN_CACHEABLE_TOKENS:
            return await cluster.cache(slug, profile.id, tokens)
        return self.state.caches[slug].lookup_and_store(profile.id, tokens), 0

    def _plan(
        self,
        provider: Provider,
        profile: Profile,
        prompt: Prompt,
        tokens: list[int],
        cached: int,
        created: int,
        shaped: ShapedRequest,
        request: Request,
    ) -> generation.Plan:
        """What the model says and when, given what the provider's prompt cache held;
        x-sim-seed makes it repeatable."""
        seed = request.headers.get("x-sim-seed", "").strip()
        rng = random.Random(int(seed)) if seed.lstrip("-").isdigit() else self.rng
        shape = shaped.shape
        plan = generation.plan(
            profile, prompt.text, shape.max_tokens, cached, len(tokens), rng, shape
        )
        plan.cache_creation_tokens = created
        if provider.allow_fault_header and "[sim-delay-ms:" in prompt.text:
            plan.hold_back(self._prompt_delay_s(prompt.text))
        return plan

    async def _whole(
        self,
        wire: WireFormat,
        ctx: StreamContext,
        responder: Responder,
        truth: Truth,
        headers: list[tuple[str, str]],
    ) -> None:
        plan = ctx.plan
        await asyncio.sleep(max(0.0, truth.received_at + plan.end_s - _clock()))
        body = wire.whole_body(ctx)
        self._headers_out(
            truth, responder.start(200, [("content-type", "application/json"), *headers], len(body))
        )
        sent = responder.write(body)
        truth.end_at = responder.end()
        # The whole answer arrives at once: every token time is the body's send time.
        truth.first_token_at = truth.last_token_at = sent
        truth.first_answer_token_at = sent if plan.answer else None
        truth.output_tokens = plan.output_tokens
        truth.reasoning_tokens = plan.reasoning_tokens
        truth.hidden_tokens = plan.hidden_reasoning
        truth.streamed_tokens = plan.shown_tokens

    async def _stream(
        self,
        wire: WireFormat,
        ctx: StreamContext,
        responder: Responder,
        truth: Truth,
        headers: list[tuple[str, str]],
    ) -> None:
        timing = wire.timing_headers(truth.received_at)
        sse_headers = [
            ("content-type", wire.stream_content_type),
            ("cache-control", "no-cache"),
            *headers,
            *timing,
        ]
        if timing:
            truth.server_ms = float(timing[0][1])
        self._headers_out(truth, responder.start(200, sse_headers))
        faults = ctx.faults
        if "trickle" in faults:
            while not responder.closed:
                await asyncio.sleep(0.1)
                responder.write(b": keep-alive\n\n")
            return
        try:
            if "huge_line" in faults:
                responder.write(b"data: ")
                piece = b"x" * (1024 * 1024)
                for _ in range(50):
                    responder.write(piece)
                    await responder.drain()
                await responder.wait_closed()
                return
            if "huge_response" in faults:
                chunk = wire.huge_chunk()
                while True:
                    responder.write(chunk)
                    await responder.drain()
        except ConnectionError:
            return
        plan = ctx.plan
        final = None
        if ctx.cut is None:
            final = (plan.output_tokens, plan.reasoning_tokens, plan.hidden_reasoning)
        player = Player(responder, wire.steps(ctx), truth, self.lags_ms, plan.hidden_before, final)
        player.start()
        await player.done
        if ctx.server_ms is not None:
            truth.server_ms = ctx.server_ms


__all__ = ["FRAME", "REASONING", "SimulatorApp", "Truth"]
