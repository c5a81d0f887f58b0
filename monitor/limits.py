"""The pipeline's time bounds, every one derived from the longest probe deadline allowed.

One place computes them: the Task model's validator on `probe_timeout_s`, the region tasks'
Celery time limits, the broker's visibility timeout and ingest's retry backoff all read this
module, so none can contradict another (a batch can never outlive its task's limits, and no
unacknowledged message comes back while its worker may still be running it). No Django here:
monitor/settings.py reads it before Django is set up.
"""

from __future__ import annotations

import os

# The longest probe deadline a task may set (Task.probe_timeout_s).
PROBE_TIMEOUT_MAX_S = 900
# A region batch spreads its starts over at most this (monitor.pipeline.region.worker).
BATCH_SPREAD_MAX_S = 10
# The tick claims slots at most this far ahead of their time (SCHEDULE_AHEAD_SECONDS): a batch
# waits for its first start at most this long (monitor.pipeline.beat.scheduling).
SCHEDULE_AHEAD_MAX_S = 60
# After its last probe ends, a batch grades answers and publishes its results (a publish that
# fails goes to the local spool after a few seconds of retries).
AFTER_PROBES_S = 60

# A region task (a batch or a race) runs for at most its wait for its slots' times, spread,
# deadline and grading; its soft limit cancels what is still running, its hard limit kills the
# process a little later.
REGION_TASK_SOFT_LIMIT_S = (
    SCHEDULE_AHEAD_MAX_S + BATCH_SPREAD_MAX_S + PROBE_TIMEOUT_MAX_S + AFTER_PROBES_S
)
REGION_TASK_HARD_LIMIT_S = REGION_TASK_SOFT_LIMIT_S + 30

# Ingest retries a database error with exponential backoff capped here; a retry waits in the
# worker as an unacknowledged message, so the cap stays well under the visibility timeout.
INGEST_RETRY_BACKOFF_MAX_S = 120

# Redis hands an unacknowledged message to another worker after this long. Above the longest
# a task can hold one (a region task's hard limit, an ingest retry's wait), so a message is
# never run twice at once. A region worker killed outright (SIGKILL of the whole worker) gets
# its batch back only after this: by then the batch has expired, and its slots were recorded
# missed at their deadlines by the sweep (a killed child process is different: Celery rejects
# its message at once, reject_on_worker_lost, and the batch runs again if still in time).
VISIBILITY_TIMEOUT_S = max(REGION_TASK_HARD_LIMIT_S, INGEST_RETRY_BACKOFF_MAX_S) + 60


# A region worker runs Celery's `threads` pool: a batch, race or scenario holds a thread (not a
# process) while its probes run on the process's one probe loop, so a slow probe never keeps
# another message waiting. This many messages at once per worker process (RW_REGION_CONCURRENCY
# overrides it): enough for every batch of the longest probe deadline at one tick a few
# seconds, plus scenarios and races; the probes themselves are bounded by RW_PROBES_IN_FLIGHT.
REGION_CONCURRENCY = 500


def region_worker_args(concurrency: int | None = None) -> list[str]:
    """The `celery worker` arguments of a region worker's execution pool (the dev stack, the
    compose files, the tests and the benchmarks all start region workers with these)."""
    chosen = concurrency or int(os.environ.get("RW_REGION_CONCURRENCY") or REGION_CONCURRENCY)
    return [
        "--pool",
        "threads",
        "--concurrency",
        str(chosen),
        "--prefetch-multiplier",
        "1",
        # No worker events, gossip or start-up sync: nothing reads a region worker's events
        # (its heartbeat is its own beacon, monitor.pipeline.region.liveness), and across a WAN each
        # is a connection more to lose and restore, and traffic every 2 s.
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


def region_task_limits() -> dict[str, int]:
    """Celery's soft and hard time limits for region tasks (monitor.tasks)."""
    return {"soft_time_limit": REGION_TASK_SOFT_LIMIT_S, "time_limit": REGION_TASK_HARD_LIMIT_S}


def ingest_backoff_s(retries: int, cap_s: int = INGEST_RETRY_BACKOFF_MAX_S) -> int:
    """Seconds before ingest's next attempt after `retries` failed ones: 1, 2, 4, ... up to the
    cap (never past INGEST_RETRY_BACKOFF_MAX_S)."""
    return int(min(2**retries, cap_s, INGEST_RETRY_BACKOFF_MAX_S))
