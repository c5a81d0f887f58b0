"""Rotating keys loses no result that is waiting: region keys (issue 28 item 3) and
FIELD_ENCRYPTION_KEYS (item 2).

Real ingest and region workers (tests/monitor/pipeline/test_fault_recovery.py's stack), the embedded
PostgreSQL and Redis, the simulated provider; rotations by the real management commands.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from monitor import tasks
from monitor.models import ProbeResult, ProbeSlot, Region, RegionKey, Task
from monitor.pipeline import queues, signing
from monitor.pipeline.beat import scheduling
from monitor.pipeline.messages import INGEST_QUEUE
from simulator.testing import CONFIGS, SimulatorProcess
from tests import support
from tests.monitor.pipeline import test_fault_recovery as faults
from tests.processes import running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.fault]

OTHER = "r-other"


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(CONFIGS / "test.toml") as s:
        yield s


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[faults.Stack]:
    env = support.child_env(
        connection.settings_dict, PROVIDER_ALLOW_PRIVATE_NETWORKS="true", SLOT_GRACE_SECONDS="3"
    )
    with running(faults.Stack(tmp_path, env)) as s:
        yield s


def _sealed(key: signing.RegionSecret, region: str, body: list[Any]) -> dict[str, Any]:
    return signing.seal(key, region, signing.KIND_RESULTS, body, None)


def _stored(slots: list[tuple[Any, Any]]) -> int:
    faults._fresh()
    return ProbeResult.objects.filter(slot_at__in={at for _, at in slots}).count()


def test_results_signed_before_a_region_key_rotation_are_kept(
    sim: SimulatorProcess, stack: faults.Stack
) -> None:
    queues.client().delete(queues.DEAD_LETTER_KEY, INGEST_QUEUE)
    task = faults._configure(sim)
    key_id, _, secret = faults.REGION_KEYS[faults.REGION].partition(":")
    old = signing.RegionSecret(key_id, secret)
    slots = faults._open_slots(task, 12)
    queued, parked, foreign, retired = (slots[i : i + 3] for i in range(0, 12, 3))

    def body(part: list[tuple[Any, Any]]) -> list[Any]:
        return [faults._result(task, r, at) for r, at in part]

    # Signed with the old key before the rotation: one message waiting in the ingest queue
    # (no ingest worker yet), one parked in the dead letters.
    tasks.ingest_results.apply_async(
        args=(_sealed(old, faults.REGION, body(queued)),), queue=INGEST_QUEUE
    )
    queues.park("results", _sealed(old, faults.REGION, body(parked)), "OperationalError", 13)
    # `make run` at every start, and the README's rotation: a new key, the old one deactivated.
    call_command("region_key", "new", faults.REGION, "--replace")
    rotated = time.monotonic()
    assert not RegionKey.objects.get(key_id=old.key_id).is_active

    stack.ingest_worker("ingest")
    kept = support.wait_until(lambda: _stored(queued) == 3, 30, interval_s=0.2)
    call_command("replay_dead_letters")
    recovery_s = time.monotonic() - rotated
    waiting = len(queued) + len(parked)
    lost = waiting - _stored(queued) - _stored(parked)
    faults._figure(
        "region key rotated with results waiting",
        f"{waiting} results signed with the old key (3 queued, 3 parked), "
        f"{waiting - lost} kept, {lost} lost, stored {recovery_s:.1f} s after the rotation",
    )
    assert kept, stack.logs()
    assert lost == 0
    assert queues.dead_letter_count() == 0

    # Still only for the old key's region: another region's retired key stores nothing here.
    other = Region.objects.create(name=OTHER, slug=OTHER)
    other_key, other_secret = RegionKey.issue(other)
    call_command("region_key", "new", OTHER, "--replace")
    foreign_key = signing.RegionSecret(other_key.key_id, other_secret)
    tasks.ingest_results.apply_async(
        args=(_sealed(foreign_key, OTHER, body(foreign)),), queue=INGEST_QUEUE
    )
    # And only for a bounded time: past results_grace the old key opens nothing.
    RegionKey.objects.filter(key_id=old.key_id).update(
        deactivated_at=timezone.now() - signing.results_grace() - timedelta(minutes=1)
    )
    tasks.ingest_results.apply_async(
        args=(_sealed(old, faults.REGION, body(retired)),), queue=INGEST_QUEUE
    )
    assert support.wait_until(
        lambda: (
            stack.log("ingest").count("rejected result") >= 3
            and "refused a result message" in stack.log("ingest")
        ),
        30,
    ), stack.logs()

    faults._figure(
        "results signed with a retired key",
        f"another region's retired key stored {_stored(foreign)}, "
        f"the old key past its grace stored {_stored(retired)}",
    )
    assert _stored(foreign) == 0
    assert _stored(retired) == 0
    assert faults._one_row_per_slot()


def test_rotating_the_encryption_key_during_live_probing_loses_nothing(
    sim: SimulatorProcess, stack: faults.Stack, settings: Any
) -> None:
    queues.client().delete(queues.DEAD_LETTER_KEY, INGEST_QUEUE)
    old_fernet = settings.FIELD_ENCRYPTION_KEYS[0]
    new_fernet = Fernet.generate_key().decode()
    task = faults._configure(sim, timeout_s=30)  # region key and API key under the old key
    stack.region_worker(sim)
    assert support.wait_until(lambda: "ready" in stack.log("region"), 30), stack.logs()
    first = faults._batch_now()
    assert first == 3
    # The batch's results wait in the ingest queue (no ingest worker yet) while the key rotates.
    assert support.wait_until(lambda: "succeeded" in stack.log("region"), 60), stack.logs()
    assert queues.depths([INGEST_QUEUE])[INGEST_QUEUE] >= 1
    settings.FIELD_ENCRYPTION_KEYS = [new_fernet, old_fernet]
    call_command("rotate_api_keys")
    settings.FIELD_ENCRYPTION_KEYS = [new_fernet]  # the old key dropped, as the README says
    rotated = time.monotonic()
    stack.ingest_worker("ingest", FIELD_ENCRYPTION_KEYS=new_fernet)

    def stored(n: int) -> bool:
        faults._fresh()
        return ProbeResult.objects.filter(outcome="ok").count() >= n

    kept_waiting = support.wait_until(lambda: stored(first), 60, interval_s=0.2)
    recovery_s = time.monotonic() - rotated
    # Probing goes on under the new key alone: the next slots are sent, probed and stored.
    assert support.wait_until(lambda: faults._batch_now() > 0, 30, interval_s=0.5)
    kept_next = support.wait_until(lambda: stored(first + 3), 60, interval_s=0.5)
    slots = ProbeSlot.objects.filter(task=task).count()  # no more are planned from here
    support.wait_until(lambda: stored(slots), 60, interval_s=0.5)
    lost = slots - ProbeResult.objects.filter(outcome="ok").count()
    faults._figure(
        "FIELD_ENCRYPTION_KEYS rotated during live probing",
        f"{first} results waiting at the rotation, {slots} slots, "
        f"{ProbeResult.objects.filter(outcome='ok').count()} kept, {lost} lost; waiting results "
        f"stored {recovery_s:.1f} s after the rotation",
    )
    assert kept_waiting, stack.logs()
    assert kept_next, stack.logs()
    assert lost == 0
    assert faults._one_row_per_slot()


def test_a_region_key_dropped_before_rotation_misses_its_slots_and_parks_its_results(
    sim: SimulatorProcess, stack: faults.Stack, settings: Any
) -> None:
    queues.client().delete(queues.DEAD_LETTER_KEY, INGEST_QUEUE, f"probes.{OTHER}")
    old_fernet = settings.FIELD_ENCRYPTION_KEYS[0]
    new_fernet = Fernet.generate_key().decode()
    task: Task = faults._configure(sim)  # its region's key under the old key
    settings.FIELD_ENCRYPTION_KEYS = [new_fernet, old_fernet]
    other = Region.objects.create(name=OTHER, slug=OTHER)
    RegionKey.issue(other)  # under the new key
    task.regions.add(other)
    settings.FIELD_ENCRYPTION_KEYS = [new_fernet]  # the old key dropped, rotate_api_keys not run

    # The beat: the region it cannot sign for is logged and skipped, the other still gets its
    # batch (before: every tick raised, for every region).
    sent = tasks.send(scheduling.plan())
    assert sent.get(OTHER) == 3, sent
    assert faults.REGION not in sent
    assert queues.depths([f"probes.{OTHER}"])[f"probes.{OTHER}"] == 1

    # Ingest: results signed with that key are retried, then parked, not dropped.
    region = Region.objects.get(slug=faults.REGION)
    planned = list(
        ProbeSlot.objects.filter(region=region).values_list("route", "slot_at").order_by("pk")
    )
    assert len(planned) == 3
    routes = {r.pk: r for r in task.routes.all()}
    task.regions.remove(other)  # faults._result names the task's one region
    body = [faults._result(task, routes[route_id], at) for route_id, at in planned]
    key_id, _, secret = faults.REGION_KEYS[faults.REGION].partition(":")
    sealed = _sealed(signing.RegionSecret(key_id, secret), faults.REGION, body)
    stack.ingest_worker(
        "ingest",
        FIELD_ENCRYPTION_KEYS=new_fernet,
        INGEST_RETRY_MAX="1",
        INGEST_RETRY_BACKOFF_MAX_S="1",
    )
    tasks.ingest_results.apply_async(args=(sealed,), queue=INGEST_QUEUE)
    parked = support.wait_until(lambda: queues.dead_letter_count() == 1, 30)
    assert parked, stack.logs()
    faults._fresh()
    assert ProbeResult.objects.count() == 0
    # The admin puts the old key back and rotates; the parked results are replayed.
    settings.FIELD_ENCRYPTION_KEYS = [new_fernet, old_fernet]
    call_command("rotate_api_keys")
    settings.FIELD_ENCRYPTION_KEYS = [new_fernet]
    call_command("replay_dead_letters")
    kept = ProbeResult.objects.filter(region=region).count()
    faults._figure(
        "region key unreadable (encryption key dropped early)",
        f"{faults.REGION} not sent ({len(planned)} slots left to be missed), {OTHER} sent "
        f"{sent.get(OTHER)} probes; 3 results parked, {kept} kept after rotation and replay, "
        f"{3 - kept} lost",
    )
    assert kept == 3
    assert "KeyUnavailable" in stack.log("ingest")
