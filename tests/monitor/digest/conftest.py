"""Digest tests: a real SMTP server on loopback and a fortnight of seeded results (the three
users, owner, teammate and outsider, are tests/conftest.py's).

The seeded fortnight (ingested through monitor.pipeline.ingest, so the rollups are real), for the task
"Summarise" (fastest by e2e p50; budgets TTFT p95 600 ms, e2e p95 3000 ms), with routes
Acme / fast-model and Acme / slow-model ($1 / M input, $2 / M output; each probe 1000 in,
200 out = $0.0014):

  region   week   fast-model                      slow-model
  EU-WEST  last   -                               20 ok, TTFT 700, e2e 2500
  EU-WEST  this   20 ok, TTFT 400, e2e 1500       20 ok, TTFT 700, e2e 2500
  US-EAST  last   20 ok, TTFT 300, e2e 1000       20 ok, TTFT 800, e2e 3000
  US-EAST  this   2 ok, 18 http_5xx               20 ok, TTFT 800, e2e 4000

So this week: EU-WEST changed to fast-model (a faster route appeared), US-EAST changed to
slow-model (fast-model's errors), slow-model in US-EAST regressed on e2e p50 (+33%, with
confidence; its p95 rose as much, but 20 samples give a p95 no upper bound, so that rise is not
a confident regression: monitor.stats.confidence), 18 errors of 80 probes (22.5%), spend $0.1120; last week 0 of 60, $0.0840.
"""

from __future__ import annotations

import asyncio
import email
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email import policy
from email.message import EmailMessage
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.contrib.auth.models import User

from monitor.models import MONDAY, Region, Route, Subscription, Task
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f

# Monday 16 November 2026, 08:30 UTC: half an hour after a Monday 08:00 UTC digest fell due.
NOW = datetime(2026, 11, 16, 8, 30, tzinfo=UTC)
WEEK_END = datetime(2026, 11, 16, 8, 0, tzinfo=UTC)
NEXT_WEEK = WEEK_END + timedelta(days=7)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Inbox:
    """An aiosmtpd handler that keeps what it accepts; it can refuse or slow down messages."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.recipients: list[list[str]] = []
        self.raw: list[bytes] = []
        self.refuse_next = 0
        self.delay_s = 0.0
        self._lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        with self._lock:
            if self.refuse_next:
                self.refuse_next -= 1
                return "451 4.3.0 Try again later"
            message = email.message_from_bytes(envelope.original_content, policy=policy.default)
            assert isinstance(message, EmailMessage)
            self.messages.append(message)
            self.recipients.append(list(envelope.rcpt_tos))
            self.raw.append(envelope.original_content)
        return "250 OK"

    def to(self, address: str) -> list[EmailMessage]:
        with self._lock:
            return [
                m
                for m, rcpts in zip(self.messages, self.recipients, strict=True)
                if address in rcpts
            ]

    def __len__(self) -> int:
        with self._lock:
            return len(self.messages)


@pytest.fixture
def smtp(settings: Any) -> Iterator[Inbox]:
    logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs every command
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = port
    settings.EMAIL_HOST_USER = ""
    settings.EMAIL_HOST_PASSWORD = ""
    settings.EMAIL_USE_TLS = False
    settings.EMAIL_USE_SSL = False
    settings.EMAIL_TIMEOUT = 10
    try:
        yield inbox
    finally:
        controller.stop()


def text_of(message: EmailMessage) -> str:
    part = message.get_body(preferencelist=("plain",))
    assert part is not None
    return str(part.get_content())


def html_of(message: EmailMessage) -> str:
    part = message.get_body(preferencelist=("html",))
    assert part is not None
    return str(part.get_content())


def subscribe(
    user: User, *, weekday: int = MONDAY, hour: int = 8, zone: str = "UTC"
) -> Subscription:
    """A subscription made a week ago, so its first digest is due at WEEK_END."""
    sub = Subscription(user=user, weekday=weekday, hour=hour, time_zone=zone)
    sub.reschedule(WEEK_END - timedelta(days=6))
    sub.save()
    return sub


@dataclass
class Scenario:
    task: Task
    fast: Route
    slow: Route
    eu: Region
    us: Region


def _probes(
    t: Task, r: Route, g: Region, start: datetime, n: int, **kw: Any
) -> list[dict[str, Any]]:
    return [f.payload(t, r, g, start + timedelta(minutes=i), **kw) for i in range(n)]


@pytest.fixture
def scenario(db: None) -> Scenario:
    p = f.provider()
    fast, slow = f.route(p, "fast-model"), f.route(p, "slow-model")
    eu, us = f.region("eu-west"), f.region("us-east")
    t = Task.objects.create(
        name="Summarise",
        slug="summarise",
        user_template="Q: {input}",
        latency_metric="e2e_p50",
        ttft_p95_budget_ms=600,
        e2e_p95_budget_ms=3000,
    )
    t.routes.set([fast, slow])
    t.regions.set([eu, us])
    this = WEEK_END - timedelta(days=2)
    last = WEEK_END - timedelta(days=9)
    payloads = [
        *_probes(t, slow, eu, last, 20, ttft_ms=700, e2e_ms=2500),
        *_probes(t, fast, eu, this, 20, ttft_ms=400, e2e_ms=1500),
        *_probes(t, slow, eu, this, 20, ttft_ms=700, e2e_ms=2500),
        *_probes(t, fast, us, last, 20, ttft_ms=300, e2e_ms=1000),
        *_probes(t, slow, us, last, 20, ttft_ms=800, e2e_ms=3000),
        *_probes(t, fast, us, this, 2, ttft_ms=300, e2e_ms=1000),
        *_probes(
            t, fast, us, this + timedelta(hours=1), 18, outcome="error", error_kind="http_5xx"
        ),
        *_probes(t, slow, us, this, 20, ttft_ms=800, e2e_ms=4000),
    ]
    assert ingest.ingest(payloads) == 140
    return Scenario(task=t, fast=fast, slow=slow, eu=eu, us=us)
