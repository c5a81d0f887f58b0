"""Whoever can write to the broker cannot make a region worker send a provider key anywhere.

A real region worker (Celery, broker only: no database, SECRET_KEY or master key) consumes
its queue; messages reach it through the real broker. A listener on loopback stands for the
attacker's server and records every request it gets.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from monitor import celery_app, tasks
from monitor.models import Heartbeat, ProbeResult, ProbeSlot, RegionKey
from monitor.pipeline import signing
from monitor.pipeline.beat import scheduling
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.messages import RUN_PROBE_BATCH
from simulator.testing import SimulatorProcess
from tests import support
from tests.monitor import factories as f
from tests.sim_fixtures import OPENAI_KEY, sim  # noqa: F401 (fixture)

REGION = "sec"
OTHER = "elsewhere"


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]]

    def do_POST(self) -> None:
        self.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = b'{"error": "no"}'
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def attacker() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class RegionWorker:
    key: signing.RegionSecret
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, needle: str, count: int = 1, timeout_s: float = 30) -> None:
        ok = support.wait_until(lambda: self.text().count(needle) >= count, timeout_s)
        assert ok, f"worker never logged {needle!r}:\n{self.text()[-3000:]}"


def worker_env(region: str, key: signing.RegionSecret) -> dict[str, str]:
    """A region worker's whole environment: the broker and its region's key, nothing else."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE", "EMAIL"))}
    for name in ("SECRET_KEY", "FIELD_ENCRYPTION_KEYS", "DATABASE_URL", "EMAIL_HOST_PASSWORD"):
        env.pop(name, None)
        env.pop(f"{name}_FILE", None)
    env.update(
        RW_WORKER_ONLY="true",
        RW_REGION=region,
        RW_REGION_KEYS=f"{key.key_id}:{key.secret}",
        PROVIDER_ALLOW_PRIVATE_NETWORKS="true",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture(scope="module")
def region_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegionWorker]:
    key = signing.RegionSecret(signing.new_key_id(), signing.new_secret())
    log = tmp_path_factory.mktemp("region") / "worker.log"
    proc = support.start(
        support.celery(
            "worker", "-Q", f"probes.{REGION}", "--pool", "solo", "-n", "sec@%h", "-l", "INFO"
        ),
        worker_env(REGION, key),
        log,
    )
    w = RegionWorker(key, log)
    try:
        w.wait_for("ready", timeout_s=60)
        yield w
    finally:
        support.stop(proc)


def _world(base_url: str, key: signing.RegionSecret) -> tuple[Any, Any, Any]:
    p = f.provider("fastchip", base_url=base_url)
    p.set_api_key(OPENAI_KEY)
    p.save()
    route = f.route(p, "fast-small")
    region = f.region(REGION)
    region.keys.update(is_active=False)
    row = RegionKey(region=region, key_id=key.key_id)
    row.set_secret(key.secret)
    row.save()
    t = f.task("secure", [route], [region], max_tokens=20, probe_timeout_s=20)
    return t, route, region


def _planned_batch() -> tuple[dict[str, Any], Any]:
    planned = [d for d in scheduling.plan(timezone.now()) if d.task_name == RUN_PROBE_BATCH]
    assert len(planned) == 1
    return planned[0].message, planned[0].expires


def _send(envelope: dict[str, Any]) -> None:
    tasks.run_probe_batch.apply_async(args=(envelope,), queue=f"probes.{REGION}")


def _requests_served(sim: SimulatorProcess) -> int:  # noqa: F811
    import urllib.request

    with urllib.request.urlopen(f"{sim.base_url}/_sim/stats", timeout=5) as r:
        return int(json.load(r)["requests"])


@pytest.mark.django_db(transaction=True)
def test_a_forged_or_replayed_batch_is_refused_and_no_key_leaves_the_worker(
    region_worker: RegionWorker,
    sim: SimulatorProcess,  # noqa: F811
    attacker: tuple[str, list[dict[str, str]]],
) -> None:
    attacker_url, seen = attacker
    _world(f"{sim.base_url}/fastchip/v1", region_worker.key)
    message, _expires = _planned_batch()
    # Valid for two minutes, not the slot's grace: the steps before the genuine run (5.) take
    # seconds on a loaded machine, and an expired batch would be refused as expired, not run.
    valid_until = timezone.now() + timedelta(minutes=2)
    genuine = signing.seal_dispatch(signing.KIND_BATCH, f"probes.{REGION}", message, valid_until)

    # 1. The genuine batch's base URL pointed at the attacker, signature left as it was.
    tampered = copy.deepcopy(genuine)
    tampered["body"]["probes"][0]["provider"]["base_url"] = attacker_url
    _send(tampered)
    region_worker.wait_for("refused a probe batch: bad signature")

    # 2. Signed with another region's key, and addressed to that region.
    other = signing.RegionSecret(signing.new_key_id(), signing.new_secret())
    _send(signing.seal(other, REGION, signing.KIND_BATCH, tampered["body"], time.time() + 60))
    region_worker.wait_for("refused a probe batch: signed with a key this side does not hold")
    _send(signing.seal(region_worker.key, OTHER, signing.KIND_BATCH, message, time.time() + 60))
    region_worker.wait_for("refused a probe batch: for another region")

    # 3. Properly signed (a stolen region key), but the key was wrapped for the provider's
    # origin: the worker will not send it to the attacker's.
    redirected = copy.deepcopy(genuine["body"])
    redirected["probes"][0]["provider"]["base_url"] = attacker_url
    _send(signing.seal(region_worker.key, REGION, signing.KIND_BATCH, redirected, time.time() + 60))
    region_worker.wait_for("refused the API key of provider fastchip: bound to another origin")

    # 4. Expired, and unsigned.
    _send(signing.seal(region_worker.key, REGION, signing.KIND_BATCH, message, time.time() - 1))
    region_worker.wait_for("refused a probe batch: expired")
    tasks.run_probe_batch.apply_async(args=(message,), queue=f"probes.{REGION}")
    region_worker.wait_for("refused a probe batch: not a signed envelope")

    # 5. The genuine batch runs once; the same message again is a replay.
    before = _requests_served(sim)
    _send(genuine)
    _send(genuine)
    region_worker.wait_for("refused a probe batch: replayed")
    assert support.wait_until(lambda: _requests_served(sim) == before + 1, timeout_s=30)
    time.sleep(1)
    assert _requests_served(sim) == before + 1

    assert seen == []  # the attacker's server was never even asked
    assert OPENAI_KEY not in region_worker.text()


@pytest.mark.django_db(transaction=True)
def test_results_are_stored_only_when_signed_by_the_region_and_for_an_open_slot(
    region_worker: RegionWorker,
    sim: SimulatorProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    t, route, region = _world(f"{sim.base_url}/fastchip/v1", region_worker.key)
    route.price_input_per_mtok = 1
    route.price_output_per_mtok = 2
    route.save()
    # Results left on the queue by earlier tests are not this test's.
    with celery_app.connection_for_write() as conn:
        conn.default_channel.queue_purge("ingest")  # type: ignore[attr-defined]
    env = support.child_env(connection.settings_dict)
    ingest_worker = support.start(
        support.celery("worker", "-Q", "ingest", "--pool", "solo", "-n", "in@%h", "-l", "INFO"),
        env,
        tmp_path / "ingest.log",
    )
    try:
        # The real path: beat's signed batch -> region worker -> signed results -> ingest.
        message, expires = _planned_batch()
        _send(signing.seal_dispatch(signing.KIND_BATCH, f"probes.{REGION}", message, expires))
        assert support.wait_until(lambda: ProbeResult.objects.exists(), timeout_s=60), (
            region_worker.text()[-2000:] + (tmp_path / "ingest.log").read_text()[-2000:]
        )
        row = ProbeResult.objects.get()
        assert row.outcome == "ok"
        assert row.cost_usd == route.cost_usd(row.input_tokens or 0, row.output_tokens or 0)

        def rejected() -> int:
            hb = Heartbeat.objects.filter(name=ingest.REJECTED_COUNTER).first()
            return hb.count if hb else 0

        base = rejected()
        at = timezone.now().replace(microsecond=0)
        open_slot = ProbeSlot.objects.create(
            task=t, route=route, region=region, slot_at=at, deadline_at=at + timedelta(minutes=5)
        )
        forged_cost = f.payload(t, route, region, at) | {"cost_usd": 0}
        missing = f.payload(t, route, region, at - timedelta(hours=1))  # no such slot
        sealed = signing.seal(
            region_worker.key, REGION, signing.KIND_RESULTS, [forged_cost, missing], None
        )
        tasks.ingest_results.apply_async(args=(sealed,), queue="ingest")
        assert support.wait_until(lambda: rejected() == base + 1, timeout_s=30)
        stored = ProbeResult.objects.get(slot_at=at)
        assert stored.cost_usd == route.cost_usd(1000, 200)  # ours, not the worker's 0
        assert not ProbeResult.objects.filter(slot_at=at - timedelta(hours=1)).exists()
        open_slot.refresh_from_db()
        assert open_slot.status == "done"

        # Results signed with a key that is no region's are refused whole.
        stranger = signing.RegionSecret(signing.new_key_id(), signing.new_secret())
        later = timezone.now().replace(microsecond=0) + timedelta(seconds=1)
        ProbeSlot.objects.create(
            task=t, route=route, region=region, slot_at=later, deadline_at=later + timedelta(1)
        )
        forged = signing.seal(
            stranger, REGION, signing.KIND_RESULTS, [f.payload(t, route, region, later)], None
        )
        tasks.ingest_results.apply_async(args=(forged,), queue="ingest")
        assert support.wait_until(lambda: rejected() == base + 2, timeout_s=30)
        assert not ProbeResult.objects.filter(slot_at=later).exists()
    finally:
        support.stop(ingest_worker)
