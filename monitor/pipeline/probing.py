"""Between the scheduler's messages and the probe engine: specs in, result payloads out.

Runs on region workers (no database). Grading happens here, after the probe, outside its
timed path. Payload keys are ProbeResult model field names (see monitor.pipeline.ingest).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings

import probes
from probes.graders import GraderError
from probes.model import ProbeResult as EngineResult
from probes.model import ProbeSpec

# Engine result fields stored as they are.
_COPIED = (
    "outcome",
    "error_kind",
    "error_detail",
    "dns_ms",
    "connect_ms",
    "tls_ms",
    "upload_ms",
    "request_bytes",
    "ttfb_ms",
    "ttft_ms",
    "ttfat_ms",
    "e2e_ms",
    "output_tokens",
    "token_source",
    "tps",
    "tpot_ms",
    "itl_p50_ms",
    "itl_max_ms",
    "input_tokens",
    "cached_tokens",
    "http_version",
    "ratelimit_remaining_requests",
    "ratelimit_remaining_tokens",
    "retry_after_s",
    "text",
)
# Bytes past which a response is cut off (a probe's answer is short; this is a hard bound).
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


def spec_for(message: Mapping[str, Any], connect_to: str | None, api_key: str) -> ProbeSpec:
    provider = message["provider"]
    timeout_s = float(message["timeout_s"])
    return ProbeSpec(
        base_url=provider["base_url"],
        connect_to=connect_to,
        format=provider["wire_format"],
        model=message["model"],
        api_key=api_key,
        system_prompt=message.get("system_prompt", ""),
        user_prompt=message.get("user_prompt", ""),
        input_tokens=int(message.get("input_tokens") or 0),
        max_tokens=int(message["max_tokens"]),
        http2=bool(message.get("http2")),
        body_encoding=message.get("body_encoding", "json"),
        cold=bool(message.get("cold")),
        fresh_prefix=message.get("prefix_mode") == "fresh",
        extra_headers=dict(provider.get("extra_headers") or {}),
        total_timeout_s=timeout_s,
        first_token_timeout_s=min(timeout_s, max(5.0, timeout_s * 0.75)),
        max_response_bytes=MAX_RESPONSE_BYTES,
        allow_private=settings.PROVIDER_ALLOW_PRIVATE_NETWORKS,
    )


def grade(result: EngineResult, case: Mapping[str, Any] | None) -> bool | None:
    if case is None or not result.ok:
        return None
    try:
        return probes.grade(
            case["grader"],
            result.text,
            case.get("expected") or "",
            case.get("json_schema"),
            float(case.get("tolerance") or 0.0),
        )
    except GraderError:
        return None  # an unusable eval case grades nothing (the admin form prevents most)


def payload(
    message: Mapping[str, Any], result: EngineResult, started_at: datetime
) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(result, name) for name in _COPIED}
    case = message.get("eval")
    data.update(message["slot"])
    data.update(
        {
            "started_at": started_at.isoformat(),
            "http2": bool(message.get("http2")),
            "body_encoding": message.get("body_encoding", "json"),
            "cold": bool(message.get("cold")),
            "prefix_mode": message.get("prefix_mode", "stable"),
            "max_tokens": message.get("max_tokens"),
            "eval_case_id": case["id"] if case else None,
            "quality_pass": grade(result, case),
        }
    )
    return data


async def run_messages(
    prepared: Sequence[tuple[Mapping[str, Any], str | None, str]], window_s: float = 5.0
) -> list[dict[str, Any]]:
    """Run (message, connect_to, api_key) triples with starts spread over `window_s`."""
    specs = [spec_for(message, connect_to, key) for message, connect_to, key in prepared]
    results = await probes.run_batch(specs, window_s=window_s, max_in_flight=200)
    perf_now, wall_now = time.perf_counter(), datetime.now(UTC)
    out = []
    for (message, _, _), result in zip(prepared, results, strict=True):
        ago = perf_now - result.t0_perf if result.t0_perf is not None else 0.0
        out.append(payload(message, result, wall_now - timedelta(seconds=ago)))
    return out


async def run_race(
    lanes: Mapping[str, tuple[Mapping[str, Any], str | None, str]],
    reference_ms: Mapping[str, float],
) -> dict[str, Any]:
    """Race the lanes (route id -> (message, connect_to, api_key)); the first complete answer
    that passes the eval case (when there is one) wins."""
    specs = {name: spec_for(message, target, key) for name, (message, target, key) in lanes.items()}
    # Every lane carries the same request, so the same eval case (monitor.pipeline.races).
    case = next((message.get("eval") for message, _, _ in lanes.values()), None)

    def valid(result: EngineResult) -> bool:
        return result.ok and grade(result, case) is not False

    started_at = datetime.now(UTC)
    outcome = await probes.race(specs, valid=valid, reference_ms=reference_ms)
    return {
        "started_at": started_at.isoformat(),
        "winner_route_id": outcome.winner,
        "winner_ms": outcome.winner_ms,
        "lanes": {
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
        },
    }
