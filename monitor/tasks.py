"""Celery tasks: the one door to the broker.

Thin: each task calls a function of the scheduler, the region worker, ingest, the pages or the
digest, and this module alone sends messages (`apply_async`). The scheduler and races return
what to send (monitor.pipeline.messages.Dispatch), so nothing below imports this module back.
Task names are part of the wire contract (messages already queued and beat's schedule name
them): they never change.
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from monitor.digest import sending
from monitor.models import Heartbeat
from monitor.pages import overview
from monitor.pipeline import ingest, races, scheduling, worker
from monitor.pipeline.messages import (
    INGEST_QUEUE,
    RUN_PROBE_BATCH,
    RUN_RACE,
    Dispatch,
    race_result_to_json,
    results_to_json,
)


def beat(name: str) -> None:
    now = timezone.now()
    updated = Heartbeat.objects.filter(name=name).update(last_seen=now, count=F("count") + 1)
    if not updated:
        Heartbeat.objects.get_or_create(name=name, defaults={"last_seen": now, "count": 1})


@shared_task(name="monitor.tasks.tick")
def tick() -> dict[str, int]:
    """Beat's periodic tick: record missed slots, then claim and send the due ones. Returns
    slots sent per region slug, and the number of races sent under "races"."""
    beat("tick")
    ingest.sweep_missed()
    races.sweep_missed()
    return {"races": 0} | send(scheduling.plan())


# Region-queue tasks: acked only when done (a killed worker's message goes back to the queue);
# a batch or race runs for at most the longest probe deadline, and the limits sit above that.
REGION_TASK_OPTIONS: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "soft_time_limit": settings.CELERY_TASK_SOFT_TIME_LIMIT * 4,
    "time_limit": settings.CELERY_TASK_TIME_LIMIT * 4,
}


@shared_task(name=RUN_PROBE_BATCH, **REGION_TASK_OPTIONS)  # "monitor.tasks.run_probe_batch"
def run_probe_batch(batch: dict[str, Any]) -> int:
    """On a region worker: run a batch of probes, send the results to ingest over the broker."""
    results = worker.run_batch(batch)
    if results:
        ingest_results.apply_async(args=(results_to_json(results),), queue=INGEST_QUEUE)
    return len(results)


@shared_task(name="monitor.tasks.ingest_results", acks_late=True, reject_on_worker_lost=True)
def ingest_results(results: list[dict[str, Any]]) -> int:
    return ingest.ingest(results)


@shared_task(name="monitor.tasks.refresh_overview")
def refresh_overview() -> int:
    """Rebuild the overview snapshot, so readers get it ready-made."""
    return len(overview.refresh().rows)


@shared_task(name="monitor.tasks.delete_old_results")
def delete_old_results() -> int:
    return ingest.delete_old_results(settings.RAW_RETENTION_DAYS)


@shared_task(name=RUN_RACE, **REGION_TASK_OPTIONS)  # "monitor.tasks.run_race"
def run_race(message: dict[str, Any]) -> str | None:
    """On a region worker: run one race, send its result to ingest over the broker."""
    result = worker.run_race(message)
    if result is None:
        return None
    ingest_race.apply_async(args=(race_result_to_json(result),), queue=INGEST_QUEUE)
    return result["winner_route_id"]


@shared_task(name="monitor.tasks.ingest_race", acks_late=True, reject_on_worker_lost=True)
def ingest_race(result: dict[str, Any]) -> bool:
    return races.ingest(result)


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


# What the scheduler may ask to send, by task name.
_DISPATCHABLE: dict[str, Task[Any, Any]] = {
    RUN_PROBE_BATCH: run_probe_batch,
    RUN_RACE: run_race,
}


def send(dispatches: list[Dispatch]) -> dict[str, int]:
    """Send what the scheduler planned, in order; returns the tallies (see `tick`)."""
    sent: dict[str, int] = {}
    for d in dispatches:
        _DISPATCHABLE[d.task_name].apply_async(args=(d.message,), queue=d.queue, expires=d.expires)
        sent[d.tally_key] = sent.get(d.tally_key, 0) + d.tally
    return sent
