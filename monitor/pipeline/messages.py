"""The wire contract: what crosses the broker between beat, region workers and ingest.

    beat --ProbeBatch (ProbeMessage per slot)--> probes.<region> --list[ResultPayload]--> ingest
    beat --RaceMessage (a ProbeMessage per lane)--> probes.<region> --RaceResult--> ingest
    beat --ScenarioMessage (a ProbeMessage + steps)--> probes.<region> --ScenarioPayload--> ingest

Every message is plain JSON (Celery's JSON serializer). Producers build the TypedDicts below, so
mypy checks them, and hand the `*_to_json` form to `monitor.tasks`; consumers read a message only
through a `*_from_json` function, which checks it against the same TypedDicts and raises
ContractError for one that does not match. Keys a newer producer adds are let through (a worker
or ingest one release behind keeps working); keys an older producer did not send yet get their
defaults here, so messages already queued before an upgrade are still accepted.

No Django here: the contract is importable by anything that speaks it.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import (
    Any,
    NotRequired,
    TypedDict,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

# Celery task names (stable: messages already queued and beat's schedule name them).
RUN_PROBE_BATCH = "monitor.tasks.run_probe_batch"
RUN_RACE = "monitor.tasks.run_race"
RUN_SCENARIO = "monitor.tasks.run_scenario"
INGEST_QUEUE = "ingest"

JsonObject = dict[str, Any]


class ContractError(ValueError):
    """A message that does not match its contract. The text names the field and what was
    expected, never the value: values are prompts, answers and encrypted keys."""


# --- beat -> region worker ------------------------------------------------------------------


class SlotKey(TypedDict):
    task_id: int
    route_id: int
    region_id: int
    slot_at: str  # ISO 8601


class ProviderSettings(TypedDict):
    slug: str
    base_url: str
    wire_format: str
    api_key_token: str  # Fernet token (monitor.crypto); "" = no key
    extra_headers: dict[str, str]
    # Amazon Bedrock: the region to sign for ("" = from the base URL's host). Absent from an
    # older scheduler's messages.
    aws_region: NotRequired[str]


class RequestSettings(TypedDict):
    """Per-route request settings as real APIs need them (PRODUCT.md, Route). Each maps to the
    ProbeSpec field of the same name; the secret headers travel encrypted like the API key."""

    token_limit_param: str  # "max_tokens" or "max_completion_tokens"
    reasoning_effort: str | None
    thinking_budget_tokens: int | None
    service_tier: str | None
    temperature: float | None
    extra_body: dict[str, Any]
    secret_headers_token: str  # Fernet token of a JSON object of headers; "" = none
    api_version: str | None


class EvalSpec(TypedDict):
    id: int
    grader: str
    expected: str
    json_schema: dict[str, Any] | None
    tolerance: float | None


class ProbeMessage(TypedDict):
    slot: SlotKey
    provider: ProviderSettings
    model: str
    system_prompt: str
    user_prompt: str
    input_tokens: int
    max_tokens: int
    http2: bool
    body_encoding: str
    cold: bool
    prefix_mode: str
    timeout_s: float
    eval: EvalSpec | None
    request: RequestSettings


class ProbeBatch(TypedDict):
    region: str  # slug
    probes: list[ProbeMessage]
    # When the tick planned the batch (Unix time, the scheduler's clock) and the spread of its
    # starts: probe i of n is planned at planned_at + i * window_s / n, and the worker measures
    # each probe's start lag against that (a batch without them is planned on arrival).
    planned_at: NotRequired[float]
    window_s: NotRequired[float]
    # True: the tick claimed the slots ahead of their time, and each probe is planned at its
    # slot's time instead; those whose time had come when the tick planned the batch, i of n,
    # at planned_at + i * window_s / n (monitor.pipeline.region.worker.planned_starts).
    at_slots: NotRequired[bool]


class RaceKey(TypedDict):
    task_id: int
    region_id: int
    slot_at: str  # ISO 8601


class RaceMessage(TypedDict):
    race: RaceKey
    lanes: dict[str, ProbeMessage]  # route id (as a string) -> the same request to each
    reference_ms: dict[str, float]  # route id -> its median e2e here over the last day
    timeout_s: float


class ScenarioStepSpec(TypedDict):
    """One step of a scenario (monitor.models.ScenarioStep; probes.scenario.Step)."""

    kind: str  # "sequential" | "fan-out"
    fan_out: int
    prompt: str  # {previous}, {step}, {branch}; the eval case's input already in
    input_tokens: int
    max_tokens: int  # the route's token limit for this step
    carry_context: bool
    timeout_s: float | None


class ScenarioMessage(TypedDict):
    """One scenario slot: `probe` says where and how (slot, provider, model, options, eval
    case for the validation, request settings; its prompts are unused), `steps` what."""

    probe: ProbeMessage
    steps: list[ScenarioStepSpec]
    timeout_s: float  # the whole scenario's deadline


# --- region worker -> ingest ----------------------------------------------------------------


class _ResultKeys(TypedDict):
    task_id: int | None
    route_id: int
    region_id: int
    slot_at: str | None  # null for ad-hoc probes
    started_at: str
    outcome: str


class ResultPayload(_ResultKeys, total=False):
    """One probe's result; keys are monitor.models.ProbeResult column names. The measured part
    is every engine result field that is also a column (monitor.pipeline.region.worker), so fields
    listed here are the ones known today: others flow through once both sides have them."""

    # the options probed
    http2: bool
    body_encoding: str
    cold: bool
    prefix_mode: str
    max_tokens: int | None
    eval_case_id: int | None
    quality_pass: bool | None
    # measured
    error_kind: str
    error_detail: str
    dns_ms: float | None
    connect_ms: float | None
    tls_ms: float | None
    upload_ms: float | None
    request_bytes: int | None
    ttfb_ms: float | None
    ttft_ms: float | None
    ttfat_ms: float | None
    e2e_ms: float | None
    failed_after_ms: float | None
    server_ms: float | None
    output_tokens: int | None
    token_source: str
    tps: float | None
    tpot_ms: float | None
    itl_p50_ms: float | None
    itl_max_ms: float | None
    chunk_gaps_ms: list[float] | None
    input_tokens: int | None
    cached_tokens: int | None
    http_version: str
    ratelimit_remaining_requests: int | None
    ratelimit_remaining_tokens: int | None
    retry_after_s: float | None
    text: str
    # planned start to actual start (ms; monitor.models.ProbeResult.start_lag_ms)
    start_lag_ms: float | None
    # Demo history (monitor.demo_history); ingest clears it on results from region workers.
    generated: bool


class LaneResult(TypedDict):
    elapsed_ms: float | None
    cancelled: bool
    tokens_paid: int
    saved_ms: float | None  # time the race saved against this route alone
    outcome: str  # an outcome, or "cancelled"
    error_kind: str
    input_tokens: int | None


class RaceResult(TypedDict):
    race: RaceKey
    started_at: str
    winner_route_id: str | None
    winner_ms: float | None
    lanes: dict[str, LaneResult]


class ScenarioPayload(TypedDict):
    """One scenario's result; `calls` are its calls' results (slot_at null, `step` set)."""

    slot: SlotKey
    started_at: str
    outcome: str
    error_kind: str
    error_detail: str
    failed_step: int | None
    app_e2e_ms: float | None
    calls_e2e_ms: float | None
    gaps_ms: list[float]
    validation_ms: float | None
    validation_pass: bool | None
    eval_case_id: int | None
    calls: list[ResultPayload]


# --- what the scheduler hands to monitor.tasks ------------------------------------------------


@dataclass(frozen=True)
class Dispatch:
    """One message to send, decided by the scheduler and sent by monitor.tasks (the one door
    to the broker): which Celery task, on which queue, until when, and what the tick reports
    for it (`tally` is counted under `tally_key`: a region slug, or "races")."""

    task_name: str
    queue: str
    message: JsonObject
    expires: datetime
    tally_key: str
    tally: int


# --- defaults for keys older producers did not send --------------------------------------------


def default_request_settings() -> RequestSettings:
    return {
        "token_limit_param": "max_tokens",
        "reasoning_effort": None,
        "thinking_budget_tokens": None,
        "service_tier": None,
        "temperature": None,
        "extra_body": {},
        "secret_headers_token": "",
        "api_version": None,
    }


# Probe message keys the first worker read with a default (and so may be absent).
_PROBE_DEFAULTS: dict[str, Any] = {
    "system_prompt": "",
    "user_prompt": "",
    "input_tokens": 0,
    "http2": False,
    "body_encoding": "json",
    "cold": False,
    "prefix_mode": "stable",
    "eval": None,
}
# A lane that could not start was sent with only these three keys.
_LANE_DEFAULTS: dict[str, Any] = {
    "elapsed_ms": None,
    "cancelled": False,
    "saved_ms": None,
    "input_tokens": None,
}


# --- to JSON (producers) --------------------------------------------------------------------


def probe_batch_to_json(batch: ProbeBatch) -> JsonObject:
    out: JsonObject = {"region": batch["region"], "probes": [dict(p) for p in batch["probes"]]}
    for key in ("planned_at", "window_s", "at_slots"):
        if key in batch:
            out[key] = batch[key]
    return out


def race_message_to_json(message: RaceMessage) -> JsonObject:
    return dict(message)


def results_to_json(results: list[ResultPayload]) -> list[JsonObject]:
    return [dict(r) for r in results]


def race_result_to_json(result: RaceResult) -> JsonObject:
    return dict(result)


def scenario_message_to_json(message: ScenarioMessage) -> JsonObject:
    return {
        **message,
        "probe": dict(message["probe"]),
        "steps": [dict(s) for s in message["steps"]],
    }


def scenario_payload_to_json(payload: ScenarioPayload) -> JsonObject:
    return {**payload, "calls": [dict(c) for c in payload["calls"]]}


# --- from JSON (consumers) ------------------------------------------------------------------


def probe_message_from_json(data: object, path: str = "probe") -> ProbeMessage:
    obj = _object(data, path)
    request = obj.get("request", {})
    message = {
        **_PROBE_DEFAULTS,
        **obj,
        "request": {**default_request_settings(), **_object(request, f"{path}.request")},
    }
    _check(message, ProbeMessage, path)
    return cast(ProbeMessage, message)


def probe_batch_from_json(
    data: object, on_bad_probe: Callable[[ContractError], None] | None = None
) -> ProbeBatch:
    """The batch; a probe message that does not match raises, or, with `on_bad_probe`, is
    reported to it and left out (the batch's other probes still run)."""
    obj = _object(data, "batch")
    _check(obj.get("region"), str, "batch.region")
    probes = obj.get("probes")
    if not isinstance(probes, list):
        raise ContractError(f"batch.probes: expected a list, got {_kind(probes)}")
    good: list[ProbeMessage] = []
    for i, item in enumerate(probes):
        try:
            good.append(probe_message_from_json(item, f"batch.probes[{i}]"))
        except ContractError as exc:
            if on_bad_probe is None:
                raise
            on_bad_probe(exc)
    batch: ProbeBatch = {"region": obj["region"], "probes": good}
    for key in ("planned_at", "window_s"):
        value = obj.get(key)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (math.isfinite(value) and value >= 0)
        ):
            raise ContractError(f"batch.{key}: expected a finite number >= 0")
        batch[key] = float(value)
    at_slots = obj.get("at_slots")
    if at_slots is not None:
        _check(at_slots, bool, "batch.at_slots")
        batch["at_slots"] = bool(at_slots)
    return batch


def race_message_from_json(data: object) -> RaceMessage:
    obj = _object(data, "race message")
    lanes = _object(obj.get("lanes"), "race message.lanes")
    message = {
        **obj,
        "lanes": {
            name: probe_message_from_json(lane, f"race message.lanes[{name[:40]!r}]")
            for name, lane in lanes.items()
        },
    }
    _check(message, RaceMessage, "race message")
    return cast(RaceMessage, message)


def result_payload_from_json(data: object) -> ResultPayload:
    obj = _object(data, "result")
    _check(obj, ResultPayload, "result")
    return cast(ResultPayload, obj)


def result_key(data: object) -> str:
    """Which slot a (maybe malformed) result payload is for, for a log line: ids only."""
    if not isinstance(data, Mapping):
        return "?"
    ids = [data.get(k) for k in ("task_id", "route_id", "region_id")]
    shown = "/".join(str(i) if isinstance(i, int) else "?" for i in ids)
    slot_at = data.get("slot_at")
    return f"{shown} {slot_at if isinstance(slot_at, str) and len(slot_at) <= 40 else '?'}"


def race_result_from_json(data: object) -> RaceResult:
    obj = _object(data, "race result")
    lanes = _object(obj.get("lanes"), "race result.lanes")
    result = {
        **obj,
        "lanes": {
            name: {**_LANE_DEFAULTS, **_object(lane, f"race result.lanes[{name[:40]!r}]")}
            for name, lane in lanes.items()
        },
    }
    _check(result, RaceResult, "race result")
    return cast(RaceResult, result)


def scenario_message_from_json(data: object) -> ScenarioMessage:
    obj = _object(data, "scenario")
    message = {**obj, "probe": probe_message_from_json(obj.get("probe"), "scenario.probe")}
    _check(message, ScenarioMessage, "scenario")
    return cast(ScenarioMessage, message)


def scenario_payload_from_json(data: object) -> ScenarioPayload:
    obj = _object(data, "scenario result")
    _check(obj, ScenarioPayload, "scenario result")
    return cast(ScenarioPayload, obj)


# --- the checker: a JSON value against a TypedDict's annotations ------------------------------


def _object(data: object, path: str) -> dict[str, Any]:
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ContractError(f"{path}: expected an object, got {_kind(data)}")
    return data


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


@cache
def _hints(typed_dict: type) -> dict[str, Any]:
    return get_type_hints(typed_dict)


def _name(expected: Any) -> str:
    if expected is type(None):
        return "null"
    if get_origin(expected) in (Union, types.UnionType):
        return " or ".join(_name(arm) for arm in get_args(expected))
    return getattr(expected, "__name__", str(expected))


def _check(value: object, expected: Any, path: str) -> None:
    """Raise ContractError unless `value` (decoded JSON) has the type `expected`."""
    _validator(expected)(value, path)


_Validator = Callable[[object, str], None]


def _scalar(expected: Any) -> Callable[[object], bool] | None:
    """The test for a JSON scalar of type `expected` (None: not a scalar type)."""
    if expected is type(None):
        return lambda v: v is None
    if expected is bool:
        return lambda v: isinstance(v, bool)
    if expected is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if expected is float:  # JSON does not tell 2 from 2.0
        return lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    if expected is str:
        return lambda v: isinstance(v, str)
    return None


@cache
def _validator(expected: Any) -> _Validator:
    """The check for `expected`, built once per type: ingest checks every result of every
    message (a region's 2 s of results, the demo's week), so the annotations are read here
    and not again per value."""
    if expected is Any:
        return lambda value, path: None
    name = _name(expected)
    origin = get_origin(expected)
    if origin in (Union, types.UnionType):
        return _union(expected, name)
    if is_typeddict(expected):
        fields = [
            (key, _validator(annotation), key in expected.__required_keys__)
            for key, annotation in _hints(expected).items()  # in the order they are declared
        ]

        def check_object(value: object, path: str) -> None:
            obj = _object(value, path)
            for key, check, required in fields:
                if key in obj:
                    check(obj[key], f"{path}.{key}")
                elif required:
                    raise ContractError(f"{path}.{key}: missing")

        return check_object
    if origin is dict:
        member = _validator(get_args(expected)[1])

        def check_dict(value: object, path: str) -> None:
            for key, item in _object(value, path).items():
                member(item, f"{path}[{key[:40]!r}]")

        return check_dict
    if origin is list:
        element = _validator(get_args(expected)[0])

        def check_list(value: object, path: str) -> None:
            if not isinstance(value, list):
                raise ContractError(f"{path}: expected a list, got {_kind(value)}")
            for i, item in enumerate(value):
                element(item, f"{path}[{i}]")

        return check_list
    test = _scalar(expected)
    if test is None:  # pragma: no cover (a contract type this checker does not know)
        raise TypeError(f"no check for {expected!r}")

    def check_scalar(value: object, path: str) -> None:
        if not test(value):
            raise ContractError(f"{path}: expected {name}, got {_kind(value)}")

    return check_scalar


def _union(expected: Any, name: str) -> _Validator:
    every = get_args(expected)
    arms = [arm for arm in every if arm is not type(None)]
    nullable = len(arms) < len(every)
    if len(arms) == 1 and (is_typeddict(arms[0]) or get_origin(arms[0]) in (dict, list)):
        inner = _validator(arms[0])  # an optional object: say what inside it is wrong

        def check_optional(value: object, path: str) -> None:
            if value is None and nullable:
                return
            inner(value, path)

        return check_optional
    tests = [_scalar(arm) for arm in arms]
    if all(t is not None for t in tests):  # scalars only: no exception per arm tried
        scalar_tests = [t for t in tests if t is not None]

        def check_scalars(value: object, path: str) -> None:
            if value is None and nullable:
                return
            if not any(t(value) for t in scalar_tests):
                raise ContractError(f"{path}: expected {name}, got {_kind(value)}")

        return check_scalars
    checks = [_validator(arm) for arm in arms]

    def check_any(value: object, path: str) -> None:
        if value is None and nullable:
            return
        for check in checks:
            try:
                check(value, path)
            except ContractError:
                continue
            return
        raise ContractError(f"{path}: expected {name}, got {_kind(value)}")

    return check_any
