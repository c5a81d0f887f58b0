"""A signed batch runs once per worker host, whatever is written to the broker, and every run
after a message's first counts against the spend cap (issue 28, item 10).

Real region workers (Celery's threads pool, broker only: no database, no master key) consume
their queue through the real Redis; the simulated provider counts the requests it gets. The
broker's nonce claim (`rw:nonce:<region>:<nonce>`) is deleted or forged exactly where it
hurts: after the batch ran, before the same signed message is published again.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from monitor import celery_app, tasks
from monitor.models import RegionKey, Task
from monitor.pipeline import queues, signing
from monitor.pipeline.beat import scheduling
from monitor.pipeline.messages import RUN_PROBE_BATCH
from monitor.stats import spend
from simulator.testing import SimulatorProcess
from tests import support
from tests.monitor import factories as f
from tests.processes import ProcessStack, running
from tests.sim_fixtures import OPENAI_KEY, sim  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.fault]

REGION = "replay"
QUEUE = f"probes.{REGION}"
SLOW_KEY = "sk-test-slowlane-0123456789"
REFUSED = "refused a probe batch: replayed"


def _clean_broker() -> None:
    client = queues.client()
    for pattern in (f"rw:reruns:{REGION}:*", f"rw:runs:{REGION}:*", f"rw:nonce:{REGION}:*"):
        for key in client.scan_iter(match=pattern):
            client.delete(key)
    with celery_app.connection_for_write() as conn:
        for name in (QUEUE, "ingest"):  # no ingest worker here: its results are not kept
            conn.default_channel.queue_purge(name)  # type: ignore[attr-defined]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[ProcessStack]:
    _clean_broker()
    env = support.child_env(connection.settings_dict, PROVIDER_ALLOW_PRIVATE_NETWORKS="true")
    try:
        with running(ProcessStack(tmp_path, env)) as s:
            yield s
    finally:
        _clean_broker()


def _world(simulator: SimulatorProcess, *, slow: bool = False) -> tuple[Task, str]:
    """One task, one route on the simulator, one region; returns the region's key for its
    workers."""
    slug, model, key = (
        ("slowlane", "reasoner-5s", SLOW_KEY) if slow else ("fastchip", "fast-small", OPENAI_KEY)
    )
    p = f.provider(slug, base_url=f"{simulator.base_url}/{slug}/v1")
    p.set_api_key(key)
    p.save()
    route = f.route(p, model)
    region = f.region(REGION)
    region.keys.update(is_active=False)
    row, secret = RegionKey.issue(region)
    t = f.task("replayed", [route], [region], max_tokens=20, probe_timeout_s=30)
    return t, f"{row.key_id}:{secret}"


def _start_worker(s: ProcessStack, host: str, keys: str) -> None:
    """A region worker whose local replay cache is `host`'s (its spool directory): two
    names are two hosts as far as the cache can tell."""
    s.start(
        host,
        support.region_worker(REGION, f"{host}@%h", concurrency=4),
        {
            "RW_WORKER_ONLY": "true",
            "RW_REGION": REGION,
            "RW_REGION_KEYS": keys,
            "DATABASE_URL": "",
            "FIELD_ENCRYPTION_KEYS": "",
            "SECRET_KEY": "",
            "RW_SPOOL_DIR": str(s.tmp / f"{host}-spool"),
            # A batch taken back after a kill still starts (its planned start is long past).
            "RW_START_LAG_MAX_SECONDS": "300",
        },
    )
    _wait_ready(s, host, 1)


def _wait_ready(s: ProcessStack, host: str, count: int) -> None:
    assert support.wait_until(lambda: s.log(host).count(" ready.") >= count, 60), s.logs()


def _sealed_batch() -> dict[str, Any]:
    """The beat's batch for the task's slot, signed for the region as `tasks.send` signs it."""
    planned = [d for d in scheduling.plan(timezone.now()) if d.task_name == RUN_PROBE_BATCH]
    assert len(planned) == 1
    expires = timezone.now() + timedelta(minutes=5)
    return signing.seal_dispatch(signing.KIND_BATCH, QUEUE, planned[0].message, expires)


def _send(envelope: dict[str, Any]) -> None:
    tasks.run_probe_batch.apply_async(args=(envelope,), queue=QUEUE)


def _sim_stats(simulator: SimulatorProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{simulator.base_url}/_sim/stats", timeout=5) as r:
        return dict(json.load(r))


def _served(simulator: SimulatorProcess) -> int:
    return int(_sim_stats(simulator)["requests"])


def _probing(simulator: SimulatorProcess, served: int) -> bool:
    """The provider got `served` requests, and one is still streaming its answer."""
    return _served(simulator) == served and bool(_sim_stats(simulator)["active_streams"])


def _nonce_key(envelope: dict[str, Any]) -> str:
    return f"rw:nonce:{REGION}:{envelope['nonce']}"


def _refusals(s: ProcessStack, host: str) -> int:
    return s.log(host).count(REFUSED)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _ran_once_then(
    s: ProcessStack,
    simulator: SimulatorProcess,
    envelope: dict[str, Any],
) -> int:
    """Send the batch, wait until its one probe reached the provider and the run ended."""
    before = _served(simulator)
    _send(envelope)
    assert support.wait_until(lambda: _served(simulator) == before + 1, 30), s.logs()
    assert support.wait_until(lambda: _sim_stats(simulator)["active_streams"] == 0, 30), s.logs()
    time.sleep(1)  # the task returns and marks the message done on this host
    return before + 1


def test_a_batch_whose_broker_claim_was_deleted_is_not_run_again(
    stack: ProcessStack,
    sim: SimulatorProcess,  # noqa: F811
) -> None:
    _, keys = _world(sim)
    _start_worker(stack, "host-a", keys)
    envelope = _sealed_batch()
    served = _ran_once_then(stack, sim, envelope)

    assert queues.client().delete(_nonce_key(envelope)) == 1
    _send(envelope)
    assert support.wait_until(lambda: _refusals(stack, "host-a") == 1, 30), stack.logs()
    time.sleep(2)
    assert _served(sim) == served  # the provider got no second request


def test_a_batch_whose_broker_claim_names_a_dead_process_here_is_not_run_again(
    stack: ProcessStack,
    sim: SimulatorProcess,  # noqa: F811
) -> None:
    _, keys = _world(sim)
    _start_worker(stack, "host-a", keys)
    envelope = _sealed_batch()
    served = _ran_once_then(stack, sim, envelope)

    # What the broker's claim alone took for a worker killed mid-batch on this host.
    forged = f"{socket.gethostname()}:{_dead_pid()}"
    queues.client().set(_nonce_key(envelope), forged, ex=300)
    _send(envelope)
    assert support.wait_until(lambda: _refusals(stack, "host-a") == 1, 30), stack.logs()
    time.sleep(2)
    assert _served(sim) == served


def _take_back(queue: str) -> int:
    """What kombu does once its visibility timeout has passed (17 minutes here): the messages
    a dead worker held unacknowledged go back to their queue, marked redelivered."""
    client = queues.client()
    back = 0
    for tag, raw in client.hgetall("unacked").items():
        message, _exchange, routing_key = json.loads(raw)
        if routing_key != queue:
            continue
        message["headers"]["redelivered"] = True
        # Out of the records first: the message keeps its delivery tag, and a worker that
        # takes it at once records it under that tag again.
        client.hdel("unacked", tag)
        client.zrem("unacked_index", tag)
        client.lpush(queue, json.dumps(message))
        back += 1
    return back


def test_a_batch_its_killed_worker_held_runs_once_more_and_counts_in_flight(
    stack: ProcessStack,
    sim: SimulatorProcess,  # noqa: F811
) -> None:
    """The legitimate redelivery: the worker is killed (-9) with the batch's probe in flight,
    restarted on the same host, and the batch delivered again: it runs once more, and that run
    counts against the cap. Killed again mid-run: not a third time."""
    t, keys = _world(sim, slow=True)
    estimate = spend.probe_estimate_usd(t, t.routes.get())
    _start_worker(stack, "host-a", keys)
    envelope = _sealed_batch()
    assert spend.in_flight_by_task()[t.pk] == estimate  # the dispatched slot

    before = _served(sim)
    _send(envelope)
    for run in (1, 2):
        assert support.wait_until(partial(_probing, sim, before + run), 30), stack.logs()
        stack.kill_group("host-a")
        stack.restart("host-a")
        _wait_ready(stack, "host-a", run + 1)
        assert _take_back(QUEUE) == 1, stack.logs()
        if run == 1:
            # Run 2: the redelivery, counted in flight as it starts.
            assert support.wait_until(lambda: _served(sim) == before + 2, 30), stack.logs()
            assert "running a batch message again (run 2)" in stack.log("host-a")
    assert support.wait_until(lambda: _refusals(stack, "host-a") == 1, 30), stack.logs()
    time.sleep(2)
    assert _served(sim) == before + 2
    assert spend.in_flight_by_task()[t.pk] == 2 * estimate
    print(
        f"\n[figure] killed twice mid-batch: {_served(sim) - before} runs, in flight {2 * estimate}"
    )


def test_a_replay_another_host_runs_counts_against_the_cap(
    stack: ProcessStack,
    sim: SimulatorProcess,  # noqa: F811
) -> None:
    """The local cache is one host's: a second host that never saw the message runs it once
    when the broker's claim was deleted (docs/security.md). That run is paid for, and the cap
    sees it, though ingest keeps one result."""
    t, keys = _world(sim)
    t.monthly_spend_cap_usd = Decimal("1")
    t.save()
    estimate = spend.probe_estimate_usd(t, t.routes.get())
    _start_worker(stack, "host-a", keys)
    envelope = _sealed_batch()
    served = _ran_once_then(stack, sim, envelope)
    stack.stop("host-a")
    assert spend.in_flight_by_task()[t.pk] == estimate

    queues.client().delete(_nonce_key(envelope))
    _start_worker(stack, "host-b", keys)
    _send(envelope)
    assert support.wait_until(lambda: _served(sim) == served + 1, 30), stack.logs()
    assert support.wait_until(lambda: spend.in_flight_by_task().get(t.pk) == 2 * estimate, 10), (
        stack.logs()
    )
    assert spend.committed_by_task(timezone.now())[t.pk] == 2 * estimate
    assert "running a batch message again (run 2)" in stack.log("host-b")
