"""Ingest sends each stored probe as OpenTelemetry GenAI client metrics to an OTLP endpoint:
checked against a real OTLP/HTTP receiver on loopback that decodes the protobuf requests the
official exporter sends (opentelemetry-proto), and off when no endpoint is configured."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import override_settings
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from monitor.pipeline.ingest import genai_otlp
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)


class Receiver:
    """An OTLP/HTTP metrics receiver: POST /v1/metrics, protobuf in, protobuf out."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.content_types: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != "/v1/metrics":
                    self.send_error(404)
                    return
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                receiver.requests.append(request)
                receiver.content_types.append(self.headers["Content-Type"])
                reply = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Receiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def points(self) -> dict[str, list[tuple[str, dict[str, Any], Any]]]:
        """Histogram data points by metric name: (unit, attributes, point)."""
        out: dict[str, list[tuple[str, dict[str, Any], Any]]] = {}
        for request in self.requests:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        for point in metric.histogram.data_points:
                            attrs = {kv.key: _value(kv) for kv in point.attributes}
                            out.setdefault(metric.name, []).append((metric.unit, attrs, point))
        return out


def _value(kv: KeyValue) -> Any:
    return getattr(kv.value, kv.value.WhichOneof("value"))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    genai_otlp.shutdown()
    with Receiver() as r:
        yield r
        # While the receiver still answers: an exporter shutting down exports what it has left,
        # and against a closed port it would retry for seconds.
        genai_otlp.shutdown()


@pytest.fixture
def world(transactional_db: None):
    p = f.provider("openai-ish", base_url="https://api.example.com/v1", preset="openai")
    other = f.provider("localllm", base_url="http://10.0.0.5:8080/v1")
    fast, local = f.route(p, "gpt-fast"), f.route(other, "llama-local")
    eu, us = f.region("eu-west"), f.region("us-east")
    t = f.task("qa", [fast, local], [eu, us])
    return t, fast, local, eu, us


def _payload(t, r, g, at, **kw: Any) -> dict[str, Any]:
    p = f.payload(t, r, g, at, **{k: v for k, v in kw.items() if k != "extra"})
    p.update(kw.get("extra", {}))
    return p


def test_each_stored_probe_reaches_an_otlp_receiver_as_genai_client_metrics(
    receiver: Receiver, world
) -> None:
    t, fast, local, eu, us = world
    batch = [
        _payload(
            t,
            fast,
            eu,
            T0,
            ttft_ms=400.0,
            e2e_ms=1500.0,
            extra={"itl_p50_ms": 20.0, "served_model": "gpt-fast-2025"},
        ),
        _payload(
            t,
            fast,
            eu,
            T0 + timedelta(minutes=1),
            ttft_ms=600.0,
            e2e_ms=2500.0,
            extra={"itl_p50_ms": 30.0, "served_model": "gpt-fast-2025"},
        ),
        _payload(t, local, us, T0, ttft_ms=50.0, e2e_ms=300.0),
        # A failure with no time to failure and no e2e (an older worker, nothing received):
        # no duration to export; /metrics counts it.
        _payload(t, fast, eu, T0 + timedelta(minutes=2), outcome="error", error_kind="http_5xx"),
    ]
    with override_settings(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url + "/"):
        assert ingest.ingest(batch) == 4
        assert ingest.ingest(batch) == 0  # redelivered: stored once, exported once
        assert genai_otlp.flush()
    assert receiver.requests
    assert set(receiver.content_types) == {"application/x-protobuf"}
    points = receiver.points()
    assert set(points) == {
        "gen_ai.client.operation.duration",
        "gen_ai.client.operation.time_to_first_chunk",
        "gen_ai.client.operation.time_per_output_chunk",
        "gen_ai.client.token.usage",
    }
    units = {name: {unit for unit, _, _ in found} for name, found in points.items()}
    assert units == {
        "gen_ai.client.operation.duration": {"s"},
        "gen_ai.client.operation.time_to_first_chunk": {"s"},
        "gen_ai.client.operation.time_per_output_chunk": {"s"},
        "gen_ai.client.token.usage": {"{token}"},
    }
    # Cumulative points: the last export holds the totals. One series per attribute set.
    durations = {
        attrs["gen_ai.request.model"]: (attrs, p)
        for _, attrs, p in points["gen_ai.client.operation.duration"]
    }
    attrs, point = durations["gpt-fast"]
    assert attrs == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",  # the preset's well-known name
        "gen_ai.request.model": "gpt-fast",
        "gen_ai.response.model": "gpt-fast-2025",
        "server.address": "api.example.com",
        "server.port": 443,
        "routewatch.task": "qa",
        "routewatch.region": "eu-west",
    }
    assert point.count == 2
    assert point.sum == pytest.approx(4.0)
    assert list(point.explicit_bounds) == list(genai_otlp.SECONDS_BOUNDARIES)
    attrs, point = durations["llama-local"]
    assert attrs["gen_ai.provider.name"] == "localllm"  # no preset: our slug
    assert (attrs["server.address"], attrs["server.port"]) == ("10.0.0.5", 8080)
    assert attrs["routewatch.region"] == "us-east"
    assert (point.count, point.sum) == (1, pytest.approx(0.3))
    first = {
        a["gen_ai.request.model"]: p
        for _, a, p in points["gen_ai.client.operation.time_to_first_chunk"]
    }
    assert (first["gpt-fast"].count, first["gpt-fast"].sum) == (2, pytest.approx(1.0))
    per_chunk = {
        a["gen_ai.request.model"]: p
        for _, a, p in points["gen_ai.client.operation.time_per_output_chunk"]
    }
    assert set(per_chunk) == {"gpt-fast"}  # the other probe reported no chunk gaps
    assert per_chunk["gpt-fast"].sum == pytest.approx(0.05)
    tokens = {
        (a["gen_ai.request.model"], a["gen_ai.token.type"]): p
        for _, a, p in points["gen_ai.client.token.usage"]
    }
    assert (tokens[("gpt-fast", "input")].count, tokens[("gpt-fast", "input")].sum) == (2, 2000)
    assert tokens[("gpt-fast", "output")].sum == 400
    assert tokens[("llama-local", "output")].sum == 200


def test_nothing_is_exported_without_an_endpoint(receiver: Receiver, world) -> None:
    t, fast, _, eu, _ = world
    with override_settings(OTEL_EXPORTER_OTLP_ENDPOINT="", OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=""):
        assert not genai_otlp.enabled()
        assert ingest.ingest([_payload(t, fast, eu, T0)]) == 1
    assert genai_otlp._exporter is None  # no exporter, no thread, no connection
    assert receiver.requests == []


def test_the_metrics_endpoint_setting_is_used_as_given(receiver: Receiver, world) -> None:
    t, fast, _, eu, _ = world
    with override_settings(OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=receiver.url + "/v1/metrics"):
        assert ingest.ingest([_payload(t, fast, eu, T0)]) == 1
        assert genai_otlp.flush()
    assert len(receiver.points()["gen_ai.client.operation.duration"]) == 1
