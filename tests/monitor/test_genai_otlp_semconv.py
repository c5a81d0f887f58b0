"""The OTLP export as OpenTelemetry tools expect it (issue 33 item 6), against a real OTLP/HTTP
receiver on loopback decoding the official exporter's protobuf requests: the resource follows
OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (the SDK's own detection), failed probes are
exported with error.type, and time per output chunk is one value per chunk."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings

from monitor.models import ProbeResult
from monitor.pipeline.ingest import genai_otlp
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.region.worker import MEASURED
from probes.model import MAX_CHUNK_GAPS
from tests.monitor import factories as f
from tests.monitor.pipeline.test_otlp_export import Receiver, _value

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
DURATION = "gen_ai.client.operation.duration"
PER_CHUNK = "gen_ai.client.operation.time_per_output_chunk"
TOKENS = "gen_ai.client.token.usage"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(name, raising=False)
    genai_otlp.shutdown()
    with Receiver() as r, override_settings(OTEL_EXPORTER_OTLP_ENDPOINT=r.url):
        yield r
        genai_otlp.shutdown()  # while the receiver still answers


@pytest.fixture
def world(transactional_db: None):
    p = f.provider("openai-ish", base_url="https://api.example.com/v1", preset="openai")
    fast = f.route(p, "gpt-fast")
    eu = f.region("eu-west")
    return f.task("qa", [fast], [eu]), fast, eu


def _payload(t, r, g, minute: int, **kw: Any) -> dict[str, Any]:
    extra = kw.pop("extra", {})
    p = f.payload(t, r, g, T0 + timedelta(minutes=minute), **kw)
    p.update(extra)
    return p


def _resource(receiver: Receiver) -> dict[str, Any]:
    found = [
        {kv.key: _value(kv) for kv in rm.resource.attributes}
        for request in receiver.requests
        for rm in request.resource_metrics
    ]
    assert found
    return found[-1]


def _export_one(receiver: Receiver, world) -> dict[str, Any]:
    t, fast, eu = world
    assert ingest.ingest([_payload(t, fast, eu, 0)]) == 1
    assert genai_otlp.flush()
    return _resource(receiver)


def test_otel_service_name_and_resource_attributes_are_honoured(
    receiver: Receiver, world, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "rw-prod")
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES",
        "service.name=overridden,deployment.environment.name=prod,service.namespace=llm%20ops",
    )
    resource = _export_one(receiver, world)
    assert resource["service.name"] == "rw-prod"  # OTEL_SERVICE_NAME wins, as the spec says
    assert resource["deployment.environment.name"] == "prod"
    assert resource["service.namespace"] == "llm ops"  # percent-decoded by the SDK
    assert resource["telemetry.sdk.name"] == "opentelemetry"
    assert resource["service.instance.id"]


def test_a_service_name_in_the_resource_attributes_is_used(
    receiver: Receiver, world, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes")
    assert _export_one(receiver, world)["service.name"] == "from-attributes"


def test_without_either_the_service_is_routewatch(receiver: Receiver, world) -> None:
    assert _export_one(receiver, world)["service.name"] == "routewatch"


def test_failed_probes_are_exported_with_error_type_and_each_chunk_gap(
    receiver: Receiver, world
) -> None:
    t, fast, eu = world
    ok = {"chunk_gaps_ms": [10.0, 20.0, 30.0], "itl_p50_ms": 20.0}
    batch = [
        _payload(t, fast, eu, 0, e2e_ms=1500.0, extra=ok),
        _payload(t, fast, eu, 1, e2e_ms=2500.0, extra={"chunk_gaps_ms": [40.0]}),
        # Failures: timed out waiting for the first token; a 5xx twice (one from a worker one
        # release behind: no failed_after_ms, its e2e_ms is the headers' arrival); a stream
        # cut short after two chunks; a failure with no kind.
        _payload(
            t,
            fast,
            eu,
            2,
            outcome="error",
            error_kind="timeout_first_token",
            extra={"failed_after_ms": 60000.0},
        ),
        _payload(
            t, fast, eu, 3, outcome="error", error_kind="http_5xx", extra={"failed_after_ms": 80.0}
        ),
        _payload(t, fast, eu, 4, outcome="error", error_kind="http_5xx", extra={"e2e_ms": 120.0}),
        _payload(
            t,
            fast,
            eu,
            5,
            outcome="error",
            error_kind="truncated",
            extra={"failed_after_ms": 900.0, "ttft_ms": 300.0, "chunk_gaps_ms": [5.0]},
        ),
        _payload(t, fast, eu, 6, outcome="error", error_kind="", extra={"failed_after_ms": 7.0}),
        # Never sent (our configuration), and a missed slot: no operation, nothing exported.
        _payload(t, fast, eu, 7, outcome="error", error_kind="config"),
        _payload(t, fast, eu, 8, outcome="missed", error_kind="missed"),
    ]
    assert ingest.ingest(batch) == len(batch)
    assert genai_otlp.flush()
    points = receiver.points()

    durations = {a.get("error.type"): (a, p) for _, a, p in points[DURATION]}
    assert set(durations) == {None, "timeout_first_token", "http_5xx", "truncated", "_OTHER"}
    attrs, point = durations["timeout_first_token"]
    assert attrs["gen_ai.request.model"] == "gpt-fast"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert (point.count, point.sum) == (1, pytest.approx(60.0))
    assert (durations["http_5xx"][1].count, durations["http_5xx"][1].sum) == (
        2,
        pytest.approx(0.2),
    )
    assert durations["truncated"][1].sum == pytest.approx(0.9)
    assert durations["_OTHER"][1].sum == pytest.approx(0.007)
    assert (durations[None][1].count, durations[None][1].sum) == (2, pytest.approx(4.0))
    # error.type is the error's kind: as few values as the taxonomy has, never a message.
    assert all(len(kind) < 30 for kind in durations if kind is not None)

    per_chunk = {a.get("error.type"): p for _, a, p in points[PER_CHUNK]}
    assert set(per_chunk) == {None, "truncated"}
    assert per_chunk[None].count == 4  # one per gap, not one per probe
    assert per_chunk[None].sum == pytest.approx(0.1)
    assert per_chunk[None].min == pytest.approx(0.01)
    assert per_chunk[None].max == pytest.approx(0.04)
    assert (per_chunk["truncated"].count, per_chunk["truncated"].sum) == (1, pytest.approx(0.005))

    # Tokens are billed usage of completed probes only.
    assert {a.get("error.type") for _, a, _ in points[TOKENS]} == {None}


def test_the_chunk_gaps_travel_to_the_export_unstored_and_the_failure_time_is_stored(
    receiver: Receiver, world
) -> None:
    assert {"chunk_gaps_ms", "failed_after_ms"} <= set(MEASURED)
    assert "chunk_gaps_ms" not in {f.attname for f in ProbeResult._meta.concrete_fields}
    t, fast, eu = world
    long = [float(i % 50) for i in range(MAX_CHUNK_GAPS + 44)]
    batch = [
        _payload(t, fast, eu, 0, extra={"chunk_gaps_ms": long}),
        _payload(t, fast, eu, 1, outcome="error", error_kind="dns", extra={"failed_after_ms": 3}),
        _payload(t, fast, eu, 2, extra={"chunk_gaps_ms": ["12"]}),  # not numbers: refused
    ]
    assert ingest.ingest(batch) == 2
    rows = {r.outcome: r for r in ProbeResult.objects.filter(route=fast).only("failed_after_ms")}
    assert rows["ok"].failed_after_ms is None
    assert rows["error"].failed_after_ms == 3.0
    assert genai_otlp.flush()
    per_chunk = [p for _, _, p in receiver.points()[PER_CHUNK]]
    assert sum(p.count for p in per_chunk) == MAX_CHUNK_GAPS  # the engine's bound, held


def test_real_probes_through_the_region_worker_export_each_chunk_and_each_failure(
    receiver: Receiver, probed_world
) -> None:
    """End to end: the region worker probed the simulator (tests/monitor/conftest.py), ingest
    read its payloads; the chunk gaps and the failures' times came all the way."""
    rows = list(
        ProbeResult.objects.filter(task=probed_world.task).values(
            "outcome", "error_kind", "failed_after_ms", "e2e_ms", "output_tokens"
        )
    )
    ok = [r for r in rows if r["outcome"] == "ok"]
    failed = [r for r in rows if r["outcome"] == "error"]
    assert ok
    assert failed  # the rate-limited route answers 429 most of the time
    assert all(r["failed_after_ms"] is None for r in ok)
    assert all(r["failed_after_ms"] is not None and r["failed_after_ms"] > 0 for r in failed)
    assert genai_otlp.flush()
    points = receiver.points()
    # Each gap between chunks, not one figure a probe: every answer here streamed many chunks.
    chunks = sum(p.count for _, _, p in points[PER_CHUNK])
    assert 2 * len(ok) <= chunks <= len(rows) * MAX_CHUNK_GAPS
    by_error: dict[str | None, int] = {}
    for _, attrs, p in points[DURATION]:
        kind = attrs.get("error.type")
        by_error[kind] = by_error.get(kind, 0) + p.count
    expected: dict[str | None, int] = {None: len(ok)}
    for r in failed:
        expected[r["error_kind"]] = expected.get(r["error_kind"], 0) + 1
    assert by_error == expected
    assert "http_429" in by_error
