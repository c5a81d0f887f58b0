"""Which region workers are alive, and what each carries: a beacon in the broker.

A region worker has no database (RW_WORKER_ONLY), so every few seconds it writes one short
Redis key of its own, `rw:worker:<region>:<host>:<pid>`, holding what its process carries (the
probes in flight, the messages it holds, the probes it did not start because they were too
late) and its bound on probes in flight. The key expires after a few missed beats, so a worker
that died, or lost the broker, disappears from the Status page and the overview's banner by
itself: "no live worker" is the absence of keys, never a stale claim of life.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import TypedDict

import redis

from monitor.pipeline import queues

log = logging.getLogger(__name__)

PREFIX = "rw:worker:"
# A worker writes its beacon this often; it lives three beats.
BEAT_SECONDS = 2.0
TTL_SECONDS = 3 * BEAT_SECONDS


class Beacon(TypedDict):
    region: str
    worker: str  # host:pid
    seen_at: float  # Unix time, the worker's clock
    in_flight: int  # probes and scenarios running now
    holding: int  # messages (batches, races, scenarios) the worker holds now
    capacity: int  # its bound on probes in flight (RW_PROBES_IN_FLIGHT)
    threads: int  # its bound on messages held at once (the pool's concurrency)
    started: int  # probes started since the worker started
    late: int  # probes not started since then: too late (recorded missed)
    peak: int  # the most probes in flight at once since then


def key(region: str) -> str:
    return f"{PREFIX}{region}:{socket.gethostname()}:{os.getpid()}"


def publish(beacon: Beacon) -> None:
    """Write this worker's beacon (raises redis errors: the caller's next beat retries)."""
    queues.client().set(key(beacon["region"]), json.dumps(beacon), ex=int(TTL_SECONDS))


def live_workers() -> dict[str, list[Beacon]] | None:
    """The live workers' beacons by region slug; None when the broker does not answer."""
    found: dict[str, list[Beacon]] = {}
    try:
        client = queues.client()
        names = list(client.scan_iter(match=f"{PREFIX}*", count=500))
        values = client.mget(names) if names else []
    except redis.RedisError:
        log.warning("worker beacons unavailable: Redis does not answer")
        return None
    now = time.time()
    for raw in values:
        if raw is None:
            continue  # expired between the scan and the read
        try:
            beacon = json.loads(raw)
            region = str(beacon["region"])
            fresh = now - float(beacon["seen_at"]) <= TTL_SECONDS * 4
        except (ValueError, KeyError, TypeError):
            continue  # not ours to show (written by something else)
        if fresh:  # a clock far behind ours is not shown as alive
            found.setdefault(region, []).append(beacon)
    return found
