"""An ingest message that fails part-way is retried, or parked and replayed, and still verifies.

The fault is put exactly where it hurts: another connection holds the slots' row locks, the
ingest worker blocks writing them, and its blocked backend is terminated (the database dropping
the connection mid-ingest), so the task retries the very message it had begun to store.
Real ingest worker, PostgreSQL and Redis (tests/monitor/pipeline/test_fault_recovery.py's stack).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from monitor import tasks
from monitor.models import ProbeResult, ProbeSlot, Task
from monitor.pipeline import queues, signing
from monitor.pipeline.messages import INGEST_QUEUE
from simulator.testing import CONFIGS, SimulatorProcess
from tests import support
from tests.monitor.pipeline import test_fault_recovery as faults
from tests.processes import running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.fault]


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(CONFIGS / "test.toml") as s:
        yield s


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[faults.Stack]:
    env = support.child_env(connection.settings_dict, PROVIDER_ALLOW_PRIVATE_NETWORKS="true")
    with running(faults.Stack(tmp_path, env)) as s:
        yield s


def _sealed(task: Task, n: int) -> tuple[dict[str, Any], int]:
    """One results message for n open slots, signed as the region's worker signs it."""
    slots = faults._open_slots(task, n)
    key_id, _, secret = faults.REGION_KEYS[faults.REGION].partition(":")
    body = [faults._result(task, r, at) for r, at in slots]
    key = signing.RegionSecret(key_id, secret)
    return signing.seal(key, faults.REGION, signing.KIND_RESULTS, body, None), len(slots)


def _blocked_ingest_backend() -> int | None:
    """The backend waiting on a row lock of monitor_probeslot (the ingest worker's)."""
    faults._fresh()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        row = cursor.fetchone()
    return int(row[0]) if row else None


def _cut_mid_ingest(task: Task, sealed: dict[str, Any]) -> float:
    """Publish `sealed` while the task's slots are locked elsewhere, terminate the ingest
    worker's blocked backend, then release the locks; returns when that was (monotonic)."""
    url = support.database_url_of(connection.settings_dict)
    with psycopg.connect(url) as locker:
        locker.execute("SELECT 1 FROM monitor_probeslot WHERE task_id = %s FOR UPDATE", [task.pk])
        tasks.ingest_results.apply_async(args=(sealed,), queue=INGEST_QUEUE)
        assert support.wait_until(lambda: _blocked_ingest_backend() is not None, 30)
        pid = _blocked_ingest_backend()
        locker.execute("SELECT pg_terminate_backend(%s)", [pid])
        locker.rollback()
    return time.monotonic()


def test_a_message_retried_after_its_connection_was_cut_still_verifies(
    sim: SimulatorProcess, stack: faults.Stack
) -> None:
    queues.client().delete(queues.DEAD_LETTER_KEY)
    task = faults._configure(sim)
    sealed, n = _sealed(task, 6)
    stack.ingest_worker("ingest", INGEST_RETRY_BACKOFF_MAX_S="1")
    assert support.wait_until(lambda: "ready" in stack.log("ingest"), 30), stack.logs()
    cut = _cut_mid_ingest(task, sealed)

    def stored() -> bool:
        faults._fresh()
        return ProbeResult.objects.count() >= n

    kept = support.wait_until(stored, 30, interval_s=0.2)
    recovery_s = time.monotonic() - cut
    log = stack.log("ingest")
    lost = n - ProbeResult.objects.count()
    faults._figure(
        "ingest connection cut mid-message",
        f"{n} results, {ProbeResult.objects.count()} kept, "
        f"{ProbeSlot.objects.filter(status='done').count()} slots done, {lost} lost; "
        f"stored {recovery_s:.1f} s after the cut",
    )
    assert "retry 1" in log  # the cut really hit ingest
    assert kept, log
    assert "refused a result message" not in log
    assert lost == 0
    assert set(ProbeSlot.objects.values_list("status", flat=True)) == {"done"}
    assert faults._one_row_per_slot()
    assert queues.dead_letter_count() == 0


def test_a_parked_copy_of_a_message_cut_mid_ingest_still_replays(
    sim: SimulatorProcess, stack: faults.Stack
) -> None:
    queues.client().delete(queues.DEAD_LETTER_KEY)
    task = faults._configure(sim)
    sealed, n = _sealed(task, 6)
    stack.ingest_worker("ingest", INGEST_RETRY_MAX="0")
    assert support.wait_until(lambda: "ready" in stack.log("ingest"), 30), stack.logs()
    cut = _cut_mid_ingest(task, sealed)
    assert support.wait_until(lambda: queues.dead_letter_count() == 1, 30), stack.logs()
    faults._fresh()
    assert ProbeResult.objects.count() == 0
    call_command("replay_dead_letters")
    lost = n - ProbeResult.objects.count()
    faults._figure(
        "parked after a cut, replayed",
        f"{n} results, {ProbeResult.objects.count()} kept, {lost} lost; "
        f"replayed {time.monotonic() - cut:.1f} s after the cut",
    )
    assert lost == 0
    assert set(ProbeSlot.objects.values_list("status", flat=True)) == {"done"}
    assert queues.dead_letter_count() == 0
