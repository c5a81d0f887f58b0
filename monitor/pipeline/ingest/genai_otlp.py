"""Optional: each stored probe as OpenTelemetry GenAI client metrics, sent over OTLP/HTTP.

Off unless OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (the full URL) or OTEL_EXPORTER_OTLP_ENDPOINT
(`/v1/metrics` is appended) is set. Recorded where results are stored (monitor.pipeline.ingest,
once the transaction commits), so region workers need nothing extra and a redelivered result
is never counted twice. The official SDK aggregates in memory and exports from its own thread
every OTEL_METRIC_EXPORT_INTERVAL ms (60 s by default); the SDK also reads the standard
OTEL_EXPORTER_OTLP_HEADERS / _TIMEOUT / _COMPRESSION. The resource is the SDK's own detection
(OTEL_SERVICE_NAME, then OTEL_RESOURCE_ATTRIBUTES' service.name, then ours: "routewatch"; every
other OTEL_RESOURCE_ATTRIBUTES pair is kept). Each ingest process has its own cumulative series
(the resource's service.instance.id tells them apart); up to one export interval is lost if it
is killed.

Metrics (semantic conventions for GenAI client metrics, development status):
    gen_ai.client.operation.duration            s        request sent -> stream ended; for a
                                                         failed probe, -> the failure, with
                                                         error.type
    gen_ai.client.operation.time_to_first_chunk s        request sent -> first streamed token
    gen_ai.client.operation.time_per_output_chunk s      one value per chunk after the first:
                                                         the gap since the previous chunk
                                                         (probes.model.MAX_CHUNK_GAPS at most
                                                         per probe)
    gen_ai.client.token.usage                   {token}  billed input and output tokens
                                                         (completed probes only)
Attributes: gen_ai.operation.name ("chat"), gen_ai.provider.name (the well-known name for the
provider's preset, else its slug), gen_ai.request.model, gen_ai.response.model (when the
provider said), server.address / server.port, error.type on a failed probe (its error kind,
probes.errors.Kind: a low-cardinality class such as timeout_first_token or http_5xx; "_OTHER"
when none was given), and ours: routewatch.task, routewatch.region (where the probe ran).
Missed slots (no probe ran) and probes that failed before sending are not operations and are not
exported; /metrics counts them by kind.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import Histogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource

from monitor.models import OUTCOME_ERROR, OUTCOME_OK, Region, Route, Task
from monitor.stats.rollup_writes import ResultRow
from probes.model import MAX_CHUNK_GAPS

log = logging.getLogger(__name__)

# The semantic conventions' recommended bucket boundaries.
SECONDS_BOUNDARIES = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
TOKEN_BOUNDARIES = tuple(float(4**i) for i in range(14))  # 1, 4, 16, ... 67108864

# gen_ai.provider.name's well-known values, by provider preset (monitor.presets).
WELL_KNOWN_PROVIDERS = {
    "openai": "openai",
    "azure": "azure.ai.openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "groq": "groq",
    "mistral": "mistral_ai",
    "deepseek": "deepseek",
}


# Our service.name when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one.
DEFAULT_SERVICE_NAME = "routewatch"
# error.type when a failure carries no kind (the conventions' fallback value).
OTHER_ERROR = "_OTHER"


def resource() -> Resource:
    """The SDK's resource detection (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME, the SDK's own
    attributes), with our service name only where the environment gives none."""
    from_environment = OTELResourceDetector().detect()
    if SERVICE_NAME in from_environment.attributes:
        return Resource.create()
    return Resource.create({SERVICE_NAME: DEFAULT_SERVICE_NAME})


def endpoint() -> str:
    """The OTLP/HTTP metrics URL, or "" when export is off."""
    if settings.OTEL_EXPORTER_OTLP_METRICS_ENDPOINT:
        return settings.OTEL_EXPORTER_OTLP_METRICS_ENDPOINT
    if settings.OTEL_EXPORTER_OTLP_ENDPOINT:
        return settings.OTEL_EXPORTER_OTLP_ENDPOINT.rstrip("/") + "/v1/metrics"
    return ""


def enabled() -> bool:
    return bool(endpoint())


@dataclass
class _Exporter:
    pid: int
    provider: MeterProvider
    duration: Histogram
    first_chunk: Histogram
    per_chunk: Histogram
    tokens: Histogram


_lock = threading.Lock()
_exporter: _Exporter | None = None


def _get() -> _Exporter:
    """This process's exporter, made on first use (a Celery prefork child makes its own)."""
    global _exporter
    with _lock:
        if _exporter is None or _exporter.pid != os.getpid():
            reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint()))
            provider = MeterProvider(
                metric_readers=[reader],
                resource=resource(),
            )
            meter = provider.get_meter("routewatch.probes")
            _exporter = _Exporter(
                pid=os.getpid(),
                provider=provider,
                duration=meter.create_histogram(
                    "gen_ai.client.operation.duration",
                    unit="s",
                    description="GenAI operation duration.",
                    explicit_bucket_boundaries_advisory=SECONDS_BOUNDARIES,
                ),
                first_chunk=meter.create_histogram(
                    "gen_ai.client.operation.time_to_first_chunk",
                    unit="s",
                    description="Time to receive the first chunk in the response stream.",
                    explicit_bucket_boundaries_advisory=SECONDS_BOUNDARIES,
                ),
                per_chunk=meter.create_histogram(
                    "gen_ai.client.operation.time_per_output_chunk",
                    unit="s",
                    description="Time per output chunk, recorded for each chunk received "
                    "after the first one.",
                    explicit_bucket_boundaries_advisory=SECONDS_BOUNDARIES,
                ),
                tokens=meter.create_histogram(
                    "gen_ai.client.token.usage",
                    unit="{token}",
                    description="Number of input and output tokens used.",
                    explicit_bucket_boundaries_advisory=TOKEN_BOUNDARIES,
                ),
            )
        return _exporter


def flush(timeout_ms: int = 10_000) -> bool:
    """Export what is recorded now (tests; a worker about to stop)."""
    with _lock:
        exporter = _exporter
    return exporter.provider.force_flush(timeout_ms) if exporter is not None else True


def shutdown() -> None:
    """Export what is left and stop this process's exporter (the next record makes a new one)."""
    global _exporter
    with _lock:
        exporter, _exporter = _exporter, None
    if exporter is not None:
        exporter.provider.shutdown()


def _slot_key(task_id: Any, route_id: Any, region_id: Any, slot_at: Any) -> tuple[Any, ...]:
    return (task_id, route_id, region_id, slot_at)


def record(
    rows: Sequence[ResultRow],
    payloads: Sequence[Mapping[str, Any]],
    routes: Mapping[int, Route],
) -> int:
    """Record the stored results `rows` (with their payloads, for what rows do not carry);
    returns how many probes were recorded. Never raises: telemetry must not fail ingest."""
    try:
        return _record(rows, payloads, routes)
    except Exception:
        log.exception("OTLP export: recording %d results failed", len(rows))
        return 0


def _exported(r: ResultRow, routes: Mapping[int, Route]) -> bool:
    """Completed probes, and failed ones (missed slots never ran)."""
    return r.outcome in (OUTCOME_OK, OUTCOME_ERROR) and r.route_id in routes


def _record(
    rows: Sequence[ResultRow], payloads: Sequence[Mapping[str, Any]], routes: Mapping[int, Route]
) -> int:
    chosen = [r for r in rows if _exported(r, routes)]
    if not chosen:
        return 0
    extras: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for p in payloads:
        if p.get("slot_at"):
            at = datetime.fromisoformat(p["slot_at"])
            extras[_slot_key(p["task_id"], p["route_id"], p["region_id"], at)] = p
    tasks = dict(Task.objects.filter(pk__in={r.task_id for r in chosen}).values_list("pk", "slug"))
    regions = dict(
        Region.objects.filter(pk__in={r.region_id for r in chosen}).values_list("pk", "slug")
    )
    exporter = _get()
    recorded = 0
    for r in chosen:
        route = routes[r.route_id]
        extra = extras.get(_slot_key(r.task_id, r.route_id, r.region_id, r.slot_at), {})
        attributes = _attributes(route, tasks.get(r.task_id or 0, ""), regions.get(r.region_id, ""))
        if served := extra.get("served_model"):
            attributes["gen_ai.response.model"] = str(served)
        ok = r.outcome == OUTCOME_OK
        if ok:
            duration_ms = r.e2e_ms
        else:
            attributes["error.type"] = r.error_kind or OTHER_ERROR
            # A worker one release behind sends no failed_after_ms: an HTTP error's e2e_ms
            # (headers received) is then the failure's time.
            duration_ms = _number(extra.get("failed_after_ms"))
            duration_ms = r.e2e_ms if duration_ms is None else duration_ms
            if duration_ms is None:
                continue  # failed before sending (our configuration): no operation to time
        recorded += 1
        if duration_ms is not None:
            exporter.duration.record(duration_ms / 1000, attributes)
        if r.ttft_ms is not None:
            exporter.first_chunk.record(r.ttft_ms / 1000, attributes)
        gaps = extra.get("chunk_gaps_ms")
        if isinstance(gaps, list):
            for gap in gaps[:MAX_CHUNK_GAPS]:  # as stored
                if (gap_ms := _number(gap)) is not None:
                    exporter.per_chunk.record(gap_ms / 1000, attributes)
        elif (gap_ms := _number(extra.get("itl_p50_ms"))) is not None:
            # A worker one release behind keeps no per-chunk gaps: its median, once.
            exporter.per_chunk.record(gap_ms / 1000, attributes)
        if ok:
            for kind, n in (("input", r.input_tokens), ("output", r.output_tokens)):
                if n is not None:
                    exporter.tokens.record(n, {**attributes, "gen_ai.token.type": kind})
    return recorded


def _number(value: Any) -> float | None:
    """A finite, non-negative number from a payload, else None (the row's checks do not cover
    what only the export reads)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


def _attributes(route: Route, task: str, region: str) -> dict[str, str | int]:
    provider = route.provider
    url = urlsplit(provider.base_url)
    attributes: dict[str, str | int] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": WELL_KNOWN_PROVIDERS.get(provider.preset, provider.slug),
        "gen_ai.request.model": route.model_id,
        "routewatch.task": task,
        "routewatch.region": region,
    }
    if url.hostname:
        attributes["server.address"] = url.hostname
        attributes["server.port"] = url.port or (443 if url.scheme == "https" else 80)
    return attributes
