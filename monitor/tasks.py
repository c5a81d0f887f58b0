"""Celery tasks: the one door to the broker.

Thin: each task calls a function of the scheduler, the region worker, ingest, the pages or the
digest, and this module alone sends messages (`apply_async`). The scheduler and races return
what to send (monitor.pipeline.messages.Dispatch), so nothing below imports this module back.
Task names are part of the wire contract (messages already queued and beat's schedule name
them): they never change.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Task, shared_task
from celery.signals import task_received, worker_init, worker_ready
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.db.models import F
from django.utils import timezone

from monitor import limits, partitions
from monitor.alerts import delivery as alert_delivery
from monitor.alerts import lifecycle as alert_lifecycle
from monitor.answer import board
from monitor.digest import sending
from monitor.models import HEARTBEAT_TICK, Heartbeat
from monitor.pipeline import queues, signing
from monitor.pipeline.beat import scheduling
from monitor.pipeline.ingest import races as race_results
from monitor.pipeline.ingest import results as probe_results
from monitor.pipeline.ingest import retention
from monitor.pipeline.ingest import scenarios as scenario_results
from monitor.pipeline.messages import (
    INGEST_QUEUE,
    RUN_PROBE_BATCH,
    RUN_RACE,
    RUN_SCENARIO,
    Dispatch,
    RaceResult,
    ResultPayload,
    ScenarioPayload,
    race_result_to_json,
    results_to_json,
    scenario_payload_to_json,
)
from monitor.pipeline.region import clock, liveness, outbox, spool, worker
from monitor.pipeline.region import scenarios as scenario_runs
from probes.tokenizer import count_tokens

log = logging.getLogger(__name__)

T = TypeVar("T")


def beat(name: str) -> None:
    now = timezone.now()
    updated = Heartbeat.objects.filter(name=name).update(last_seen=now, count=F("count") + 1)
    if not updated:
        Heartbeat.objects.get_or_create(name=name, defaults={"last_seen": now, "count": 1})


SWEEP_CHUNK = 500
SWEEP_MAX = 5000


@shared_task(name="monitor.tasks.tick")
def tick() -> dict[str, int]:
    """Beat's periodic tick: record missed slots, then claim and send the due ones. Returns
    slots sent per region slug, and the number of races sent under "races"."""
    beat(HEARTBEAT_TICK)
    # Missed slots in short transactions (each holds its slots' and rollups' row locks, which
    # ingest workers wait on), up to SWEEP_MAX a tick.
    for _ in range(SWEEP_MAX // SWEEP_CHUNK):
        if probe_results.sweep_missed(limit=SWEEP_CHUNK) < SWEEP_CHUNK:
            break
    race_results.sweep_missed()
    return {"races": 0} | send(scheduling.plan())


# Region-queue tasks: acked only when done (a killed worker process's message goes back to the
# queue at once); a batch or race runs for at most the longest probe deadline, and the limits
# sit just above that (monitor.limits derives them, and the visibility timeout, from it).
REGION_TASK_OPTIONS: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    **limits.region_task_limits(),
}

# Publishing results: a few seconds of retries, then the local spool (monitor.pipeline.region.spool).
_PUBLISH_RETRY = {"max_retries": 4, "interval_start": 0.5, "interval_step": 1, "interval_max": 2}


def _publish(entry: spool.SpoolEntry) -> None:
    task = {"race": ingest_race, "scenario": ingest_scenario}.get(entry["kind"], ingest_results)
    task.apply_async(
        args=(entry["body"],), queue=INGEST_QUEUE, retry=True, retry_policy=_PUBLISH_RETRY
    )


def publish_or_spool(kind: spool.SpoolKind, body: object, count: int) -> bool:
    """Send results to ingest; when the broker cannot take them, keep them in the spool.
    Returns whether they were sent now. Never raises: the results are already paid for, and
    a broker client caught mid-reconnect fails with errors of any type (kombu's Redis transport
    raises AttributeError while its connection is being replaced), so any failure spools; and
    a spool that cannot take them either (its disk full) counts them dropped, so the batch's
    other probes, still running, go on (an exception here would cancel them)."""
    try:
        _publish({"kind": kind, "spooled_at": 0.0, "count": count, "body": body})
    except Exception as exc:  # any failure to publish spools (see above)
        log.warning("cannot publish %d %s to ingest (%s)", count, kind, type(exc).__name__)
        try:
            spool.save(kind, body, count)
        except Exception as lost:  # ENOSPC, a read-only or vanished directory: see above
            spool.record_dropped(kind, count, lost)
        return False
    return True


def flush_spool() -> int:
    """Publish what the spool holds (results kept while the broker was away)."""
    try:
        return spool.drain(_publish)
    except Exception as exc:  # as publish_or_spool: the next round retries
        log.info("spooled results wait: the broker is still unavailable (%s)", type(exc).__name__)
        return 0


def _every(seconds: float, work: Callable[[], object], name: str) -> None:
    """Run `work` every `seconds` in a daemon thread of this worker, for as long as it lives;
    a failure is logged (its type only) and the next round tries again."""

    def loop() -> None:
        while True:
            time.sleep(seconds)
            try:
                work()
            except Exception as exc:  # the thread must outlive any one failure
                log.info("%s failed this round (%s)", name, type(exc).__name__)

    threading.Thread(target=loop, name=name, daemon=True).start()


@worker_ready.connect
def _start_spool_flusher(**_: Any) -> None:
    """Every worker publishes its spool periodically, not only when its next batch comes."""
    _every(settings.SPOOL_RETRY_SECONDS, flush_spool, "spool-flusher")


@worker_ready.connect
def _start_stalled_ingest_taker(sender: Any = None, **_: Any) -> None:
    """Workers that consume the ingest queue take back its stalled messages (a worker died or
    lost the broker holding them: queues.take_back_stalled) a few times a minute."""
    consumer = getattr(sender, "task_consumer", None)
    if INGEST_QUEUE in {q.name for q in getattr(consumer, "queues", ())}:
        stalled = settings.INGEST_STALLED_SECONDS
        _every(
            max(1.0, stalled / 3),
            lambda: queues.take_back_stalled(stalled),
            "stalled-ingest-taker",
        )


@worker_init.connect
def _warm_the_engine(**_: Any) -> None:
    """A region worker loads what its first probe would otherwise load on the probe loop (the
    tokenizer's tables: seconds on a busy machine, while every other probe waits)."""
    if settings.RW_REGION:
        count_tokens("warm up")
        # Its clock against the central one before its first message (monitor.pipeline.region.clock).
        with contextlib.suppress(Exception):
            clock.measure()


# When this region worker last took a message (monitor.pipeline.region.liveness.Consumer).
CONSUMER = liveness.Consumer(started=time.monotonic())
# Messages refused because this worker's clock was beyond the tolerance.
_refused_for_clock = 0


@task_received.connect
def _consumed(**_: Any) -> None:
    """The consumer handed a message over: it consumes (whatever the message turns out to be)."""
    CONSUMER.consumed(clock.now())


def _clock_refuses(what: str) -> bool:
    """Refuse a message, with the reason logged, when this worker's clock is too far off the
    central one to judge its expiry and planned starts (monitor.pipeline.region.clock)."""
    global _refused_for_clock
    if clock.offset_s() is None:
        with contextlib.suppress(Exception):
            clock.measure()
    off = clock.beyond_tolerance()
    if off is None:
        return False
    _refused_for_clock += 1
    log.error("refused a %s: %s", what, clock.refusal(off))
    return True


def _version() -> str:
    try:
        return importlib.metadata.version("routewatch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _stop_for_restart(reason: str) -> None:
    """Exit so the supervisor starts this worker again: a warm shutdown, then a hard exit
    after 3 s (a consumer broken this way can hang its own shutdown: seen after a TCP reset
    and after a cut, tests/monitor/pipeline/test_remote_region.py); results already sent are kept, the rest of its
    running batches are recorded missed at their deadlines."""
    log.error("%s; exiting so that its supervisor restarts it", reason)
    threading.Timer(3.0, os._exit, args=(75,)).start()
    os.kill(os.getpid(), signal.SIGTERM)


@worker_ready.connect
def _start_liveness_beacon(sender: Any = None, **_: Any) -> None:
    """A region worker says it is alive, and what it carries, every few seconds
    (monitor.pipeline.region.liveness): the Status page and the overview's banner read it."""
    consumer = getattr(sender, "task_consumer", None)
    names = {q.name for q in getattr(consumer, "queues", ())}
    region = settings.RW_REGION
    if not region or f"probes.{region}" not in names:
        return
    threads = int(getattr(getattr(sender, "pool", None), "limit", 0) or 0)
    version = _version()
    stopping = threading.Event()
    # The consumer's broker connection: a new one (or none) means it lost the broker and is
    # coming back, and is given its time before it counts as stalled.
    seen: dict[str, object] = {"connection": getattr(getattr(sender, "consumer", None), "connection", None)}  # fmt: skip

    def beat() -> None:
        connection = getattr(getattr(sender, "consumer", None), "connection", None)
        if connection is None or connection is not seen["connection"]:
            seen["connection"] = connection
            CONSUMER.restarted()
        load = worker.LOAD
        try:
            clock.measure()
            waiting: int | None = queues.depths([f"probes.{region}"])[f"probes.{region}"]
        except Exception:  # the broker is away: no verdict on consuming (the spool holds on)
            waiting = None
        CONSUMER.reached(waiting is not None)
        idle = CONSUMER.stalled(
            waiting or 0, threads - load.holding, settings.CONSUMER_STALL_SECONDS
        )
        off = clock.beyond_tolerance()
        reason = ""
        if idle is not None:
            reason = (
                f"stopped consuming: {waiting} messages wait in probes.{region}, {threads - load.holding} "
                f"threads are free and it took none for {idle:.0f} s (celery#10205)"
            )
        elif off is not None:
            reason = clock.refusal(off)
        with contextlib.suppress(OSError):
            liveness.write_health(
                spool.directory(),
                {
                    "written_at": time.time(),
                    "pid": os.getpid(),
                    "consuming": idle is None,
                    "clock_ok": off is None,
                    "reason": reason,
                },
            )
        if idle is not None and not stopping.is_set():
            stopping.set()
            _stop_for_restart(f"region worker {reason}")
        try:
            spooled = spool.pending()
        except OSError:
            spooled = -1
        offset = clock.offset_s()
        liveness.publish(
            {
                "region": region,
                "worker": f"{socket.gethostname()}:{os.getpid()}",
                "seen_at": clock.now(),
                "in_flight": load.in_flight,
                "holding": load.holding,
                "capacity": settings.PROBES_IN_FLIGHT_MAX,
                "threads": threads,
                "started": load.started,
                "late": load.late,
                "peak": load.peak,
                "version": version,
                "clock_offset_s": None if offset is None else round(offset, 3),
                "clock_ok": off is None,
                "clock_tolerance_s": settings.CLOCK_TOLERANCE_SECONDS,
                "spooled": spooled,
                "last_consumed_at": CONSUMER.last_consumed_at,
                "consuming": idle is None,
            }
        )

    with contextlib.suppress(Exception):  # the first beat at once; the thread retries
        beat()
    _every(liveness.BEAT_SECONDS, beat, "liveness-beacon")


def _open_and_run(
    message: dict[str, Any], kind: str, what: str, run: Callable[[str, Any], T]
) -> tuple[str, T] | None:
    """What every region task does around its work, written once: refuse the message while
    this worker's clock is too far off the central one, open its envelope (signed for this
    region, unexpired, not seen before: monitor.pipeline.signing), publish what the spool
    holds, then run the body while the worker holds it (worker.holding). Returns the key id
    that opened it (results are sealed with it) and what `run` returned; None when refused."""
    if _clock_refuses(what):
        return None
    try:
        key_id, body = signing.open_dispatch(message, kind)
    except signing.Refused as exc:
        log.error("refused a %s: %s", what, exc)
        return None
    flush_spool()
    with worker.holding():
        return key_id, run(key_id, body)


def _reply(
    key_id: str,
    kind: str,
    spool_kind: spool.SpoolKind,
    body: object,
    count: int,
    issued_at: float | None = None,
) -> None:
    """Results leave signed with the key that opened their message (spooled ones too), sealed
    as of `issued_at` (central time: when they were in hand) or now."""
    publish_or_spool(spool_kind, signing.seal_results(key_id, kind, body, issued_at), count)


@shared_task(name=RUN_PROBE_BATCH, **REGION_TASK_OPTIONS)  # "monitor.tasks.run_probe_batch"
def run_probe_batch(batch: dict[str, Any]) -> int:
    """On a region worker: run a batch of probes, send the results to ingest over the broker
    (or to the local spool while the broker cannot take them)."""

    def run(key_id: str, body: Any) -> int:
        last = [0]  # tickets grow: the last one covers every earlier hand-over

        def send(results: list[ResultPayload]) -> None:
            last[0] = RESULTS_OUTBOX.put(key_id, results)

        # Results leave as their probes end (worker.run_batch), with every other batch's of
        # this process (the outbox: one message per key every RESULT_FLUSH_SECONDS); the batch
        # ends, and is acknowledged, once all of its own have left.
        try:
            return len(worker.run_batch(body, emit=send, every_s=HAND_OVER_SECONDS))
        finally:
            RESULTS_OUTBOX.wait(last[0])

    done = _open_and_run(batch, signing.KIND_BATCH, "probe batch", run)
    return 0 if done is None else done[1]


def _send_results(key_id: str, results: list[ResultPayload], handed_at: float) -> None:
    _reply(
        key_id, signing.KIND_RESULTS, "results", results_to_json(results), len(results), handed_at
    )


# monitor.pipeline.region.outbox: a region worker process's results, from all of its batches,
# sealed as of when their batches handed them over (central time), not when they leave.
RESULTS_OUTBOX: outbox.Outbox[ResultPayload] = outbox.Outbox(
    _send_results, float(settings.RESULT_FLUSH_SECONDS), clock.now
)
# How often a running batch hands its ended probes to the outbox (cheap: a list append).
HAND_OVER_SECONDS = 0.25


# Ingest tasks: a database error, or a region key whose secret cannot be decrypted (an
# encryption key dropped before `manage.py rotate_api_keys` ran: ours to fix, not the
# results'), is retried with backoff (1 s, 2 s, 4 s, ... capped), and after INGEST_RETRY_MAX
# retries the message (still signed) is parked in the dead-letter list, never dropped.
_RETRIED_ERRORS = (OperationalError, InterfaceError, signing.KeyUnavailable)


def _ingest_or_retry(
    task: Task[Any, Any],
    kind: queues.DeadLetterKind,
    body: dict[str, Any],
    store: Callable[[object], T],
    refused: T,
) -> T:
    """What every ingest task does around its store, written once: retried or parked."""
    try:
        return store(body)
    except _RETRIED_ERRORS as exc:
        _retry_or_park(task, kind, body, exc)
        return refused


def _retry_or_park(
    task: Task[Any, Any], kind: queues.DeadLetterKind, body: object, exc: Exception
) -> None:
    retries = task.request.retries
    if retries >= settings.INGEST_RETRY_MAX:
        queues.park(kind, body, type(exc).__name__, retries + 1)
        return
    countdown = limits.ingest_backoff_s(retries, settings.INGEST_RETRY_BACKOFF_MAX_S)
    log.warning(
        "ingest of %s failed (%s); retry %d in %d s",
        kind,
        type(exc).__name__,
        retries + 1,
        countdown,
    )
    raise task.retry(countdown=countdown, max_retries=settings.INGEST_RETRY_MAX) from None


@shared_task(
    name="monitor.tasks.ingest_results", bind=True, acks_late=True, reject_on_worker_lost=True
)
def ingest_results(self: Task[Any, Any], results: dict[str, Any]) -> int:
    """Results signed by a region worker: stored only for that region's open slots."""
    return _ingest_or_retry(self, "results", results, probe_results.ingest_signed, 0)


@shared_task(name="monitor.tasks.refresh_overview")
def refresh_overview() -> int | None:
    """Rebuild the overview snapshot, so readers get it ready-made: its number of rows, or
    None when another rebuild is running or the last one was too recent for its cost
    (board.rebuild_due)."""
    with board.rebuilding() as mine:
        if not mine or not board.rebuild_due():
            return None
        return len(board.refresh(keep_settled=True).rows)


@shared_task(name="monitor.tasks.delete_old_results")
def delete_old_results() -> int:
    return retention.delete_old_results(settings.RAW_RETENTION_DAYS)


@shared_task(name="monitor.tasks.ensure_partitions")
def ensure_partitions() -> int:
    """Create the raw results' daily partitions of the coming days (monitor.partitions)."""
    return partitions.ensure_ahead()


@shared_task(name=RUN_RACE, **REGION_TASK_OPTIONS)  # "monitor.tasks.run_race"
def run_race(message: dict[str, Any]) -> str | None:
    """On a region worker: run one race, send its result to ingest over the broker."""
    done = _open_and_run(message, signing.KIND_RACE, "race message", _run_race)
    if done is None:
        return None
    key_id, result = done
    if result is None:
        return None
    _reply(key_id, signing.KIND_RACE_RESULT, "race", race_result_to_json(result), 1)
    return result["winner_route_id"]


def _run_race(_key_id: str, body: Any) -> RaceResult | None:
    return worker.run_race(body)


@shared_task(
    name="monitor.tasks.ingest_race", bind=True, acks_late=True, reject_on_worker_lost=True
)
def ingest_race(self: Task[Any, Any], result: dict[str, Any]) -> bool:
    return _ingest_or_retry(self, "race", result, race_results.ingest_signed, False)


@shared_task(name=RUN_SCENARIO, **REGION_TASK_OPTIONS)  # "monitor.tasks.run_scenario"
def run_scenario(message: dict[str, Any]) -> str | None:
    """On a region worker: run one scenario, send its result to ingest over the broker (or to
    the local spool while the broker cannot take it)."""
    done = _open_and_run(message, signing.KIND_SCENARIO, "scenario message", _run_scenario)
    if done is None:
        return None
    key_id, result = done
    if result is None:
        return None
    _reply(key_id, signing.KIND_SCENARIO_RESULT, "scenario", scenario_payload_to_json(result), 1)
    return result["outcome"]


def _run_scenario(_key_id: str, body: Any) -> ScenarioPayload | None:
    return scenario_runs.run(body)


@shared_task(
    name="monitor.tasks.ingest_scenario", bind=True, acks_late=True, reject_on_worker_lost=True
)
def ingest_scenario(self: Task[Any, Any], result: dict[str, Any]) -> bool:
    """A scenario result signed by a region worker: stored only for that region's open slot."""
    return _ingest_or_retry(self, "scenario", result, scenario_results.ingest_signed, False)


@shared_task(
    name="monitor.tasks.send_digests",
    # One run sends every due digest; each is claimed under a lease (monitor.digest.sending), so
    # a run cut short by the limits leaves the rest for the next run, never a duplicate.
    soft_time_limit=600,
    time_limit=660,
)
def send_digests() -> dict[str, int]:
    summary = sending.send_due()
    return {"sent": summary.sent, "skipped": summary.skipped, "failed": summary.failed}


@shared_task(
    name="monitor.tasks.evaluate_alerts",
    # Each rule is evaluated under its row lock and each notification sent under a lease
    # (monitor.alerts): a run cut short leaves the rest to the next run, never a duplicate.
    soft_time_limit=120,
    time_limit=150,
)
def evaluate_alerts() -> dict[str, int]:
    """Evaluate every enabled alert rule, then send the notifications that are due."""
    evaluated = alert_lifecycle.evaluate_all()
    sent = alert_delivery.send_due()
    return {
        "rules": evaluated.rules,
        "skipped_rules": evaluated.skipped,
        "events": evaluated.events,
        "sent": sent.sent,
        "failed": sent.failed,
    }


@shared_task(name="monitor.tasks.deliver_alerts", soft_time_limit=120, time_limit=150)
def deliver_alerts() -> dict[str, int]:
    """Send the alert notifications that are due (also done after each evaluation)."""
    sent = alert_delivery.send_due()
    return {"sent": sent.sent, "skipped": sent.skipped, "failed": sent.failed}


# What the scheduler may ask to send, by task name, and the kind of envelope it travels in.
_DISPATCHABLE: dict[str, tuple[Task[Any, Any], str]] = {
    RUN_PROBE_BATCH: (run_probe_batch, signing.KIND_BATCH),
    RUN_RACE: (run_race, signing.KIND_RACE),
    RUN_SCENARIO: (run_scenario, signing.KIND_SCENARIO),
}


def send(dispatches: list[Dispatch]) -> dict[str, int]:
    """Send what the scheduler planned, in order, each signed for its region (its slots are
    recorded missed when the region has no key, or none that FIELD_ENCRYPTION_KEYS opens; the
    other regions' still go); returns the tallies (see `tick`)."""
    sent: dict[str, int] = {}
    for d in dispatches:
        task, kind = _DISPATCHABLE[d.task_name]
        try:
            sealed = signing.seal_dispatch(kind, d.queue, d.message, d.expires)
        except signing.NoRegionKey as exc:
            log.error("not sent: %s", exc)
            continue
        # No Celery `expires`: Celery compares it with the worker's own clock and discards the
        # message unlogged ("revoked") when that clock runs ahead; the signed expiry is checked
        # by the worker in central time (monitor.pipeline.region.clock), and a refusal is logged.
        task.apply_async(args=(sealed,), queue=d.queue)
        sent[d.tally_key] = sent.get(d.tally_key, 0) + d.tally
    return sent
