"""Optional: each stored probe as OpenTelemetry GenAI client metrics, sent over OTLP/HTTP.

Off unless OTEL_EXPORTER_OTLP_METRICS_ENDPOINT (the full URL) or OTEL_EXPORTER_OTLP_ENDPOINT
(`/v1/metrics` is appended) is set. Recorded where results are stored (monitor.pipeline.ingest,
once the transaction commits), so region workers need nothing extra and a redelivered result
is never counted twice. The official SDK aggregates in memory and exports from its own thread
every OTEL_METRIC_EXPORT_INTERVAL ms (60 s by default); the SDK also reads the standard
OTEL_EXPORTER_OTLP_HEADERS / _TIMEOUT / _COMPRESSION, OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES. Each ingest process has its own cumulative series (the resource's
service.instance.id tells them apart); up to one export interval is lost if it is killed.

Metrics (semantic conventions for GenAI client metrics, development status), for successful
probes:
    gen_ai.client.operation.duration            s        request sent -> stream ended
    gen_ai.client.operation.time_to_first_chunk s        request sent -> first streamed token
    gen_ai.client.operation.time_per_output_chunk s      ONE value per probe: its median gap
                                                         between content chunks (the stored
                                                         result keeps no per-chunk times)
    gen_ai.client.token.usage                   {token}  billed input and output tokens
Attributes: gen_ai.operation.name ("chat"), gen_ai.provider.name (the well-known name for the
provider's preset, else its slug), gen_ai.request.model, gen_ai.response.model (when the
provider said), server.address / server.port, and ours: routewatch.task, routewatch.region
(where the probe ran). Failed probes have no duration in the stored result, so they are not
exported here; /metrics counts them by kind.
"""

from __future__ import annotations

import logging
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
from opentelemetry.sdk.resources import Resource

from monitor.models import OUTCOME_OK, Region, Route, Task
from monitor.stats.rollup_writes import ResultRow

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
                resource=Resource.create({"service.name": "routewatch"}),
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
                    description="Time per output chunk after the first: one value per probe, "
                    "its median gap between chunks.",
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


def _record(
    rows: Sequence[ResultRow], payloads: Sequence[Mapping[str, Any]], routes: Mapping[int, Route]
) -> int:
    ok = [r for r in rows if r.outcome == OUTCOME_OK and r.route_id in routes]
    if not ok:
        return 0
    extras: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for p in payloads:
        if p.get("slot_at"):
            at = datetime.fromisoformat(p["slot_at"])
            extras[_slot_key(p["task_id"], p["route_id"], p["region_id"], at)] = p
    tasks = dict(Task.objects.filter(pk__in={r.task_id for r in ok}).values_list("pk", "slug"))
    regions = dict(
        Region.objects.filter(pk__in={r.region_id for r in ok}).values_list("pk", "slug")
    )
    exporter = _get()
    for r in ok:
        route = routes[r.route_id]
        extra = extras.get(_slot_key(r.task_id, r.route_id, r.region_id, r.slot_at), {})
        attributes = _attributes(route, tasks.get(r.task_id or 0, ""), regions.get(r.region_id, ""))
        if served := extra.get("served_model"):
            attributes["gen_ai.response.model"] = str(served)
        if r.e2e_ms is not None:
            exporter.duration.record(r.e2e_ms / 1000, attributes)
        if r.ttft_ms is not None:
            exporter.first_chunk.record(r.ttft_ms / 1000, attributes)
        if (gap_ms := extra.get("itl_p50_ms")) is not None:
            exporter.per_chunk.record(float(gap_ms) / 1000, attributes)
        for kind, n in (("input", r.input_tokens), ("output", r.output_tokens)):
            if n is not None:
                exporter.tokens.record(n, {**attributes, "gen_ai.token.type": kind})
    return len(ok)


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
