"""The region worker: a batch or race message in, probes run, result payloads out.

Runs inside a Celery worker that may have no database at all (RW_WORKER_ONLY): everything it
needs is in the message (monitor.pipeline.messages), except its region's keys (RW_REGION_KEYS),
which open the provider keys and secret headers the beat re-encrypted for this region, and only
for the origin they were entered for (monitor.pipeline.signing.open_secret). Probes run on one event loop per worker
process that lives as long as the process, so warm connections (one pooled client per
endpoint) survive from one batch to the next. Grading happens here, after the probe, outside
its timed path. A message that does not match the contract is logged and dropped, never
retried into a crash loop; a probe that cannot start (a key it cannot decrypt, a request
setting this engine lacks) becomes a `config` result, which is ours, not the provider's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from django.conf import settings

import probes
from monitor import limits
from monitor.logfilters import register_secret
from monitor.models import ProbeResult, aws_credentials
from monitor.pipeline.messages import (
    ContractError,
    EvalSpec,
    LaneResult,
    ProbeBatch,
    ProbeMessage,
    RaceResult,
    ResultPayload,
    probe_batch_from_json,
    race_message_from_json,
)
from monitor.pipeline.region import clock
from monitor.pipeline.signing import SecretRefused, open_secret
from probes.errors import Kind
from probes.graders import GraderError
from probes.model import Measurement, ProbeSpec

log = logging.getLogger(__name__)
T = TypeVar("T")

# Bytes past which a response is cut off (a probe's answer is short; this is a hard bound).
MAX_RESPONSE_BYTES = 8 * 1024 * 1024

# The payload's measured part: every engine result field that is also a result column, so a
# field the engine adds (served_model, service_tier, ...) travels once the model has its
# column. The worker fills the slot key and the options probed itself.
_SET_BY_WORKER = {
    "task_id",
    "route_id",
    "region_id",
    "slot_at",
    "started_at",
    "http2",
    "body_encoding",
    "cold",
    "prefix_mode",
    "max_tokens",
    "eval_case_id",
    "quality_pass",
    "cost_usd",
}
# Engine fields that travel to ingest without a column: read there (the OpenTelemetry export
# records each gap between chunks), never stored (up to 2 kB a row).
PAYLOAD_ONLY = ("chunk_gaps_ms",)
MEASURED = (
    *(
        f.name
        for f in dataclasses.fields(Measurement)
        if f.name in {c.attname for c in ProbeResult._meta.concrete_fields} - _SET_BY_WORKER
    ),
    *PAYLOAD_ONLY,
)

# Per-route request settings (messages.RequestSettings) map to ProbeSpec fields of the same
# name (the secret headers decrypted); each with the value that means "not set".
# A setting is passed only when it is set, so a region worker still running an older engine
# builds its ProbeSpec from messages that use none of the newer settings, and fails a probe
# that needs one as `config` (see `spec_for`) rather than sending a different request.
UNSET_REQUEST_SETTINGS: dict[str, Any] = {
    "token_limit_param": "max_tokens",
    "reasoning_effort": None,
    "thinking_budget_tokens": None,
    "service_tier": None,
    "temperature": None,
    "extra_body": {},
    "secret_headers": {},
    "api_version": None,
}
_SPEC_FIELDS = {f.name for f in dataclasses.fields(ProbeSpec)}


class Unusable(Exception):
    """A probe that cannot start because of our configuration (its result is `config`)."""


# --- the event loop that outlives batches ------------------------------------------------------

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="probe-loop", daemon=True).start()
            _loop = loop
        return _loop


@dataclasses.dataclass
class Load:
    """What this worker process carries now, and has carried since it started. Written on the
    probe loop only; read from other threads (the liveness beacon), where a stale int is fine."""

    in_flight: int = 0  # probes (and scenario calls) running now
    started: int = 0  # probes started
    late: int = 0  # probes not started: past START_LAG_MAX_SECONDS (recorded missed)
    peak: int = 0  # the most in flight at once
    holding: int = 0  # messages held (pool threads busy); changed under _holding_lock


LOAD = Load()
_gate: asyncio.Semaphore | None = None
_holding_lock = threading.Lock()


@contextlib.contextmanager
def holding() -> Iterator[None]:
    """Count a message (batch, race or scenario) this worker holds while it runs (a pool
    thread each)."""
    with _holding_lock:
        LOAD.holding += 1
    try:
        yield
    finally:
        with _holding_lock:
            LOAD.holding -= 1


def _probe_gate() -> asyncio.Semaphore:
    """The process's bound on probes in flight (settings.PROBES_IN_FLIGHT_MAX), shared by
    every batch the worker holds; made on the probe loop, its only user."""
    global _gate
    if _gate is None:
        _gate = asyncio.Semaphore(settings.PROBES_IN_FLIGHT_MAX)
    return _gate


@contextlib.asynccontextmanager
async def carrying() -> Any:
    """Count a probe (or a scenario's call) in flight for as long as it runs."""
    LOAD.in_flight += 1
    LOAD.started += 1
    LOAD.peak = max(LOAD.peak, LOAD.in_flight)
    try:
        yield
    finally:
        LOAD.in_flight -= 1


def run_on_loop(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """Run on the probe loop, waiting at most timeout_s. Whatever ends the wait early (the
    timeout, Celery's soft time limit, a shutdown) cancels the coroutine: no probe keeps
    running, and paying, on the loop after its batch has given up on it."""
    future = asyncio.run_coroutine_threadsafe(coro, _background_loop())
    try:
        return future.result(timeout_s)
    except BaseException:
        future.cancel()  # cancels the task on the loop (asyncio chains the two futures)
        raise


# --- from a message to a ProbeSpec -------------------------------------------------------------


def connect_to_map(entries: list[str]) -> dict[str, str]:
    """Parse RW_CONNECT_TO ("host:port=host:port,...")."""
    mapping = {}
    for entry in entries:
        source, _, target = entry.partition("=")
        if not source or not target:
            raise ValueError(f"RW_CONNECT_TO entry {entry!r} is not HOST:PORT=HOST:PORT")
        mapping[source.strip()] = target.strip()
    return mapping


def connect_to(base_url: str, mapping: Mapping[str, str]) -> str | None:
    """Where to connect for this provider: the region's detour for its host:port, if any.
    The URL, Host header and TLS name stay the provider's."""
    parts = urlsplit(base_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return mapping.get(f"{parts.hostname}:{port}")


def secret_headers(token: str, base_url: str) -> dict[str, str]:
    """Decrypt a route's secret headers (a JSON object of strings); {} when there are none.
    They open only for the origin they were entered for."""
    if not token:
        return {}
    try:
        headers = json.loads(open_secret(token, base_url))
    except SecretRefused as exc:
        raise Unusable(f"secret headers refused: {exc}") from None
    except ValueError:
        # Said without the decoder's message: it would point into the plaintext, the secret.
        raise Unusable("secret headers are not a JSON object") from None
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise Unusable("secret headers are not a JSON object of strings")
    for value in headers.values():
        register_secret(value)  # kept out of every log line, like API keys
    return headers


def spec_kwargs(
    message: ProbeMessage, connect_to: str | None, api_key: str, headers: Mapping[str, str]
) -> dict[str, Any]:
    """ProbeSpec's arguments for a message: the request settings only when set."""
    provider = message["provider"]
    request = message["request"]
    timeout_s = float(message["timeout_s"])
    kwargs: dict[str, Any] = {
        "base_url": provider["base_url"],
        "connect_to": connect_to,
        "format": provider["wire_format"],
        "model": message["model"],
        "api_key": api_key,
        "system_prompt": message["system_prompt"],
        "user_prompt": message["user_prompt"],
        "input_tokens": message["input_tokens"],
        "max_tokens": message["max_tokens"],
        "http2": message["http2"],
        "body_encoding": message["body_encoding"],
        "cold": message["cold"],
        "fresh_prefix": message["prefix_mode"] == "fresh",
        "extra_headers": dict(provider["extra_headers"]),
        "total_timeout_s": timeout_s,
        "first_token_timeout_s": min(timeout_s, max(5.0, timeout_s * 0.75)),
        "max_response_bytes": MAX_RESPONSE_BYTES,
        "allow_private": settings.PROVIDER_ALLOW_PRIVATE_NETWORKS,
    }
    requested: dict[str, Any] = {
        "token_limit_param": request["token_limit_param"],
        "reasoning_effort": request["reasoning_effort"],
        "thinking_budget_tokens": request["thinking_budget_tokens"],
        "service_tier": request["service_tier"],
        "temperature": request["temperature"],
        "extra_body": request["extra_body"],
        "secret_headers": dict(headers),
        "api_version": request["api_version"],
    }
    kwargs.update({k: v for k, v in requested.items() if v != UNSET_REQUEST_SETTINGS[k]})
    return kwargs


def spec_for(message: ProbeMessage, mapping: Mapping[str, str]) -> ProbeSpec:
    """The probe to run for a message; raises Unusable when it cannot start."""
    provider = message["provider"]
    token = provider["api_key_token"]
    try:
        api_key = open_secret(token, provider["base_url"])
    except SecretRefused as exc:
        # Never sent anywhere: a key for another origin, another region, or none we can open.
        log.error("refused the API key of provider %s: %s", provider["slug"][:50], exc)
        raise Unusable(f"API key refused: {exc}") from None
    headers = secret_headers(message["request"]["secret_headers_token"], provider["base_url"])
    kwargs = spec_kwargs(message, connect_to(provider["base_url"], mapping), api_key, headers)
    # Bedrock: its stored key is SigV4 credentials (Provider.set_aws_credentials) or an API key.
    credentials = aws_credentials(api_key) if provider["wire_format"] == "bedrock" else None
    if credentials is not None:
        register_secret(credentials[1])
        kwargs["api_key"] = ""
        kwargs["aws_access_key_id"], kwargs["aws_secret_access_key"] = credentials
    if provider.get("aws_region"):
        kwargs["aws_region"] = provider["aws_region"]
    unknown = sorted(set(kwargs) - _SPEC_FIELDS)
    if unknown:  # a worker older than the scheduler that sent the message
        raise Unusable(f"this worker's probe engine has no request setting {', '.join(unknown)}")
    return ProbeSpec(**kwargs)


# --- from an engine result to a payload --------------------------------------------------------


def grade(result: Measurement, case: EvalSpec | None) -> bool | None:
    if case is None or not result.ok:
        return None
    try:
        return probes.grade(
            case["grader"],
            result.text,
            case["expected"] or "",
            case["json_schema"],
            float(case["tolerance"] or 0.0),
        )
    except GraderError:
        return None  # an unusable eval case grades nothing (the admin form prevents most)


def late_payload(message: ProbeMessage, lag_s: float) -> ResultPayload:
    """The slot of a probe this worker did not start: it was past START_LAG_MAX_SECONDS after
    its planned start, too late to be comparable. Recorded missed (stamped at its slot, as
    the sweep's missed rows are), with its lag, so the region's health shows why."""
    detail = (
        f"started late: {lag_s:.1f} s after its planned start (the bound is "
        f"{settings.START_LAG_MAX_SECONDS} s); the region's worker was saturated or its "
        "queue backed up"
    )
    out = error_payload(message, Kind.MISSED, detail)
    out["outcome"] = "missed"
    out["started_at"] = message["slot"]["slot_at"]  # as the sweep stamps a missed slot
    out["start_lag_ms"] = round(lag_s * 1000, 3)
    return out


def payload(message: ProbeMessage, result: Measurement, started_at: datetime) -> ResultPayload:
    case = message["eval"]
    slot = message["slot"]
    known: ResultPayload = {
        "task_id": slot["task_id"],
        "route_id": slot["route_id"],
        "region_id": slot["region_id"],
        "slot_at": slot["slot_at"],
        "started_at": started_at.isoformat(),
        "outcome": result.outcome,
        "http2": message["http2"],
        "body_encoding": message["body_encoding"],
        "cold": message["cold"],
        "prefix_mode": message["prefix_mode"],
        "max_tokens": message["max_tokens"],
        "eval_case_id": case["id"] if case else None,
        "quality_pass": grade(result, case),
    }
    measured = {name: getattr(result, name) for name in MEASURED}
    # Measured fields are chosen at run time (MEASURED), so the whole is cast; ingest checks
    # every key it stores against ResultPayload and the column types.
    return cast(ResultPayload, {**measured, **known})


def error_payload(message: ProbeMessage, kind: str, detail: str) -> ResultPayload:
    """A result for a probe that could not even start (our configuration)."""
    slot = message["slot"]
    return {
        "task_id": slot["task_id"],
        "route_id": slot["route_id"],
        "region_id": slot["region_id"],
        "slot_at": slot["slot_at"],
        "started_at": _central_now().isoformat(),
        "outcome": "error",
        "error_kind": kind,
        "error_detail": detail[:500],
    }


def _central_now() -> datetime:
    """Now by the central clock (monitor.pipeline.region.clock): what ingest judges a start by."""
    return datetime.fromtimestamp(clock.now(), UTC)


# --- running them ----------------------------------------------------------------------------


def _bound_s(prepared: list[tuple[ProbeMessage, ProbeSpec]], last_start_s: float) -> float:
    """How long a batch may run: until its last planned start, its longest deadline (never
    above the longest allowed) and some slack, which stays under the task's soft time limit
    (monitor.limits)."""
    longest = max((float(m["timeout_s"]) for m, _ in prepared), default=0.0)
    return (
        max(0.0, last_start_s)
        + min(longest, limits.PROBE_TIMEOUT_MAX_S)
        + settings.START_LAG_MAX_SECONDS
        + limits.AFTER_PROBES_S / 2
    )


def planned_starts(
    batch: ProbeBatch, messages: list[ProbeMessage], received_at: float
) -> list[float]:
    """Each probe's planned start (Unix time, the central clock). A batch whose slots the tick
    claimed ahead (`at_slots`) plans each probe at its slot's time, and those whose time had
    already come when the tick planned the batch (a tick that ran late, a scheduler catching
    up) spread over the batch's window from then. An older batch spreads them all over its
    window from when the tick planned it, or from its arrival when it does not say."""
    window_s = float(batch.get("window_s", min(settings.TICK_SECONDS, limits.BATCH_SPREAD_MAX_S)))
    window_s = min(max(0.0, window_s), float(limits.BATCH_SPREAD_MAX_S))
    start = float(batch.get("planned_at", received_at))
    if batch.get("at_slots"):
        # Never further ahead than the tick may claim (a bound on how long a batch holds a
        # thread).
        latest = start + limits.SCHEDULE_AHEAD_MAX_S
        planned = [
            min(datetime.fromisoformat(m["slot"]["slot_at"]).timestamp(), latest) for m in messages
        ]
    else:
        planned = [0.0] * len(messages)  # an older batch: every probe spread from `start`
    overdue = [i for i, at in enumerate(planned) if at < start]
    step = window_s / len(overdue) if overdue else 0.0
    for k, i in enumerate(overdue):
        planned[i] = start + k * step
    return planned


async def _probe_all(
    prepared: list[tuple[ProbeMessage, ProbeSpec]],
    planned: list[float],
    done: Callable[[ResultPayload], None] | None = None,
) -> list[ResultPayload]:
    """Run each probe at its planned start (Unix time), within the process's bound on probes
    in flight; a payload each (also handed to `done` as each ends). A probe still waiting
    START_LAG_MAX_SECONDS after its planned start is not run (`late_payload`)."""
    gate = _probe_gate()
    too_late_s = float(settings.START_LAG_MAX_SECONDS)

    async def one(i: int, message: ProbeMessage, spec: ProbeSpec) -> ResultPayload:
        delay = planned[i] - clock.now()
        if delay > 0:
            await asyncio.sleep(delay)
        async with gate:
            lag_s = max(0.0, clock.now() - planned[i])
            if lag_s > too_late_s:
                LOAD.late += 1
                out = late_payload(message, lag_s)
            else:
                async with carrying():
                    result = await probes.probe(spec)
                ago = time.perf_counter() - result.t0_perf if result.t0_perf is not None else 0.0
                out = payload(message, result, _central_now() - timedelta(seconds=ago))
                out["start_lag_ms"] = round(lag_s * 1000, 3)
        if done is not None:
            done(out)
        return out

    return list(await asyncio.gather(*(one(i, m, spec) for i, (m, spec) in enumerate(prepared))))


def _reject_probe(exc: ContractError) -> None:
    log.error("rejected a probe message (left out of its batch): %s", exc)


# A batch's thread hands its ended probes on at most this often (it wakes for them).
MIN_HAND_OVER_S = 0.05


def run_streaming(
    coro: Coroutine[Any, Any, T],
    timeout_s: float,
    ended: queue.Queue[ResultPayload],
    emit: Callable[[list[ResultPayload]], None],
    every_s: float,
) -> T:
    """`run_on_loop`, handing the payloads the coroutine puts in `ended` to `emit` every
    `every_s` seconds (in this thread: the loop never waits for the broker), the rest at the
    end. Whatever ends the wait early (the batch's bound, the task's time limit) cancels the
    coroutine, as run_on_loop does, after handing on what had ended: nothing measured is
    dropped with the rest."""
    future = asyncio.run_coroutine_threadsafe(coro, _background_loop())
    deadline = time.monotonic() + timeout_s
    chunk: list[ResultPayload] = []
    flush_at = time.monotonic() + every_s

    def hand_on_the_rest() -> None:
        while True:
            try:
                chunk.append(ended.get_nowait())
            except queue.Empty:
                break
        if chunk:
            emit(chunk)

    try:
        while not future.done():
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"batch still running after {timeout_s:.0f} s")
            with contextlib.suppress(queue.Empty):
                chunk.append(ended.get(timeout=max(0.01, min(flush_at, deadline) - now)))
            if time.monotonic() >= flush_at:
                if chunk:
                    emit(chunk)
                    chunk = []
                flush_at = time.monotonic() + every_s
        result = future.result()
    except BaseException:
        future.cancel()
        hand_on_the_rest()
        raise
    hand_on_the_rest()
    return result


def run_batch(
    data: object,
    emit: Callable[[list[ResultPayload]], None] | None = None,
    every_s: float | None = None,
) -> list[ResultPayload]:
    """Run one region batch (a ProbeBatch as JSON); returns one result payload per probe.
    A batch that does not match the contract is logged and dropped: its slots are recorded
    missed at their deadlines. With `emit`, results are also handed to it as they end, in
    chunks every `every_s` seconds (RESULT_FLUSH_SECONDS unless given; at least 50 ms), so
    ingest lag is a second or so, not the batch's whole spread of starts: one tick."""
    received_at = clock.now()
    try:
        batch = probe_batch_from_json(data, on_bad_probe=_reject_probe)
    except ContractError as exc:
        log.error("rejected a probe batch: %s", exc)
        return []
    mapping = connect_to_map(settings.CONNECT_TO)
    prepared: list[tuple[ProbeMessage, ProbeSpec]] = []
    payloads: list[ResultPayload] = []
    for message in batch["probes"]:
        try:
            prepared.append((message, spec_for(message, mapping)))
        except Unusable as exc:
            payloads.append(error_payload(message, Kind.CONFIG, str(exc)))
    if prepared:
        # Each probe at its slot's time, or spread over the tick's window, as planned.
        planned = planned_starts(batch, [m for m, _ in prepared], received_at)
        bound = _bound_s(prepared, max(planned) - clock.now())
        if emit is None:
            payloads.extend(run_on_loop(_probe_all(prepared, planned), bound))
        else:
            if payloads:
                emit(list(payloads))
            ended: queue.Queue[ResultPayload] = queue.Queue()
            payloads.extend(
                run_streaming(
                    _probe_all(prepared, planned, ended.put),
                    bound,
                    ended,
                    emit,
                    max(
                        MIN_HAND_OVER_S,
                        settings.RESULT_FLUSH_SECONDS if every_s is None else every_s,
                    ),
                )
            )
    elif emit is not None and payloads:
        emit(list(payloads))
    return payloads


async def _race(
    lanes: Mapping[str, tuple[ProbeMessage, ProbeSpec]], reference_ms: Mapping[str, float]
) -> tuple[datetime, probes.RaceMeasurement]:
    """Race the lanes (route id -> (message, spec)); the first complete answer that passes
    the eval case (when there is one) wins."""
    # Every lane carries the same request, so the same eval case (monitor.pipeline.beat.races).
    case = next((message["eval"] for message, _ in lanes.values()), None)

    def valid(result: Measurement) -> bool:
        return result.ok and grade(result, case) is not False

    started_at = _central_now()
    specs = {name: spec for name, (_, spec) in lanes.items()}
    return started_at, await probes.race(specs, valid=valid, reference_ms=reference_ms)


def run_race(data: object) -> RaceResult | None:
    """Run one race (a RaceMessage as JSON); returns its result for
    monitor.pipeline.ingest.races.ingest, or None for a message that does not match the contract
    (logged; the race is recorded missed at its deadline)."""
    try:
        message = race_message_from_json(data)
    except ContractError as exc:
        log.error("rejected a race message: %s", exc)
        return None
    mapping = connect_to_map(settings.CONNECT_TO)
    lanes: dict[str, tuple[ProbeMessage, ProbeSpec]] = {}
    unusable: dict[str, LaneResult] = {}
    for route_id, lane in message["lanes"].items():
        try:
            lanes[route_id] = (lane, spec_for(lane, mapping))
        except Unusable:
            # The lane cannot start; the race goes on without it and says why.
            unusable[route_id] = {
                "elapsed_ms": None,
                "cancelled": False,
                "tokens_paid": 0,
                "saved_ms": None,
                "outcome": "error",
                "error_kind": Kind.CONFIG,
                "input_tokens": None,
            }
    timeout_s = min(float(message["timeout_s"]), limits.PROBE_TIMEOUT_MAX_S)
    bound_s = timeout_s + limits.AFTER_PROBES_S / 2
    started_at, outcome = run_on_loop(_race(lanes, message["reference_ms"]), bound_s)
    results: dict[str, LaneResult] = {
        name: {
            "elapsed_ms": lane.elapsed_ms,
            "cancelled": lane.cancelled,
            "tokens_paid": lane.tokens_paid,
            "saved_ms": lane.saved_ms,
            "outcome": lane.result.outcome if lane.result else "cancelled",
            "error_kind": lane.result.error_kind if lane.result else "",
            "input_tokens": lane.result.input_tokens if lane.result else None,
        }
        for name, lane in outcome.lanes.items()
    }
    return {
        "race": message["race"],
        "started_at": started_at.isoformat(),
        "winner_route_id": outcome.winner,
        "winner_ms": outcome.winner_ms,
        "lanes": {**results, **unusable},
    }
