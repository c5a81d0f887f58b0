"""What waits in the broker: queue depths, unacknowledged messages, and the dead-letter list.

Read straight from Redis (the Celery broker): a queue is a Redis list named after it (kombu
keeps priorities 3, 6 and 9 in lists of their own, summed here), and messages a worker holds
unacknowledged sit in the `unacked` hash. `/metrics` and the status page show these figures.

The dead-letter list holds ingest messages that the database refused to take for longer than
ingest's retries (monitor.tasks): kept in Redis, which is up when the database is not, bounded
by DEAD_LETTER_MAX, shown on the status page and replayed with `manage.py replay_dead_letters`
or the page's button (ingest is idempotent, so a replay never stores a result twice).

A replay goes through the signed paths only, as the message did when it first came: anyone
who can write to Redis can add a letter, and only a region's signature says that its results
are that region's, for its open slots. A letter that is not even well formed (not JSON, no
kind, a parked time that is not a finite number) is never shown nor replayed: the replay moves
it to its own list, DEAD_LETTER_MALFORMED_KEY, where it is counted and kept for a person to
read, and goes on with the others.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import cache
from typing import Literal, TypedDict

import redis
from django.conf import settings

log = logging.getLogger(__name__)

INGEST_QUEUE_NAMES = ("ingest", "default")
# Beat's tick has a queue and a worker process of its own: it never waits behind an overview
# rebuild or an ingest message (at the realistic mix's 1x, a rebuild took 14 s, and ticks that
# waited behind it created their slots too late to send).
SCHEDULE_QUEUE = "schedule"
DEAD_LETTER_KEY = "routewatch:dead-letters"
DEAD_LETTER_MALFORMED_KEY = "routewatch:dead-letters:malformed"
# kombu's Redis transport: priority steps [0, 3, 6, 9], each non-zero one in "<queue>\x06\x16<n>".
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")
_UNACKED_KEY = "unacked"

DeadLetterKind = Literal["results", "race", "scenario"]
DEAD_LETTER_KINDS: tuple[DeadLetterKind, ...] = ("results", "race", "scenario")


class DeadLetter(TypedDict):
    kind: DeadLetterKind
    parked_at: float  # Unix time
    reason: str  # the error's type, never its message (it may quote values)
    attempts: int
    body: object  # the ingest task's argument, as it was sent


def client() -> redis.Redis:
    """The broker's Redis (one client per URL, so a changed REDIS_URL is followed)."""
    return _client(settings.REDIS_URL)


@cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def depths(queues: Iterable[str]) -> dict[str, int]:
    """Messages waiting in each queue (not yet taken by a worker)."""
    names = list(dict.fromkeys(queues))
    pipe = client().pipeline(transaction=False)
    for name in names:
        for suffix in _PRIORITY_SUFFIXES:
            pipe.llen(name + suffix)
    counts = pipe.execute()
    step = len(_PRIORITY_SUFFIXES)
    return {name: sum(counts[i * step : (i + 1) * step]) for i, name in enumerate(names)}


def unacked() -> int:
    """Messages taken by a worker and not yet acknowledged (running, or waiting to retry)."""
    return int(client().hlen(_UNACKED_KEY))


# kombu's Redis transport keeps each delivered, unacknowledged message in the `unacked` hash
# (delivery tag -> JSON [message, exchange, routing key]) and its delivery time in the
# `unacked_index` sorted set; it gives a message back only after the visibility timeout.
_UNACKED_INDEX_KEY = "unacked_index"
# Atomic: the message goes back only if it is still the one read (not acknowledged, not
# restored by kombu or another worker meanwhile).
_TAKE_BACK = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[3])
return 1
"""


def take_back_stalled(older_than_s: float, now: float | None = None, limit: int = 500) -> int:
    """Put back in the ingest queue, to be taken next, the ingest messages a worker has held
    unacknowledged for over `older_than_s` with no retry time ahead of them: a worker killed,
    or cut off from the broker, after taking a message and before running it (Celery drops
    what it had prefetched when its connection breaks). kombu would give them back only after
    its visibility timeout, 17 minutes, long after their slots were recorded missed. A copy of
    a message that was only slow is harmless: ingest stores each slot's result once. Other
    queues' messages are never touched (a batch runs for minutes and must not run twice).
    Returns how many went back."""
    c = client()
    now = time.time() if now is None else now
    cutoff = now - older_than_s
    tags: list[bytes] = c.zrangebyscore(  # type: ignore[assignment]
        _UNACKED_INDEX_KEY, "-inf", cutoff, start=0, num=limit
    )
    back = 0
    script = c.register_script(_TAKE_BACK)
    for tag in tags:
        raw: bytes | None = c.hget(_UNACKED_KEY, tag)  # type: ignore[assignment]
        if raw is None:
            continue
        try:
            message, _exchange, routing_key = json.loads(raw)
            headers = message.get("headers") or {}
            priority = (message.get("properties") or {}).get("priority") or 0
        except (ValueError, TypeError, AttributeError):
            continue
        if routing_key != INGEST_QUEUE_NAMES[0] or priority:
            continue
        eta = headers.get("eta")
        if eta and _after(eta, cutoff):
            continue  # a retry waiting for its time, held by a live worker
        headers["redelivered"] = True
        with contextlib.suppress(KeyError, TypeError):
            message["properties"]["delivery_info"]["redelivered"] = True
        keys = [_UNACKED_KEY, _UNACKED_INDEX_KEY, INGEST_QUEUE_NAMES[0]]
        back += int(script(keys=keys, args=[tag, raw, json.dumps(message)]))
    if back:
        log.warning(
            "took back %d ingest message(s) a worker held unacknowledged for over %d s "
            "(it died or lost the broker before running them)",
            back,
            older_than_s,
        )
    return back


def _after(iso: str, cutoff: float) -> bool:
    """Is an ISO-8601 time (a message's eta) after `cutoff` (Unix time)? Unreadable: yes (left
    to kombu's visibility timeout)."""
    try:
        when = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return True
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp() > cutoff


def park(kind: DeadLetterKind, body: object, reason: str, attempts: int) -> None:
    """Keep an ingest message the database would not take; the oldest go past the bound."""
    letter: DeadLetter = {
        "kind": kind,
        "parked_at": time.time(),
        "reason": reason,
        "attempts": attempts,
        "body": body,
    }
    pipe = client().pipeline()
    pipe.rpush(DEAD_LETTER_KEY, json.dumps(letter))
    pipe.ltrim(DEAD_LETTER_KEY, -settings.DEAD_LETTER_MAX, -1)
    pipe.execute()
    log.error(
        "ingest gave up after %d attempts (%s): the %s message is parked in the dead-letter list",
        attempts,
        reason,
        kind,
    )


def dead_letter_count() -> int:
    return int(client().llen(DEAD_LETTER_KEY))


def malformed_dead_letter_count() -> int:
    """Letters a replay set aside because they were not well formed (kept, never replayed)."""
    return int(client().llen(DEAD_LETTER_MALFORMED_KEY))


def _well_formed(raw: bytes) -> DeadLetter | None:
    """The letter, or None when it is not one `park` could have written."""
    try:
        letter = json.loads(raw)
    except ValueError:  # UnicodeDecodeError included
        return None
    if not isinstance(letter, dict) or letter.get("kind") not in DEAD_LETTER_KINDS:
        return None
    parked_at = letter.get("parked_at")
    if isinstance(parked_at, bool) or not isinstance(parked_at, int | float):
        return None
    # A time the status page can show: finite, and within what datetime can hold.
    if not math.isfinite(parked_at) or not 0 <= parked_at < 253_402_300_800:
        return None
    if not isinstance(letter.get("reason"), str) or "body" not in letter:
        return None
    attempts = letter.get("attempts")
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        return None
    return letter  # type: ignore[return-value]


def dead_letters(limit: int = 100) -> list[DeadLetter]:
    """The oldest parked messages that are well formed, for the status page."""
    raws: list[bytes] = client().lrange(DEAD_LETTER_KEY, 0, limit - 1)  # type: ignore[assignment]
    return [letter for raw in raws if (letter := _well_formed(raw)) is not None]


def _set_aside(raw: bytes, why: str) -> None:
    client().rpush(DEAD_LETTER_MALFORMED_KEY, raw)
    log.error(
        "a dead letter %s: moved to %s, not replayed (%d there)",
        why,
        DEAD_LETTER_MALFORMED_KEY,
        malformed_dead_letter_count(),
    )


def take_dead_letter() -> DeadLetter | None:
    """Remove and return the oldest well-formed parked message (the replayer puts it back if
    it fails); malformed ones before it are set aside on the way."""
    while True:
        raw: bytes | None = client().lpop(DEAD_LETTER_KEY)  # type: ignore[assignment]
        if raw is None:
            return None
        letter = _well_formed(raw)
        if letter is not None:
            return letter
        _set_aside(raw, "is not well formed")


def return_dead_letter(letter: DeadLetter) -> None:
    client().lpush(DEAD_LETTER_KEY, json.dumps(letter))


def replay_dead_letters(limit: int | None = None) -> tuple[int, int]:
    """Ingest parked messages again, oldest first, through the signed paths only (each one is
    checked as if it had just come: its region's signature, that region's open slots); returns
    (messages replayed, results newly stored). Stops at the first database error, the message
    put back first in line."""
    # Imported here: the status page reads depths without loading ingest's column checks.
    from django.db import InterfaceError, OperationalError

    from monitor.pipeline.ingest import races, scenarios
    from monitor.pipeline.ingest import results as ingest

    replayed = stored = 0
    while limit is None or replayed < limit:
        letter = take_dead_letter()
        if letter is None:
            break
        body = letter["body"]
        try:
            if letter["kind"] == "scenario":
                stored += int(scenarios.ingest_signed(body))
            elif letter["kind"] == "race":
                stored += int(races.ingest_signed(body))
            else:
                stored += ingest.ingest_signed(body)
        except (OperationalError, InterfaceError):
            return_dead_letter(letter)
            raise
        except Exception:
            # An engine bug, not the letter's sender: kept for a person, and the rest go on.
            log.exception("replaying a %s dead letter failed", letter["kind"])
            _set_aside(json.dumps(letter).encode(), "could not be replayed")
            continue
        replayed += 1
    return replayed, stored


def known_queues(region_queue_names: Iterable[str]) -> list[str]:
    """Every queue Routewatch uses: the tick's, ingest's, the default one (beat's other
    periodic tasks) and one per region."""
    return [SCHEDULE_QUEUE, *INGEST_QUEUE_NAMES, *sorted(region_queue_names)]


class BrokerFigures(TypedDict):
    depths: dict[str, int]
    unacked: int
    dead_letters: int
    malformed_dead_letters: int  # set aside by a replay, kept for a person to read


def broker_figures(region_queue_names: Iterable[str]) -> BrokerFigures | None:
    """Queue depths, unacknowledged messages and parked dead letters; None when the broker
    does not answer (the pages say so rather than fail)."""
    try:
        return {
            "depths": depths(known_queues(region_queue_names)),
            "unacked": unacked(),
            "dead_letters": dead_letter_count(),
            "malformed_dead_letters": malformed_dead_letter_count(),
        }
    except redis.RedisError:
        log.warning("broker figures unavailable: Redis does not answer")
        return None
