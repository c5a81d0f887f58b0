"""No lost results: real components stopped, killed and restarted for real.

Each test runs real Celery workers (and beat where the schedule matters) against the embedded
Redis and PostgreSQL and the simulated provider, breaks one component, and counts what was
lost (goal: 0) and how long the pipeline took to recover. Time is compressed: 10 s probe
intervals, 5 s deadlines, a 3 s grace and a 1 s tick. The figures are printed; run with

    make pytest PYTEST_ARGS="tests/monitor/pipeline/test_fault_recovery.py -s -q"

RW_FAULT_OUTAGE_S sets the ingest outage (default 25 s, two and a half probe intervals; 300 s
is the issue's five minutes).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import Count

from devstack import embedded
from monitor import tasks
from monitor.models import ProbeResult, ProbeSlot, Provider, Region, RegionKey, Route, Task
from monitor.pipeline import queues, signing
from monitor.pipeline.beat import scheduling
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.messages import INGEST_QUEUE
from simulator.testing import CONFIGS, SimulatorProcess
from tests import support
from tests.processes import ProcessStack, running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.fault]

REGION = "r-fault"
INTERVAL_S = 10


def _external() -> bool:
    return bool(os.environ.get("RW_EXTERNAL_SERVICES"))


def _var_dir() -> Path:
    return Path(os.environ["RW_VAR_DIR"])


def _figure(name: str, value: str) -> None:
    print(f"\nFAULT FIGURE {name}: {value}")


# The key each region's worker holds, issued when the test configures its region.
REGION_KEYS: dict[str, str] = {}


class Stack(ProcessStack):
    def ingest_worker(self, queues_: str = "schedule,ingest,default", **extra: str) -> None:
        self.start(
            "ingest",
            support.celery("worker", "-Q", queues_, "-c", "2", "-n", "ingest@%h", "-l", "INFO"),
            extra,
        )

    def region_worker(self, sim: SimulatorProcess, **extra: str) -> None:
        self.start(
            "region",
            support.region_worker(REGION, f"{REGION}@%h"),
            {
                # What a region worker gets: the broker and its region's key, no database,
                # no master key (monitor.pipeline.signing).
                "RW_WORKER_ONLY": "true",
                "RW_REGION": REGION,
                "RW_REGION_KEYS": REGION_KEYS[REGION],
                "DATABASE_URL": "",
                "FIELD_ENCRYPTION_KEYS": "",
                "RW_SPOOL_DIR": str(self.tmp / "spool"),
                "RW_SPOOL_RETRY_SECONDS": "2",
                **extra,
            },
        )


def _configure(sim: SimulatorProcess, *, timeout_s: int = 5) -> Task:
    fast = Provider(
        name="FastChip",
        slug="fastchip",
        base_url=f"{sim.base_url}/fastchip/v1",
        wire_format="openai",
    )
    fast.set_api_key("sk-test-fastchip-0123456789")
    fast.save()
    routes = [
        Route.objects.create(provider=fast, model_id=m)
        for m in ("fast-small", "mid-think", "slow-large")
    ]
    region = Region.objects.create(name=REGION, slug=REGION)
    key, secret = RegionKey.issue(region)
    REGION_KEYS[REGION] = f"{key.key_id}:{secret}"
    task = Task.objects.create(
        name="faults",
        slug="faults",
        user_template="What is 12 * 12?",
        input_tokens=200,
        max_tokens=20,
        probe_interval_s=INTERVAL_S,
        probe_timeout_s=timeout_s,
    )
    task.routes.set(routes)
    task.regions.set([region])
    return task


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(CONFIGS / "test.toml") as s:
        yield s


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    env = support.child_env(
        connection.settings_dict,
        TICK_SECONDS="1",
        SLOT_GRACE_SECONDS="3",
        PROVIDER_ALLOW_PRIVATE_NETWORKS="true",
    )
    with running(Stack(tmp_path, env)) as s:
        yield s


def _fresh() -> None:
    connection.close()  # the server may have restarted under us


def _one_row_per_slot() -> bool:
    per_slot = (
        ProbeResult.objects.filter(slot_at__isnull=False)
        .values("task_id", "route_id", "region_id", "slot_at")
        .annotate(n=Count("id"))
    )
    return all(row["n"] == 1 for row in per_slot)


def _settle(s: Stack, timeout_s: float = 30) -> None:
    """Stop scheduling; let in-flight slots finish or pass their deadlines."""
    if "beat" in s.procs:
        s.stop("beat")

    def closed() -> bool:
        _fresh()
        ingest.sweep_missed()
        return not ProbeSlot.objects.filter(status="dispatched").exists()

    support.wait_until(closed, timeout_s, interval_s=1)


def test_ingest_stopped_then_restarted_loses_no_on_time_result(
    sim: SimulatorProcess, stack: Stack
) -> None:
    outage_s = float(os.environ.get("RW_FAULT_OUTAGE_S", "25"))
    _configure(sim)
    # Ticks (and their sweep of missed slots) keep running on their own worker, so the sweep
    # records the outage's slots missed before their results can arrive: the hard case.
    stack.start(
        "default", support.celery("worker", "-Q", "schedule,default", "-c", "1", "-n", "default@%h")
    )
    stack.ingest_worker("ingest")
    stack.region_worker(sim)
    stack.start("beat", support.celery("beat", "-s", str(stack.tmp / "beat.schedule")))
    assert support.wait_until(lambda: ProbeResult.objects.filter(outcome="ok").count() >= 3, 60), (
        stack.logs()
    )
    stack.stop("ingest")
    down_at = datetime.now(UTC)
    time.sleep(outage_s)
    _fresh()
    missed_meanwhile = ProbeSlot.objects.filter(status="missed", slot_at__gte=down_at).count()
    stack.restart("ingest")
    back = time.monotonic()
    back_at = datetime.now(UTC)

    def backlog_stored() -> bool:
        _fresh()
        return (
            not ProbeResult.objects.filter(
                slot_at__gte=down_at, slot_at__lt=back_at, outcome="missed"
            ).exists()
            and not ProbeSlot.objects.filter(slot_at__lt=back_at, status="dispatched").exists()
        )

    assert support.wait_until(backlog_stored, 120, interval_s=0.5), stack.logs()
    recovery_s = time.monotonic() - back
    time.sleep(5)
    _settle(stack)
    slots = ProbeSlot.objects.filter(slot_at__gte=down_at)
    outcomes = Counter(
        ProbeResult.objects.filter(slot_at__gte=down_at).values_list("outcome", flat=True)
    )
    lost = outcomes["missed"]
    _figure(
        "ingest outage",
        f"{outage_s:.0f} s down, {slots.count()} slots since, {missed_meanwhile} marked missed "
        f"during it, {lost} lost after; backlog stored {recovery_s:.1f} s after restart",
    )
    assert missed_meanwhile > 0  # the sweep did run during the outage
    assert lost == 0, (outcomes, stack.logs())
    assert outcomes["ok"] == slots.count()
    assert _one_row_per_slot()


def _batch_now() -> int:
    """Claim the current slots and send their batch to the region's queue (as beat would);
    returns how many probes went. Only the slots whose time has come (none claimed ahead):
    they start at once, spread over a tick, where the faults below are placed."""
    sent = tasks.send(scheduling.plan(ahead_s=0))
    return sent.get(REGION, 0)


def test_broker_stopped_while_a_worker_finishes_a_batch_loses_nothing(
    sim: SimulatorProcess, stack: Stack
) -> None:
    if _external():
        pytest.skip("restarts need the embedded servers")
    _configure(sim, timeout_s=30)
    stack.ingest_worker()
    # TICK_SECONDS 10: the batch's starts are spread over 10 s, so it is mid-batch below.
    stack.region_worker(sim, TICK_SECONDS="10")
    # Kept running as deployed: a worker whose broker connection breaks while it acknowledges
    # a task can exit ("Unrecoverable error" from kombu's Redis transport); compose and
    # `make run` start it again, and nothing it held may be lost meanwhile.
    stack.supervise("ingest", "region")
    assert support.wait_until(lambda: "ready" in stack.log("region"), 30), stack.logs()
    assert support.wait_until(lambda: "ready" in stack.log("ingest"), 30), stack.logs()
    probes = _batch_now()
    assert probes == 3
    assert support.wait_until(lambda: "run_probe_batch" in stack.log("region"), 15)
    time.sleep(2)
    embedded.stop_redis(_var_dir())
    spool_dir = stack.tmp / "spool"
    try:
        spooled = support.wait_until(
            lambda: spool_dir.exists() and any(spool_dir.glob("*.json")), 40
        )
        time.sleep(3)  # the spool is retried meanwhile: the broker is still away
    finally:
        embedded.start_redis(_var_dir())
    back = time.monotonic()
    assert spooled, stack.logs()

    def stored() -> bool:
        return ProbeResult.objects.filter(outcome="ok").count() >= probes

    assert support.wait_until(stored, 60, interval_s=0.5), stack.logs()
    recovery_s = time.monotonic() - back
    assert not any(spool_dir.glob("*.json*"))
    lost = probes - ProbeResult.objects.filter(outcome="ok").count()
    _figure(
        "broker stopped mid-batch",
        f"{probes} probes, results spooled, {lost} lost; stored {recovery_s:.1f} s after Redis "
        f"came back; worker restarts {dict(stack.restarts) or 'none'}",
    )
    assert lost == 0
    assert set(ProbeSlot.objects.values_list("status", flat=True)) == {"done"}
    assert _one_row_per_slot()


def _open_slots(task: Task, n: int) -> list[tuple[Route, datetime]]:
    """n slots of the task, open for an hour (results for them are sent below)."""
    region = task.regions.get()
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    slots = []
    routes = list(task.routes.all())
    for i in range(n):
        route, at = routes[i % len(routes)], base + timedelta(seconds=INTERVAL_S * (i // 3))
        ProbeSlot.objects.create(
            task=task, route=route, region=region, slot_at=at, deadline_at=at + timedelta(hours=1)
        )
        slots.append((route, at))
    return slots


def _result(task: Task, route: Route, at: datetime) -> dict[str, Any]:
    return {
        "task_id": task.pk,
        "route_id": route.pk,
        "region_id": task.regions.get().pk,
        "slot_at": at.isoformat(),
        "started_at": (at + timedelta(milliseconds=5)).isoformat(),
        "outcome": "ok",
        "ttft_ms": 120.0,
        "e2e_ms": 400.0,
        "tps": 80.0,
        "input_tokens": 200,
        "output_tokens": 20,
    }


def test_database_restarted_mid_ingest_loses_nothing(sim: SimulatorProcess, stack: Stack) -> None:
    if _external():
        pytest.skip("restarts need the embedded servers")
    task = _configure(sim)
    slots = _open_slots(task, 60)
    messages = [[_result(task, r, at)] for r, at in slots]
    # Retries enough to outlast a slow restart on a busy machine (about 2.5 min at 4 s): this
    # test is about retrying; parking after the last retry is test_..._parks_... below.
    stack.ingest_worker(INGEST_RETRY_BACKOFF_MAX_S="4", INGEST_RETRY_MAX="40")
    assert support.wait_until(lambda: "ready" in stack.log("ingest"), 30), stack.logs()
    # A steady stream of results, one message every 0.25 s, across the restart.
    done = threading.Event()

    def publish() -> None:
        key_id, _, secret = REGION_KEYS[REGION].partition(":")
        key = signing.RegionSecret(key_id, secret)
        for body in messages:
            sealed = signing.seal(key, REGION, signing.KIND_RESULTS, body, None)
            tasks.ingest_results.apply_async(args=(sealed,), queue=INGEST_QUEUE)
            time.sleep(0.25)
        done.set()

    publisher = threading.Thread(target=publish)
    publisher.start()
    time.sleep(3)
    connection.close()
    embedded.stop_postgres(_var_dir())
    time.sleep(8)
    embedded.start_postgres(_var_dir())
    back = time.monotonic()
    publisher.join()

    def all_stored() -> bool:
        _fresh()
        return ProbeResult.objects.count() >= len(messages)

    assert support.wait_until(all_stored, 90, interval_s=0.5), stack.logs()
    recovery_s = time.monotonic() - back
    lost = len(messages) - ProbeResult.objects.count()
    retried = stack.log("ingest").count("retry ")
    _figure(
        "database restarted mid-ingest",
        f"{len(messages)} messages, {retried} retries, {lost} lost; all stored "
        f"{recovery_s:.1f} s after PostgreSQL came back",
    )
    assert retried > 0  # the restart really hit ingest
    assert lost == 0
    assert set(ProbeSlot.objects.values_list("status", flat=True)) == {"done"}
    assert _one_row_per_slot()
    assert queues.dead_letter_count() == 0


def test_ingest_parks_what_it_cannot_store_and_the_admin_replays_it(
    sim: SimulatorProcess, stack: Stack
) -> None:
    if _external():
        pytest.skip("restarts need the embedded servers")
    queues.client().delete(queues.DEAD_LETTER_KEY)
    task = _configure(sim)
    slots = _open_slots(task, 6)
    stack.ingest_worker(INGEST_RETRY_MAX="1", INGEST_RETRY_BACKOFF_MAX_S="1")
    assert support.wait_until(lambda: "ready" in stack.log("ingest"), 30), stack.logs()
    # Signed as the region's worker signs them: a replay takes nothing else.
    key_id, _, secret = REGION_KEYS[REGION].partition(":")
    key = signing.RegionSecret(key_id, secret)
    bodies = [
        signing.seal(key, REGION, signing.KIND_RESULTS, [_result(task, r, at)], None)
        for r, at in slots
    ]
    connection.close()
    embedded.stop_postgres(_var_dir())
    try:
        for body in bodies:
            tasks.ingest_results.apply_async(args=(body,), queue=INGEST_QUEUE)
        parked = support.wait_until(lambda: queues.dead_letter_count() == len(slots), 30)
    finally:
        embedded.start_postgres(_var_dir())
    assert parked, stack.logs()
    letter = queues.dead_letters(1)[0]
    assert letter["kind"] == "results"
    assert letter["reason"] in {"OperationalError", "InterfaceError"}
    _fresh()
    call_command("replay_dead_letters")
    assert ProbeResult.objects.count() == len(slots)
    assert queues.dead_letter_count() == 0
    call_command("replay_dead_letters")  # nothing left; repeating stores nothing twice
    assert _one_row_per_slot()
    _figure("dead letters", f"{len(slots)} parked while PostgreSQL was down, 0 lost after replay")


# A consumer that takes one ingest message through kombu's own code (which records it in Redis'
# unacknowledged hash), says so, and waits to be killed without acknowledging it.
_HOLDER = """
import time, django
django.setup()
from monitor.celery import app
with app.connection_for_read() as conn:
    message = conn.default_channel.basic_get("ingest", no_ack=False)
    print("held" if message is not None else "nothing", flush=True)
    time.sleep(600)
"""


def test_an_ingest_message_a_killed_worker_held_comes_back_within_seconds(
    sim: SimulatorProcess, stack: Stack
) -> None:
    """A worker killed (or cut off from the broker) after taking an ingest message and before
    running it leaves the message in Redis' unacknowledged hash; kombu gives it back only after
    its visibility timeout, 17 minutes, when the page has shown its slots missed for long.
    Ingest workers take it back after INGEST_STALLED_SECONDS; its results are stored once."""
    if _external():
        pytest.skip("needs the embedded Redis to itself")
    task = _configure(sim)
    slots = _open_slots(task, 3)
    key_id, _, secret = REGION_KEYS[REGION].partition(":")
    sealed = signing.seal(
        signing.RegionSecret(key_id, secret),
        REGION,
        signing.KIND_RESULTS,
        [_result(task, r, at) for r, at in slots],
        None,
    )
    client = queues.client()
    client.delete(INGEST_QUEUE, "unacked", "unacked_index")
    tasks.ingest_results.apply_async(args=(sealed,), queue=INGEST_QUEUE)
    assert queues.depths([INGEST_QUEUE])[INGEST_QUEUE] == 1
    holder = support.start([sys.executable, "-c", _HOLDER], stack.env, stack.tmp / "holder.log")
    try:
        assert support.wait_until(lambda: "held" in stack.log("holder"), 30), stack.logs()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert queues.depths([INGEST_QUEUE])[INGEST_QUEUE] == 0
    assert queues.unacked() == 1  # kombu's visibility timeout would hold it for 17 minutes

    stack.ingest_worker("ingest", INGEST_STALLED_SECONDS="3")
    killed_at = time.monotonic()

    def stored() -> bool:
        return ProbeResult.objects.filter(outcome="ok").count() >= len(slots)

    assert support.wait_until(stored, 60, interval_s=0.5), stack.logs()
    taken_back_s = time.monotonic() - killed_at
    _figure("ingest message held by a killed worker", f"stored {taken_back_s:.1f} s later")
    assert "took back 1 ingest message" in stack.log("ingest")
    assert ProbeResult.objects.count() == len(slots)
    assert set(ProbeSlot.objects.values_list("status", flat=True)) == {"done"}
    # Acknowledged once run (acks_late): the ack follows the commit that stored the results,
    # so on a loaded machine it may be a moment behind them. One never acknowledged fails here.
    assert support.wait_until(lambda: queues.unacked() == 0, 30, interval_s=0.2), queues.unacked()
    assert _one_row_per_slot()


def test_taking_back_leaves_other_queues_retries_and_fresh_messages_alone() -> None:
    """Only ingest messages held past the threshold go back: never a region's batch (it runs
    for minutes; twice would probe twice), a retry waiting for its time, or one just taken."""
    client = queues.client()
    client.delete(INGEST_QUEUE, "probes.r1", "unacked", "unacked_index")
    now = time.time()

    def held(tag: str, routing_key: str, age_s: float, eta: str | None = None) -> None:
        headers: dict[str, Any] = {"task": "monitor.tasks.ingest_results", "eta": eta}
        message = {"body": "e30=", "headers": headers, "properties": {"delivery_tag": tag}}
        client.hset("unacked", tag, json.dumps([message, routing_key, routing_key]))
        client.zadd("unacked_index", {tag: now - age_s})

    later = datetime.fromtimestamp(now + 60, UTC).isoformat()
    earlier = datetime.fromtimestamp(now - 120, UTC).isoformat()
    held("stalled", INGEST_QUEUE, 100)
    held("batch", "probes.r1", 100)
    held("retry-later", INGEST_QUEUE, 100, eta=later)
    held("retry-due", INGEST_QUEUE, 100, eta=earlier)
    held("fresh", INGEST_QUEUE, 5)
    assert queues.take_back_stalled(30, now=now) == 2
    assert sorted(client.hkeys("unacked")) == [b"batch", b"fresh", b"retry-later"]
    requeued = [json.loads(raw) for raw in client.lrange(INGEST_QUEUE, 0, -1)]
    assert sorted(m["properties"]["delivery_tag"] for m in requeued) == ["retry-due", "stalled"]
    assert all(m["headers"]["redelivered"] for m in requeued)
    assert client.llen("probes.r1") == 0
    assert queues.take_back_stalled(30, now=now) == 0  # each goes back once
    client.delete(INGEST_QUEUE, "unacked", "unacked_index")
