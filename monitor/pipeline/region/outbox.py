"""A region worker process's outbox: the results of every batch it runs leave together.

A region worker holds hundreds of batches at once (the threads pool), and each batch's probes
end over the tick's spread and their own durations. Sent batch by batch, results left as
messages of one or two each: at the realistic mix's 1x, 6,500 ingest messages in ten minutes,
1.6 results each, and a message cost ingest about 0.33 s whatever it held (its signature, its
transaction, the slot, rollup and health rows it locks) against about 10 ms a result more
(bench/RESULTS.md): ingest fell minutes behind. The outbox gathers what every batch of the
process hands it and sends it every `every_s` seconds as one message per region key (the key
its batches came under), so ingest sees a few messages a second, each of many results.

Nothing is acknowledged before it left: a batch waits, at its end, until everything it handed
to the outbox was published or spooled (`wait`), and only then returns, so its message is
acknowledged (acks_late) after its results are out of this process. A worker killed before
that leaves the batch unacknowledged, and it is delivered again (ingest keeps one result per
slot). With `every_s` 0, each hand-over is sent at once, in the caller's thread.

A message is delivered with the time its newest item was handed over (`now` then), not the
time it leaves: ingest keeps a result only if it was sealed by its slot's deadline, and while
the broker cannot be reached a delivery blocks for its retries (seconds to tens of seconds)
while other results wait here, measured in time. Items handed over more than one interval
and a second apart (`span_s`) leave in separate messages, so no item is sealed later after it
was in hand than an interval's wait made it before; a round of the usual interval stays one
message (ingest pays about 0.33 s a message: splitting each round in two doubled its
messages, and its lag p99 went from 2.7 to 7.1 s under bench-load).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

# A message holds at most this many results: ingest writes a message in one transaction.
MAX_PER_MESSAGE = 500


class Outbox(Generic[T]):
    """Items handed over by many threads, delivered by one, every `every_s` seconds, grouped
    by key; `deliver(key, items, handed_at)` must not raise (monitor.tasks.publish_or_spool
    spools what the broker cannot take). `handed_at` is `now()` when the newest of `items` was
    handed over."""

    def __init__(
        self,
        deliver: Callable[[str, list[T], float], None],
        every_s: float,
        now: Callable[[], float] = time.time,
        span_s: float | None = None,
    ) -> None:
        self._deliver = deliver
        self._every_s = every_s
        self._now = now
        self._span_s = every_s + 1.0 if span_s is None else span_s
        self._changed = threading.Condition()
        self._pending: dict[str, list[tuple[float, list[T]]]] = {}
        self._handed = 0  # tickets given out
        self._delivered = 0  # every ticket up to this one has left
        self._thread: threading.Thread | None = None

    def put(self, key: str, items: list[T]) -> int:
        """Hand `items` over; returns the ticket to `wait` for."""
        if self._every_s <= 0:
            self._send(key, [(self._now(), items)])
            return 0
        with self._changed:
            self._pending.setdefault(key, []).append((self._now(), items))
            self._handed += 1
            ticket = self._handed
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="results-outbox", daemon=True
                )
                self._thread.start()
            return ticket

    def wait(self, ticket: int) -> None:
        """Return once everything handed over up to `ticket` has been delivered."""
        with self._changed:
            self._changed.wait_for(lambda: self._delivered >= ticket)

    def flush(self) -> None:
        """Deliver what is pending now, in this thread."""
        with self._changed:
            pending, self._pending = self._pending, {}
            upto = self._handed
        for key, handed in pending.items():
            self._send(key, handed)
        with self._changed:
            self._delivered = max(self._delivered, upto)
            self._changed.notify_all()

    def _send(self, key: str, handed: list[tuple[float, list[T]]]) -> None:
        for chunk, handed_at in _messages(handed, self._span_s):
            try:
                self._deliver(key, chunk, handed_at)
            except Exception as exc:  # deliver must not raise; if it does, say so and go on
                log.error(  # the error's type only: its message may quote results
                    "the results outbox could not deliver %d results (%s)",
                    len(chunk),
                    type(exc).__name__,
                )

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait(self._every_s)
            self.flush()


def _messages(handed: list[tuple[float, list[T]]], span_s: float) -> list[tuple[list[T], float]]:
    """Hand-overs (in the order made) as messages of at most MAX_PER_MESSAGE items, each of
    items handed over within `span_s` of its first one, with its newest item's time."""
    messages: list[tuple[list[T], float]] = []
    chunk: list[T] = []
    first = last = 0.0
    for at, items in handed:
        for item in items:
            if chunk and (len(chunk) >= MAX_PER_MESSAGE or at - first > span_s):
                messages.append((chunk, last))
                chunk = []
            if not chunk:
                first = at
            chunk.append(item)
            last = at
    if chunk:
        messages.append((chunk, last))
    return messages
