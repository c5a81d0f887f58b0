"""The region worker's side: turn a batch message into probes, run them, return payloads.

Runs inside a Celery worker that may have no database at all (RW_WORKER_ONLY): everything it
needs is in the message, except the key to decrypt provider API keys (FIELD_ENCRYPTION_KEYS).
Probes run on one event loop per worker process that lives as long as the process, so warm
connections (one pooled client per endpoint) survive from one batch to the next.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from django.conf import settings

from monitor.crypto import ApiKeyDecryptionError, decrypt_secret

log = logging.getLogger(__name__)
T = TypeVar("T")

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


def run_on_loop(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    return asyncio.run_coroutine_threadsafe(coro, _background_loop()).result(timeout_s)


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


def error_payload(message: Mapping[str, Any], kind: str, detail: str) -> dict[str, Any]:
    """A result for a probe that could not even start (bad configuration)."""
    return {
        **message["slot"],
        "started_at": datetime.now(UTC).isoformat(),
        "outcome": "error",
        "error_kind": kind,
        "error_detail": detail[:500],
    }


Prepared = tuple[Mapping[str, Any], str | None, str]


def prepare(message: Mapping[str, Any], mapping: Mapping[str, str]) -> Prepared:
    """(message, connect_to, api key); raises ApiKeyDecryptionError for a key it cannot read."""
    token = message["provider"]["api_key_token"]
    api_key = decrypt_secret(token) if token else ""
    return message, connect_to(message["provider"]["base_url"], mapping), api_key


def run_batch(batch: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Run one region batch; returns one JSON-ready result payload per probe."""
    from monitor.pipeline import probing

    mapping = connect_to_map(settings.CONNECT_TO)
    prepared = []
    payloads: list[dict[str, Any]] = []
    for message in batch["probes"]:
        try:
            prepared.append(prepare(message, mapping))
        except ApiKeyDecryptionError as exc:
            payloads.append(error_payload(message, "config", str(exc)))
    timeout_s = max((m["timeout_s"] for m, _, _ in prepared), default=0) + 60
    if prepared:
        # Spread the batch's starts over one scheduler tick (no burst of simultaneous sends).
        window_s = float(min(settings.TICK_SECONDS, 10))
        payloads.extend(run_on_loop(probing.run_messages(prepared, window_s), timeout_s + window_s))
    return payloads


def run_race(message: Mapping[str, Any]) -> dict[str, Any]:
    """Run one race; returns its JSON-ready result (monitor.pipeline.races.ingest)."""
    from monitor.pipeline import probing

    mapping = connect_to_map(settings.CONNECT_TO)
    lanes: dict[str, Prepared] = {}
    unusable: dict[str, dict[str, Any]] = {}
    for route_id, lane in message["lanes"].items():
        try:
            lanes[route_id] = prepare(lane, mapping)
        except ApiKeyDecryptionError:
            # The lane cannot start; the race goes on without it and says why.
            unusable[route_id] = {"outcome": "error", "error_kind": "config", "tokens_paid": 0}
    timeout_s = float(message["timeout_s"]) + 60
    result = run_on_loop(probing.run_race(lanes, message.get("reference_ms") or {}), timeout_s)
    result["lanes"].update(unusable)
    result["race"] = message["race"]
    return result
