"""A region worker process's results outbox (monitor.pipeline.region.outbox): every batch's results
leave together, one message per region key, and a batch is not done before its own have left.
At the realistic mix's 1x, batch-by-batch messages held 1.6 results each and ingest, paying
about 0.33 s a message, fell minutes behind (bench/RESULTS.md)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.utils import timezone

from monitor.pipeline.beat import slots
from monitor.pipeline.region import outbox, worker
from simulator.testing import SimulatorProcess
from tests.monitor import factories as f
from tests.sim_fixtures import OPENAI_KEY, sim  # noqa: F401 (fixture)

HOUR = 3600.0  # an interval the outbox's own thread never reaches in a test


class Receiver:
    """Where delivered messages land (the broker, for monitor.tasks)."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[int]]] = []
        self.times: list[float] = []  # each message's `handed_at`
        self.lock = threading.Lock()

    def __call__(self, key: str, items: list[int], handed_at: float) -> None:
        with self.lock:
            self.messages.append((key, list(items)))
            self.times.append(handed_at)


def test_results_from_many_batches_leave_as_one_message_per_region_key() -> None:
    received = Receiver()
    box: outbox.Outbox[int] = outbox.Outbox(received, HOUR)

    def batch(n: int) -> None:  # each hands over three results, one at a time
        for i in range(3):
            box.put("key-a" if n % 2 else "key-b", [n * 10 + i])

    threads = [threading.Thread(target=batch, args=(n,)) for n in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert received.messages == []  # nothing leaves before the interval
    box.flush()

    assert sorted(key for key, _ in received.messages) == ["key-a", "key-b"]
    for key, items in received.messages:
        batches = range(1, 40, 2) if key == "key-a" else range(0, 40, 2)
        assert sorted(items) == sorted(n * 10 + i for n in batches for i in range(3))
        # each batch's results in the order it handed them over
        for n in batches:
            mine = [x for x in items if x // 10 == n]
            assert mine == [n * 10, n * 10 + 1, n * 10 + 2]


def test_a_batch_waits_until_its_results_have_left() -> None:
    received = Receiver()
    box: outbox.Outbox[int] = outbox.Outbox(received, HOUR)
    ticket = box.put("key", [1, 2])
    done = threading.Event()

    def acknowledge() -> None:
        box.wait(ticket)
        done.set()

    waiter = threading.Thread(target=acknowledge)
    waiter.start()
    waiter.join(0.3)
    assert not done.is_set()  # its results are still here: it must not be acknowledged
    box.flush()
    waiter.join(10)
    assert done.is_set()
    assert received.messages == [("key", [1, 2])]


def test_the_outbox_sends_on_its_own_every_interval() -> None:
    received = Receiver()
    box: outbox.Outbox[int] = outbox.Outbox(received, 0.05)
    box.wait(box.put("key", [7]))
    assert received.messages == [("key", [7])]
    second = box.put("key", [8, 9])
    box.wait(second)
    assert received.messages[-1] == ("key", [8, 9])


def test_a_big_hand_over_is_cut_into_messages_of_bounded_size() -> None:
    received = Receiver()
    box: outbox.Outbox[int] = outbox.Outbox(received, HOUR)
    box.put("key", list(range(outbox.MAX_PER_MESSAGE * 2 + 3)))
    box.flush()
    assert [len(items) for _, items in received.messages] == [
        outbox.MAX_PER_MESSAGE,
        outbox.MAX_PER_MESSAGE,
        3,
    ]


def test_results_in_hand_while_a_delivery_blocks_keep_the_time_they_were_handed_over() -> None:
    """A delivery blocks while the broker cannot be reached (its retries: seconds to tens of
    seconds). Results handed over meanwhile were measured in time: each message carries when
    its newest result was handed over, not when it left, so ingest does not refuse them as
    sealed after their slots' deadlines; hand-overs more than an interval and a second apart
    leave apart."""
    clock = [1000.0]
    received = Receiver()
    blocked, release = threading.Event(), threading.Event()

    def deliver(key: str, items: list[int], handed_at: float) -> None:
        if items == [1]:  # the broker is gone: this delivery waits on its retries
            blocked.set()
            assert release.wait(10)
        received(key, items, handed_at)

    # Its interval, 1 s here: hand-overs more than 2 s apart leave apart.
    box: outbox.Outbox[int] = outbox.Outbox(deliver, HOUR, lambda: clock[0], span_s=2.0)
    box.put("key", [1])
    first = threading.Thread(target=box.flush)
    first.start()
    assert blocked.wait(10)
    for at, item in ((1000.5, 2), (1002.0, 3), (1030.0, 4)):  # handed over while it blocks
        clock[0] = at
        box.put("key", [item])
    clock[0] = 1060.0  # the broker answers 60 s after the first hand-over
    release.set()
    first.join(10)
    box.flush()

    assert received.messages == [("key", [1]), ("key", [2, 3]), ("key", [4])]
    assert received.times == [1000.0, 1002.0, 1030.0]


def test_a_round_of_the_usual_interval_leaves_as_one_message() -> None:
    """Ingest pays per message: hand-overs within one interval (and a second) are not split."""
    clock = [1000.0]
    received = Receiver()
    box: outbox.Outbox[int] = outbox.Outbox(received, 2.0, lambda: clock[0])
    for at, item in ((1000.0, 1), (1001.0, 2), (1002.9, 3)):
        clock[0] = at
        box.put("key", [item])
    box.flush()
    assert received.messages[-1] == ("key", [1, 2, 3])
    assert received.times[-1] == 1002.9


def test_with_no_interval_each_hand_over_leaves_at_once() -> None:
    received = Receiver()
    box: outbox.Outbox[int] = outbox.Outbox(received, 0)
    box.wait(box.put("key", [1]))
    assert received.messages == [("key", [1])]


@pytest.mark.django_db
def test_a_batch_streams_every_result_even_with_flushing_at_once(
    sim: SimulatorProcess,  # noqa: F811
    settings: Any,
) -> None:
    """RW_RESULT_FLUSH_SECONDS=0 (allowed: "send each result as it ends") used to run the
    batch without handing anything on, so a region worker sent none of its results."""
    settings.RESULT_FLUSH_SECONDS = 0
    p = f.provider("fastchip", base_url=f"{sim.base_url}/fastchip/v1")
    p.set_api_key(OPENAI_KEY)
    p.save()
    routes = [f.route(p, "fast-small")]
    region = f.region("local")
    t = f.task("now", routes, [region], max_tokens=10, probe_timeout_s=20)
    at = timezone.now().replace(microsecond=0)
    probes = [slots.probe_message(slots.Slot(t, routes[0], region, at), [])] * 3
    emitted: list[Any] = []

    returned = worker.run_batch({"region": "local", "probes": probes}, emit=emitted.extend)

    assert len(returned) == 3
    assert [p["outcome"] for p in emitted] == ["ok"] * 3
