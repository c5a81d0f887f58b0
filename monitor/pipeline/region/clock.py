"""A region worker's clock against the central one, measured, and the central time it implies.

Beat stamps every message with its own clock (issue time, planned starts, expiry) and ingest
judges every result by its own; a region worker on another machine has a clock of its own.
The broker is the one server every process reaches, so its clock (Redis `TIME`) stands for
the central one: the worker asks it every liveness beat, notes its own time before and after,
and takes the offset from the exchange with the shortest round trip of the last minute (its
error is at most half that round trip: 50 ms across a 100 ms path).

Within RW_CLOCK_TOLERANCE_SECONDS the worker works in central time (`now()`: its own clock
plus the offset) wherever it compares with beat's stamps or stamps what ingest judges: a
message's expiry, each probe's planned start, its results' issue time. Beyond the tolerance
its time sync is broken (NTP off, a VM restored from a snapshot): it refuses work, each
refusal logged with the offset, and its beacon shows it (the Status page), until the clock
is fixed. Until the first measurement the offset is taken as 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import cache

import redis
from django.conf import settings

log = logging.getLogger(__name__)

# Exchanges kept (one a liveness beat: a minute of them); the best of these is the offset.
SAMPLES = 30


@dataclass(frozen=True)
class Sample:
    offset_s: float  # central minus ours
    rtt_s: float
    at: float  # our clock, when taken


_samples: deque[Sample] = deque(maxlen=SAMPLES)
_lock = threading.Lock()


@cache
def _client(url: str) -> redis.Redis:
    """The broker's Redis, a client of this module's own (monitor.pipeline.queues reaches into
    ingest, which signs with this clock: no import back)."""
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def measure() -> Sample:
    """One exchange with the broker's clock (raises redis errors)."""
    client = _client(settings.REDIS_URL)
    before = time.time()
    seconds, micros = client.time()
    after = time.time()
    central = float(seconds) + float(micros) / 1e6
    sample = Sample(offset_s=central - (before + after) / 2, rtt_s=after - before, at=after)
    with _lock:
        _samples.append(sample)
    return sample


def offset_s() -> float | None:
    """Central minus this process's clock, in seconds; None before the first measurement."""
    with _lock:
        if not _samples:
            return None
        return min(_samples, key=lambda s: s.rtt_s).offset_s


def now() -> float:
    """Unix time by the central clock, as well as this worker knows it."""
    return time.time() + (offset_s() or 0.0)


def beyond_tolerance() -> float | None:
    """The measured offset when it is beyond RW_CLOCK_TOLERANCE_SECONDS, else None."""
    off = offset_s()
    if off is None or abs(off) <= settings.CLOCK_TOLERANCE_SECONDS:
        return None
    return off


def refusal(off: float) -> str:
    """The log line's reason for refusing work with a clock this far off."""
    way = "ahead of" if off < 0 else "behind"
    return (
        f"this worker's clock is {abs(off):.1f} s {way} the broker's (central) clock, beyond "
        f"the tolerance of {settings.CLOCK_TOLERANCE_SECONDS} s (RW_CLOCK_TOLERANCE_SECONDS): "
        "fix its time sync (NTP); its region's slots are recorded missed meanwhile"
    )


def forget() -> None:
    with _lock:
        _samples.clear()
