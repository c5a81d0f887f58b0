"""Celery tasks. Thin: each calls a function of the scheduler, the ingest or the engine."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from monitor.models import Heartbeat


def beat(name: str) -> None:
    now = timezone.now()
    updated = Heartbeat.objects.filter(name=name).update(last_seen=now, count=F("count") + 1)
    if not updated:
        Heartbeat.objects.get_or_create(name=name, defaults={"last_seen": now, "count": 1})


@shared_task(name="monitor.tasks.tick")
def tick() -> dict[str, int]:
    """Beat's periodic tick: record missed slots, then claim and send the due ones."""
    from monitor.pipeline import ingest, races, scheduling

    beat("tick")
    ingest.sweep_missed()
    races.sweep_missed()
    return scheduling.tick()


# Region-queue tasks: acked only when done (a killed worker's message goes back to the queue);
# a batch or race runs for at most the longest probe deadline, and the limits sit above that.
REGION_TASK_OPTIONS: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "soft_time_limit": settings.CELERY_TASK_SOFT_TIME_LIMIT * 4,
    "time_limit": settings.CELERY_TASK_TIME_LIMIT * 4,
}


@shared_task(name="monitor.tasks.run_probe_batch", **REGION_TASK_OPTIONS)
def run_probe_batch(batch: dict[str, Any]) -> int:
    """On a region worker: run a batch of probes, send the results to ingest over the broker."""
    from monitor.pipeline import worker

    results = worker.run_batch(batch)
    ingest_results.apply_async(args=(results,), queue="ingest")
    return len(results)


@shared_task(name="monitor.tasks.ingest_results", acks_late=True, reject_on_worker_lost=True)
def ingest_results(results: list[dict[str, Any]]) -> int:
    from monitor.pipeline import ingest

    return ingest.ingest(results)


@shared_task(name="monitor.tasks.refresh_overview")
def refresh_overview() -> int:
    """Rebuild the overview snapshot, so readers get it ready-made."""
    from monitor.pages import overview

    return len(overview.refresh().rows)


@shared_task(name="monitor.tasks.delete_old_results")
def delete_old_results() -> int:
    from monitor.pipeline import ingest

    return ingest.delete_old_results(settings.RAW_RETENTION_DAYS)


@shared_task(name="monitor.tasks.run_race", **REGION_TASK_OPTIONS)
def run_race(message: dict[str, Any]) -> str | None:
    """On a region worker: run one race, send its result to ingest over the broker."""
    from monitor.pipeline import worker

    result = worker.run_race(message)
    ingest_race.apply_async(args=(result,), queue="ingest")
    return result.get("winner_route_id")


@shared_task(name="monitor.tasks.ingest_race", acks_late=True, reject_on_worker_lost=True)
def ingest_race(result: dict[str, Any]) -> bool:
    from monitor.pipeline import races

    return races.ingest(result)


@shared_task(
    name="monitor.tasks.send_digests",
    # One run sends every due digest; each is claimed under a lease (monitor.digest.sending), so
    # a run cut short by the limits leaves the rest for the next run, never a duplicate.
    soft_time_limit=600,
    time_limit=660,
)
def send_digests() -> dict[str, int]:
    from monitor.digest import sending

    summary = sending.send_due()
    return {"sent": summary.sent, "skipped": summary.skipped, "failed": summary.failed}
