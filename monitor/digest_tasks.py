"""Celery tasks of the weekly digest (imported by monitor.tasks so Celery registers them)."""

from __future__ import annotations

from celery import shared_task

__all__ = ["send_digests"]


@shared_task(
    name="monitor.tasks.send_digests",
    # One run sends every due digest; each is claimed under a lease (monitor.digest), so a run
    # cut short by the limits leaves the rest for the next run, never a duplicate.
    soft_time_limit=600,
    time_limit=660,
)
def send_digests() -> dict[str, int]:
    from monitor import digest

    summary = digest.send_due()
    return {"sent": summary.sent, "skipped": summary.skipped, "failed": summary.failed}
