"""Which region workers are alive, and what each carries: a beacon in the broker.

A region worker has no database (RW_WORKER_ONLY), so every few seconds it writes one short
Redis key of its own, `rw:worker:<region>:<host>:<pid>`, holding what its process carries (the
probes in flight, the messages it holds, the probes it did not start because they were too
late) and its bound on probes in flight. The key expires after a few missed beats, so a worker
that died, or lost the broker, disappears from the Status page and the overview's banner by
itself: "no live worker" is the absence of keys, never a stale claim of life.

A process that lives is not yet a worker that works: Celery's Redis transport can stop
consuming after a connection reset and never start again (celery#10205, #10302), a worker
then looks alive and its region goes quiet. So the beacon also carries when the worker last
took a message, and `Consumer.stalled` says when it has stopped: messages wait in its queue,
it has threads free, the broker has answered for a while, yet it took nothing for
RW_CONSUMER_STALL_SECONDS. The worker then exits and its supervisor (compose's restart policy,
systemd, `make run`) starts it again; its health file (`write_health`, read by
`python -m monitor.region_worker health`) says so meanwhile.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

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
    # Not in the beacons of workers older than these fields (a rolling upgrade).
    version: NotRequired[str]  # the worker's Routewatch version
    clock_offset_s: NotRequired[float | None]  # central (the broker's) clock minus the worker's
    clock_ok: NotRequired[bool]  # within RW_CLOCK_TOLERANCE_SECONDS (or not measured yet)
    clock_tolerance_s: NotRequired[int]  # its RW_CLOCK_TOLERANCE_SECONDS
    spooled: NotRequired[int]  # result messages waiting in its spool for the broker
    last_consumed_at: NotRequired[float | None]  # when it last took a message (central clock)
    consuming: NotRequired[bool]  # False: messages wait, threads are free, it takes none


class Health(TypedDict):
    """What a worker writes beside its spool for its health command (`region_worker health`)."""

    written_at: float  # Unix time, the worker's clock (compared with the same clock)
    pid: int
    consuming: bool
    clock_ok: bool
    reason: str  # why it is unhealthy, or ""


@dataclass
class Consumer:
    """When this worker last took a message, and since when the broker has answered it
    (monotonic seconds), for telling a stalled consumer from an idle one."""

    started: float
    reachable_since: float | None = None
    last_consumed: float | None = None
    last_consumed_at: float | None = None  # central time, for the beacon
    consumer_started: float | None = None  # Celery's consumer last (re)started consuming

    def consumed(self, central_now: float) -> None:
        self.last_consumed = time.monotonic()
        self.last_consumed_at = central_now

    def restarted(self) -> None:
        """Celery's consumer (re)started consuming: at start, after a reconnection."""
        self.consumer_started = time.monotonic()

    def reached(self, ok: bool) -> None:
        """The beacon's last exchange with the broker succeeded (or not)."""
        if not ok:
            self.reachable_since = None
        elif self.reachable_since is None:
            self.reachable_since = time.monotonic()

    def stalled(self, waiting: int, free_threads: int, stall_s: float) -> float | None:
        """Seconds it has taken nothing although it could, when past `stall_s`; else None.
        The clock starts at the latest of: its start, the broker answering again after an
        outage (kombu needs a moment to reconnect), Celery's consumer (re)starting after a
        reconnection (the broker may have answered the beacon all along: a reset connection),
        its last message."""
        if waiting <= 0 or free_threads <= 0 or self.reachable_since is None:
            return None
        since = max(
            self.started,
            self.reachable_since,
            self.consumer_started or 0.0,
            self.last_consumed or 0.0,
        )
        idle = time.monotonic() - since
        return idle if idle > stall_s else None


def health_path(spool_dir: Path) -> Path:
    # Not *.json: the spool's own entries are (monitor.pipeline.region.spool).
    return spool_dir / f"health-{socket.gethostname()}.state"


def write_health(spool_dir: Path, health: Health) -> None:
    path = health_path(spool_dir)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(health))
    tmp.replace(path)


def read_health(spool_dir: Path, max_age_s: float) -> tuple[bool, str]:
    """(healthy, why) from this host's health file: written within `max_age_s` by a worker
    that is consuming and whose clock is within the tolerance."""
    path = health_path(spool_dir)
    try:
        health: Health = json.loads(path.read_text())
        age = time.time() - float(health["written_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return False, f"no health file at {path}: the worker has not started (or cannot write)"
    if age > max_age_s:
        return False, f"the worker's last health beat is {age:.0f} s old (process hung or gone)"
    if not health["consuming"] or not health["clock_ok"]:
        return False, health["reason"] or "unhealthy"
    return True, "consuming" if not health["reason"] else health["reason"]


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
