"""Celery tasks: the one door to the broker.

Thin: each task calls a function of the scheduler, the region worker, ingest, the pages or the
digest, and this module alone sends messages (`apply_async`). The scheduler and races return
what to send (monitor.pipeline.messages.Dispatch), so nothing below imports this module back.
Task names are part of the wire contract (messages already queued and beat's schedule name
them): they never change.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, shared_task
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from monitor.digest import sending
from monitor.models import Heartbeat
from monitor.pages import overview
from monitor.pages.setup import region_heartbeat
from monitor.pipeline import ingest, races, scheduling, signing, worker
from monitor.pipeline.messages import (
    INGEST_QUEUE,
    RUN_PROBE_BATCH,
    RUN_RACE,
    Dispatch,
    race_result_to_json,
    results_to_json,
)

log = logging.getLogger(__name__)


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
    """On a region worker: run a batch of probes, send the results to ingest over the broker.
    Only a batch signed for this region, unexpired and not seen before, is run."""
    try:
        key_id, body = signing.open_dispatch(batch, signing.KIND_BATCH)
    except signing.Refused as exc:
        log.error("refused a probe batch: %s", exc)
        return 0
    results = worker.run_batch(body)
    if results:
        sealed = signing.seal_results(key_id, signing.KIND_RESULTS, results_to_json(results))
        ingest_results.apply_async(args=(sealed,), queue=INGEST_QUEUE)
    return len(results)


@shared_task(name="monitor.tasks.ingest_results", acks_late=True, reject_on_worker_lost=True)
def ingest_results(results: dict[str, Any]) -> int:
    """Results signed by a region worker: stored only for that region's open slots."""
    try:
        region_id, body = signing.open_results(results, signing.KIND_RESULTS)
    except signing.Refused as exc:
        log.warning("refused a result message: %s", exc)
        ingest.count_rejected(1)
        return 0
    # The region's worker is running: what it signed arrived (the setup checklist reads this).
    beat(region_heartbeat(region_id))
    return ingest.ingest(body, from_region=region_id)


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
    try:
        key_id, body = signing.open_dispatch(message, signing.KIND_RACE)
    except signing.Refused as exc:
        log.error("refused a race message: %s", exc)
        return None
    result = worker.run_race(body)
    if result is None:
        return None
    sealed = signing.seal_results(key_id, signing.KIND_RACE_RESULT, race_result_to_json(result))
    ingest_race.apply_async(args=(sealed,), queue=INGEST_QUEUE)
    return result["winner_route_id"]


@shared_task(name="monitor.tasks.ingest_race", acks_late=True, reject_on_worker_lost=True)
def ingest_race(result: dict[str, Any]) -> bool:
    try:
        region_id, body = signing.open_results(result, signing.KIND_RACE_RESULT)
    except signing.Refused as exc:
        log.warning("refused a race result: %s", exc)
        ingest.count_rejected(1)
        return False
    race = body.get("race") if isinstance(body, dict) else None
    if not isinstance(race, dict) or race.get("region_id") != region_id:
        log.warning("refused a race result: signed by another region than its race's")
        ingest.count_rejected(1)
        return False
    return races.ingest(body, received_at=timezone.now())


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


# What the scheduler may ask to send, by task name, and the kind of envelope it travels in.
_DISPATCHABLE: dict[str, tuple[Task[Any, Any], str]] = {
    RUN_PROBE_BATCH: (run_probe_batch, signing.KIND_BATCH),
    RUN_RACE: (run_race, signing.KIND_RACE),
}


def send(dispatches: list[Dispatch]) -> dict[str, int]:
    """Send what the scheduler planned, in order, each signed for its region (its slots are
    recorded missed when the region has no key); returns the tallies (see `tick`)."""
    sent: dict[str, int] = {}
    for d in dispatches:
        task, kind = _DISPATCHABLE[d.task_name]
        try:
            sealed = signing.seal_dispatch(kind, d.queue, d.message, d.expires)
        except signing.NoRegionKey as exc:
            log.error("not sent: %s", exc)
            continue
        task.apply_async(args=(sealed,), queue=d.queue, expires=d.expires)
        sent[d.tally_key] = sent.get(d.tally_key, 0) + d.tally
    return sent
