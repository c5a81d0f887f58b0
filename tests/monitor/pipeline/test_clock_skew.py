"""A region worker whose clock runs fast loses nothing: its results are judged by our clock.

Results are sealed here through the real signing API under a clock a minute fast (the worker's
side: monitor.pipeline.signing.seal reads time.time()), then stored by a real ingest worker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine
from django.db import connection

from monitor import tasks
from monitor.models import Heartbeat, ProbeResult, ProbeSlot
from monitor.pipeline import signing
from monitor.pipeline.messages import INGEST_QUEUE
from simulator.testing import CONFIGS, SimulatorProcess
from tests import support
from tests.monitor.pipeline import test_fault_recovery as faults
from tests.processes import running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.fault]

AHEAD_S = 60


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(CONFIGS / "test.toml") as s:
        yield s


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[faults.Stack]:
    env = support.child_env(connection.settings_dict, PROVIDER_ALLOW_PRIVATE_NETWORKS="true")
    with running(faults.Stack(tmp_path, env)) as s:
        yield s


def test_results_sealed_by_a_fast_clock_count_by_ours(
    sim: SimulatorProcess, stack: faults.Stack
) -> None:
    task = faults._configure(sim)
    region = task.regions.get()
    routes = list(task.routes.all())
    now = datetime.now(UTC).replace(microsecond=0)
    # Two slots due by our clock within the skew, one whose deadline passed by our clock.
    open_at, overdue_at = now - timedelta(seconds=10), now - timedelta(seconds=30)
    for route in routes[:2]:
        ProbeSlot.objects.create(
            task=task,
            route=route,
            region=region,
            slot_at=open_at,
            # Open for as long as a worker may take to start on a loaded machine: what this
            # test checks is the clock, not the deadline.
            deadline_at=now + timedelta(seconds=300),
        )
    ProbeSlot.objects.create(
        task=task,
        route=routes[2],
        region=region,
        slot_at=overdue_at,
        deadline_at=now - timedelta(seconds=1),
    )
    body = [faults._result(task, r, open_at) for r in routes[:2]]
    body.append(faults._result(task, routes[2], overdue_at))
    key_id, _, secret = faults.REGION_KEYS[faults.REGION].partition(":")
    with time_machine.travel(time.time() + AHEAD_S, tick=True):  # the worker's fast clock
        sealed = signing.seal(
            signing.RegionSecret(key_id, secret), faults.REGION, signing.KIND_RESULTS, body, None
        )
    assert sealed["issued_at"] > time.time() + signing.CLOCK_SKEW_S
    stack.ingest_worker("ingest")
    assert support.wait_until(lambda: "ready" in stack.log("ingest"), 30), stack.logs()
    sent = time.monotonic()
    tasks.ingest_results.apply_async(args=(sealed,), queue=INGEST_QUEUE)

    def handled() -> bool:
        faults._fresh()
        return "rejected result" in stack.log("ingest") or ProbeResult.objects.count() >= 2

    assert support.wait_until(handled, 30, interval_s=0.2), stack.logs()
    assert support.wait_until(lambda: ProbeResult.objects.count() >= 2, 5), stack.logs()
    stored_s = time.monotonic() - sent
    kept = ProbeResult.objects.filter(slot_at=open_at).count()
    counted = Heartbeat.objects.filter(name=signing.CLOCK_AHEAD_COUNTER + faults.REGION).first()
    faults._figure(
        "worker clock 60 s fast",
        f"2 results for open slots, {kept} kept, {2 - kept} lost; the overdue one "
        f"{'refused' if ProbeResult.objects.filter(slot_at=overdue_at).count() == 0 else 'KEPT'}"
        f"; skew counted {counted.count if counted else 0}; stored {stored_s:.1f} s after sending",
    )
    assert kept == 2
    # Still judged by our clock: a slot past its deadline here stays refused.
    assert not ProbeResult.objects.filter(slot_at=overdue_at).exists()
    assert ProbeSlot.objects.get(slot_at=overdue_at).status == "dispatched"
    assert counted is not None
    assert counted.count == 1
    assert f"region {faults.REGION} were sealed" in stack.log("ingest")
