"""Time bounds that agree with each other (monitor.limits), and timed-out probes cancelled."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ValidationError

from monitor import limits, tasks
from monitor.models import Task
from monitor.pipeline.region import worker


def test_time_limits_all_follow_from_the_longest_probe_deadline() -> None:
    field = Task._meta.get_field("probe_timeout_s")
    assert max(v.limit_value for v in field.validators) == limits.PROBE_TIMEOUT_MAX_S  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        field.run_validators(limits.PROBE_TIMEOUT_MAX_S + 1)
    # A batch of the longest probes is given up on (and cancelled) before its soft limit,
    # which comes before its hard limit, which comes before redelivery.
    longest: Any = [({"timeout_s": limits.PROBE_TIMEOUT_MAX_S}, None)]
    bound = worker._bound_s(longest, limits.BATCH_SPREAD_MAX_S)
    assert bound < limits.REGION_TASK_SOFT_LIMIT_S < limits.REGION_TASK_HARD_LIMIT_S
    assert limits.REGION_TASK_HARD_LIMIT_S < limits.VISIBILITY_TIMEOUT_S
    assert limits.INGEST_RETRY_BACKOFF_MAX_S < limits.VISIBILITY_TIMEOUT_S
    # A probe set above the maximum is held to it too.
    too_long: Any = [({"timeout_s": 3600}, None)]
    assert worker._bound_s(too_long, 10.0) == bound
    for task in (tasks.run_probe_batch, tasks.run_race):
        assert task.soft_time_limit == limits.REGION_TASK_SOFT_LIMIT_S
        assert task.time_limit == limits.REGION_TASK_HARD_LIMIT_S
        assert task.acks_late
        assert task.reject_on_worker_lost
    transport = django_settings.CELERY_BROKER_TRANSPORT_OPTIONS
    assert transport["visibility_timeout"] == limits.VISIBILITY_TIMEOUT_S


def test_periodic_tasks_expire_before_they_can_pile_up() -> None:
    schedule: dict[str, Any] = django_settings.CELERY_BEAT_SCHEDULE
    for name, entry in schedule.items():
        expires = entry.get("options", {}).get("expires")
        assert expires is not None, name
        # By the next run (the overview: the one after, as it runs twice per refresh).
        assert 0 < expires <= 2 * entry["schedule"], name


def test_ingest_backoff_doubles_up_to_its_cap() -> None:
    waits = [limits.ingest_backoff_s(n, 30) for n in range(8)]
    assert waits == [1, 2, 4, 8, 16, 30, 30, 30]
    assert limits.ingest_backoff_s(50) == limits.INGEST_RETRY_BACKOFF_MAX_S


def test_a_probe_past_its_bound_is_cancelled_not_orphaned() -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        worker.run_on_loop(forever(), 0.2)
    assert time.monotonic() - started < 2
    assert cancelled.wait(5), "the coroutine kept running on the probe loop"
    # The loop still serves the next batch.
    assert worker.run_on_loop(asyncio.sleep(0, result=42), 5) == 42


def test_a_batch_cut_at_its_bound_still_hands_on_the_probes_that_had_ended() -> None:
    """Results stream out every few seconds; a batch cancelled between two flushes (its bound,
    the task's time limit) emits the results that ended since the last one before it gives up:
    only the probes still running are lost (their slots recorded missed), never measured ones."""
    import queue

    ended: queue.Queue[Any] = queue.Queue()
    emitted: list[list[Any]] = []

    async def two_end_then_one_hangs() -> None:
        ended.put({"probe": "a"})
        await asyncio.sleep(0.05)
        ended.put({"probe": "b"})
        await asyncio.sleep(3600)

    with pytest.raises(TimeoutError):
        worker.run_streaming(two_end_then_one_hangs(), 0.5, ended, emitted.append, every_s=60)
    assert emitted == [[{"probe": "a"}, {"probe": "b"}]]
