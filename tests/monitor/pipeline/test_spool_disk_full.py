"""A region worker whose spool disk is full while the broker is away drops only what it could
not write, counts it, and its batch's other probes go on.

A real region worker spools onto a 12 KiB tmpfs, filled before the batch, while the embedded
Redis is stopped for real: the first results to end can be neither published nor spooled. Once
the worker has said so, the filler goes, and the probes still running must be spooled and,
when Redis is back, stored.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from devstack import embedded
from monitor.models import ProbeResult
from monitor.pipeline import queues
from simulator.testing import CONFIGS, SimulatorProcess
from tests import support
from tests.monitor.pipeline import test_fault_recovery as faults
from tests.processes import running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.fault]

DROPPED = re.compile(r"cannot keep (\d+) results in the local spool \(OSError")


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(CONFIGS / "test.toml") as s:
        yield s


@pytest.fixture
def spool_disk(tmp_path: Path) -> Iterator[Path]:
    """The region worker's spool directory (faults.Stack's), a 12 KiB tmpfs."""
    path = tmp_path / "spool"
    path.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=12k,mode=0700", "tmpfs", str(path)], check=False
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def stack(tmp_path: Path, spool_disk: Path) -> Iterator[faults.Stack]:
    env = support.child_env(
        connection.settings_dict, PROVIDER_ALLOW_PRIVATE_NETWORKS="true", SLOT_GRACE_SECONDS="3"
    )
    with running(faults.Stack(tmp_path, env)) as s:
        yield s


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 1024)
        except OSError:
            pass
    return filler


def test_a_full_spool_disk_drops_only_what_it_could_not_write(
    sim: SimulatorProcess, stack: faults.Stack, spool_disk: Path
) -> None:
    if faults._external():
        pytest.skip("restarts need the embedded servers")
    faults._configure(sim, timeout_s=30)
    stack.ingest_worker()
    # TICK_SECONDS 20: the batch's three starts are about 7 s apart, so the first result is
    # handed on (and fails to be kept) while the other two probes have not started or run.
    stack.region_worker(sim, TICK_SECONDS="20")
    stack.supervise("ingest", "region")
    assert support.wait_until(lambda: "ready" in stack.log("region"), 30), stack.logs()
    assert support.wait_until(lambda: "ready" in stack.log("ingest"), 30), stack.logs()
    filler = _fill(spool_disk)
    probes = faults._batch_now()
    assert probes == 3
    # Redis goes once the worker has claimed the batch's nonce (it runs the batch from there).
    claimed = f"rw:nonce:{faults.REGION}:*"
    assert support.wait_until(lambda: bool(queues.client().keys(claimed)), 15), stack.logs()
    embedded.stop_redis(faults._var_dir())
    try:
        dropped_logged = support.wait_until(
            lambda: DROPPED.search(stack.log("region")) is not None, 60, interval_s=0.1
        )
        filler.unlink()  # room again for the probes still running

        def spooled() -> int:
            return sum(
                int(m)
                for m in re.findall(r"broker unavailable: (\d+) results kept", stack.log("region"))
            )

        def dropped_so_far() -> int:
            return sum(int(n) for n in DROPPED.findall(stack.log("region")))

        all_handled = support.wait_until(lambda: spooled() + dropped_so_far() >= probes, 90)
    finally:
        embedded.start_redis(faults._var_dir())
    dropped = dropped_so_far()
    back = time.monotonic()
    assert dropped_logged, stack.logs()
    assert all_handled, stack.logs()
    counter = spool_disk / "dropped-results.count"

    def stored() -> bool:
        faults._fresh()
        return ProbeResult.objects.filter(outcome="ok").count() >= probes - dropped

    assert support.wait_until(stored, 60, interval_s=0.5), stack.logs()
    recovery_s = time.monotonic() - back
    kept = ProbeResult.objects.filter(outcome="ok").count()
    counted = int(counter.read_text()) if counter.exists() else 0
    lost = probes - kept - counted
    faults._figure(
        "spool disk full while the broker was away",
        f"{probes} probes, {dropped} dropped (counted {counted}), {kept} kept (spooled, stored "
        f"{recovery_s:.1f} s after Redis came back), {lost} lost uncounted; worker restarts "
        f"{dict(stack.restarts) or 'none'}",
    )
    assert 1 <= dropped < probes  # the first results went, the others were kept
    assert counted == dropped
    assert kept == probes - dropped
    assert lost == 0
    assert faults._one_row_per_slot()
