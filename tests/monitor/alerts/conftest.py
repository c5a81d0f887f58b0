"""Alert tests: a task probed from three regions with two routes, results written through
the real ingest path (tests.monitor.factories), and real receivers on loopback: an HTTP
server that checks the webhook's HMAC and keeps every request, and the digest tests' SMTP
server."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from monitor.alerts.models import (
    CHANNEL_WEBHOOK,
    KIND_LATENCY,
    Alert,
    AlertChannel,
    AlertNotification,
    AlertRule,
)
from monitor.models import Region, Route, Task
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f
from tests.monitor.digest.conftest import Inbox, smtp  # noqa: F401  (the real SMTP server fixture)

# Friday 27 November 2026, 12:00 UTC: every test's "now" (results are written before it).
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
SECRET = "whsec-test-0123456789abcdef"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)  # when it arrived

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    def signature_ok(self, secret: str = SECRET) -> bool:
        stamp = self.headers.get("X-Routewatch-Timestamp", "")
        given = self.headers.get("X-Routewatch-Signature", "")
        mac = hmac.new(secret.encode(), f"{stamp}.".encode() + self.body, hashlib.sha256)
        return hmac.compare_digest(given, f"v1={mac.hexdigest()}")


@dataclass
class Receiver:
    """An HTTP server on loopback keeping every POST; it can answer with given statuses, and
    hold a request (before answering) until released."""

    port: int = 0
    requests: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # answered in turn, then 200
    hold: bool = False
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def deliveries(self) -> set[str]:
        """The distinct delivery ids received (what a receiver that drops copies keeps)."""
        with self.lock:
            return {r.headers.get("X-Routewatch-Delivery", "") for r in self.requests}

    def bodies(self) -> list[Any]:
        with self.lock:
            return [r.json for r in self.requests]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            with receiver.lock:
                receiver.requests.append(Received(self.path, dict(self.headers.items()), body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
            if receiver.hold:
                receiver.arrived.set()
                receiver.release.wait(30)
            self.send_response(status)
            if self.path.startswith("/services/"):  # Slack's incoming webhooks answer "ok"
                self.send_header("Content-Type", "text/plain")
                payload = b"ok"
            else:  # PagerDuty's Events API v2 answers JSON (and webhooks are free to)
                self.send_header("Content-Type", "application/json")
                payload = b'{"status": "success", "message": "Event processed"}'
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(r))
    server.daemon_threads = True
    r.port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield r
    finally:
        r.release.set()
        server.shutdown()
        server.server_close()


@dataclass
class Setup:
    task: Task
    fast: Route
    other: Route
    regions: list[Region]


@pytest.fixture
def setup(db: None) -> Setup:
    return make_setup()


def make_setup() -> Setup:
    """Task "Support" (e2e p95 budget 3,000 ms), routes fast-model and other-model, probed
    from us-east, eu-west and ap-south."""
    p, q = f.provider("acme"), f.provider("globex")
    fast, other = f.route(p, "fast-model"), f.route(q, "other-model")
    regions = [f.region(s) for s in ("us-east", "eu-west", "ap-south")]
    task = f.task(
        "support", [fast, other], regions, e2e_p95_budget_ms=3000, latency_metric="e2e_p95"
    )
    return Setup(task=task, fast=fast, other=other, regions=regions)


def probes(
    s: Setup, route: Route, region: Region, end: datetime, n: int, **kw: Any
) -> list[dict[str, Any]]:
    """n probes, one a minute, the last a minute before `end`."""
    return [
        f.payload(s.task, route, region, end - timedelta(minutes=n - i), **kw) for i in range(n)
    ]


def write(payloads: list[dict[str, Any]]) -> None:
    assert ingest.ingest(payloads) == len(payloads)


def webhook(receiver: Receiver, name: str = "ops hook") -> AlertChannel:
    c = AlertChannel(name=name, kind=CHANNEL_WEBHOOK, target_host="127.0.0.1")
    c.set_target(receiver.url())
    c.set_secret(SECRET)
    c.save()
    return c


def assert_fired_then_resolved_once() -> None:
    """The one alert went pending, fired and resolved, and every notification was sent."""
    alert = Alert.objects.get()
    assert list(alert.events.order_by("at", "pk").values_list("kind", flat=True)) == [
        "pending",
        "fired",
        "resolved",
    ]
    assert set(AlertNotification.objects.values_list("status", flat=True)) == {"sent"}


def latency_rule(s: Setup, *channels: AlertChannel, **kw: Any) -> AlertRule:
    kw.setdefault("for_minutes", 0)
    kw.setdefault("threshold_ms", 3000)
    kw.setdefault("metric", "e2e_p50")
    kw.setdefault("window_minutes", 60)
    rule = AlertRule.objects.create(task=s.task, kind=KIND_LATENCY, is_enabled=True, **kw)
    rule.channels.set(channels)
    return rule
