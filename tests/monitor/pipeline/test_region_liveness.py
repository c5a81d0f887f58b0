"""Region liveness with real region workers (issue 31, item 4): every worker's heartbeat on the
Status page; a region with no live worker is down, never green and never its providers'
fault; a region whose every probe fails at its network has a failed path, not failing
providers.

One stack: beat, an ingest worker, the simulator, and real region workers for three regions:
- r-live probes the simulator;
- r-gone has figures that read green while its worker lives (seeded, with real ingest), then
  its worker is stopped;
- r-cut's worker reaches the providers through an address where nothing listens (its path
  fails: every probe a connect error, to both providers).
"""

from __future__ import annotations

import html
import importlib.metadata
import re
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.urls import reverse

from devstack.stack import SERVER_ONLY_SECRETS
from monitor.answer import board
from monitor.models import ProbeResult, Region, RegionKey
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.region import liveness
from simulator.testing import CONFIGS, SimulatorProcess, free_port
from tests import support
from tests.monitor import factories as f
from tests.processes import ProcessStack, running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LIVE, GONE, CUT = "r-live", "r-gone", "r-cut"


def _page(client: Client, name: str) -> str:
    """The page as its reader sees the text (HTML entities unescaped)."""
    return html.unescape(client.get(reverse(name)).content.decode())


def _row(page: str, attrs: str) -> str:
    found = re.search(rf"<tr {attrs}.*?</tr>", page, re.S)
    assert found, (attrs, page)
    return found.group(0)


def _cell(row: str, name: str) -> str:
    found = re.search(rf"<td[^>]*data-{name}[^>]*>(.*?)</td>", row, re.S)
    assert found, (name, row)
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def _overview_cells(page: str, region: str) -> list[tuple[str, str]]:
    """(status, the row's HTML) of each overview cell of the region."""
    found = re.finditer(rf'<tr class="status-(\w+)" data-region="{region}">(.*?)</tr>', page, re.S)
    return [(m.group(1), m.group(2)) for m in found]


def _dead_port() -> int:
    """A loopback port where nothing listens (connect refused)."""
    port = free_port()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    return port


@pytest.fixture
def sim() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(CONFIGS / "test.toml") as s:
        yield s


def _world(sim: SimulatorProcess) -> dict[str, str]:
    routes = []
    for slug, model in (("fastchip", "fast-small"), ("statsim", "stat-model")):
        p = f.provider(slug, base_url=f"{sim.base_url}/{slug}/v1")
        p.set_api_key(f"sk-test-{slug}-0123456789")
        p.save()
        routes.append(f.route(p, model))
    regions = [f.region(slug) for slug in (LIVE, GONE, CUT)]
    keys = {}
    for g in regions:
        g.keys.update(is_active=False)
        key, secret = RegionKey.issue(g)
        keys[g.slug] = f"{key.key_id}:{secret}"
    task = f.task(
        "liveness", routes, regions, user_template="What is 12 * 12?", input_tokens=200,
        max_tokens=20, probe_interval_s=5, probe_timeout_s=5, ttft_p95_budget_ms=5000,
        e2e_p95_budget_ms=10000,
    )  # fmt: skip
    # r-gone's figures: 25 good probes a route in the last minute, ingested as a worker's are.
    gone = Region.objects.get(slug=GONE)
    now = datetime.now(UTC)
    seeded = [
        f.payload(task, r, gone, now - timedelta(seconds=2 * k), slot=False, ttft_ms=300,
                  e2e_ms=900)
        for r in routes for k in range(25)
    ]  # fmt: skip
    assert ingest.ingest(seeded) == len(seeded)
    return keys


def _worker_env(slug: str, keys: dict[str, str], spool: Path, **extra: str) -> dict[str, str]:
    return {
        **dict.fromkeys(SERVER_ONLY_SECRETS, ""),
        "RW_WORKER_ONLY": "true", "RW_REGION": slug, "RW_REGION_KEYS": keys[slug],
        "RW_SPOOL_DIR": str(spool), **extra,
    }  # fmt: skip


@pytest.mark.timeout(240)
def test_each_regions_workers_are_shown_and_a_down_or_cut_region_is_never_its_providers_fault(
    sim: SimulatorProcess, tmp_path: Path, admin_user: User
) -> None:
    keys = _world(sim)
    env = support.child_env(
        connection.settings_dict, TICK_SECONDS="1", SLOT_GRACE_SECONDS="10",
        PROVIDER_ALLOW_PRIVATE_NETWORKS="true", DASHBOARD_REFRESH_SECONDS="4",
    )  # fmt: skip
    dead = f"127.0.0.1:{sim.port}=127.0.0.1:{_dead_port()}"
    client = Client()
    client.force_login(admin_user)
    with running(ProcessStack(tmp_path, env)) as stack:
        stack.start("ingest", support.celery("worker", "-Q", "schedule,ingest,default", "-c", "2", "-n", "ingest@%h"))  # fmt: skip
        for slug, extra in ((LIVE, {}), (GONE, {}), (CUT, {"RW_CONNECT_TO": dead})):
            spool = tmp_path / f"spool-{slug}"
            argv = support.region_worker(slug, f"{slug}@%h", 4)
            stack.start(slug, argv, _worker_env(slug, keys, spool, **extra))
        stack.start("beat", support.celery("beat", "-s", str(tmp_path / "beat.schedule")))

        def stored(region: str, outcome: str) -> int:
            connection.close()
            rows = ProbeResult.objects.filter(region__slug=region, slot_at__isnull=False)
            return rows.filter(outcome=outcome).count()

        assert support.wait_until(lambda: stored(LIVE, "ok") >= 2, 90, 0.5), stack.logs(6000)
        assert support.wait_until(lambda: stored(CUT, "error") >= 4, 60, 0.5), stack.logs(6000)
        assert support.wait_until(lambda: len(liveness.live_workers() or {}) == 3, 30, 0.5)

        # The Status page: each region's workers with their heartbeat.
        status = _page(client, "rw-status")
        live = _row(status, f'data-worker="[^"]+" data-worker-region="{LIVE}"')
        assert _cell(live, "version") == importlib.metadata.version("routewatch")
        offset = re.search(r'data-clock-offset="(-?[\d.]+)"', live)
        assert offset, live
        assert abs(float(offset.group(1))) < 1.0  # same machine: the same clock
        assert re.fullmatch(r"\d+", _cell(live, "worker-in-flight")), live
        assert _cell(live, "spooled") == "0"
        assert re.fullmatch(r"\d+ s ago", _cell(live, "last-consumed")), live
        assert _cell(live, "state") == "consuming"
        # While r-gone's worker lives, its figures read green.
        overview = _page(client, "rw-overview")
        assert {s for s, _ in _overview_cells(overview, GONE)} == {"ok"}, overview

        # r-cut: every probe failed at its network, to two providers: its path, not them.
        path = f"{CUT}: the region's network path failed"
        assert path in status, status
        assert "the providers are not to blame" in status
        for page in (status, overview):
            assert f"{LIVE}: the region's network path failed" not in page
        cut_cells = _overview_cells(overview, CUT)
        assert cut_cells, overview
        for state, cell in cut_cells:
            assert state != "ok", cell
            assert "network path failed" in cell, cell
        assert path in overview

        # r-gone's worker stops: once its heartbeat has expired, its region is down.
        stack.stop(GONE)
        assert support.wait_until(lambda: GONE not in (liveness.live_workers() or {}), 30, 0.5)
        status = _page(client, "rw-status")
        gone_row = _row(status, f'data-worker-region="{GONE}" class="over-border"')
        assert "down: no live worker" in gone_row
        assert f"{GONE}: down, no live worker" in status
        assert _row(status, f'data-region="{GONE}"')  # still in the regions' table
        overview = _page(client, "rw-overview")
        cells = _overview_cells(overview, GONE)
        assert len(cells) == 1, overview
        for state, cell in cells:
            assert state != "ok", cell  # never green
            assert "its region is down (no live worker)" in cell, cell
        assert f"{GONE}: down, no live worker" in overview
        # Its slots since are recorded missed: ours, never its providers' errors.
        assert support.wait_until(lambda: stored(GONE, "missed") >= 2, 30, 0.5)
        connection.close()
        built = board.build(datetime.now(UTC))
        gone_cells = [c for row in built.rows for c in row.cells if c.region_slug == GONE]
        assert gone_cells[0].winner is not None
        assert gone_cells[0].winner.errors == 0
        assert sum(c.winner.missed for c in gone_cells if c.winner) >= 1
        # r-live was never down nor cut.
        for page in (status, overview):
            assert f"{LIVE}: down" not in page
