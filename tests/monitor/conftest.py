"""Dashboard tests: users, and a small world probed for real against the simulator.

`probed_world` configures providers pointing at a simulator process, builds each probe's
message with the scheduler's own `probe_message` (monitor.pipeline.beat.slots), runs the batch through the region worker's
`run_batch` (real HTTP to the simulator) and stores the payloads with `monitor.pipeline.ingest.results.ingest`,
which writes the raw rows and the rollups the pages read. The measured payloads are kept for
the session and re-keyed to each test's fresh rows, so only the first test pays for probing;
their start times are spread over the last hours so charts have several points.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.utils import timezone

from monitor.models import EvalCase, Provider, Region, Route, Task
from monitor.pipeline.beat import slots
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.region import worker
from simulator.testing import CONFIGS, SimulatorProcess

PROBES_PER_CELL = 24  # enough for p95 (20 samples), deliberately short of p99 (100)
SPREAD = timedelta(hours=3)
ROUTES = [  # (provider slug, model id)
    ("fastchip", "fast-small"),
    ("fastchip", "slow-large"),
    ("claudish", "claudish-mid"),
    ("limited", "tiny"),  # 3 requests a minute: mostly 429s, for errors and headroom
]
KEYS = {
    "fastchip": ("FastChip", "openai", "/fastchip/v1", "sk-test-fastchip-0123456789"),
    "claudish": ("Claudish", "anthropic", "/claudish", "sk-test-claudish-0123456789"),
    "limited": ("Limited", "openai", "/limited/v1", "sk-test-limited-0123456789"),
}


@pytest.fixture
def staff(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_user(
        "staffer", "s@example.com", "pw-staff-1", is_staff=True
    )


@pytest.fixture(scope="session")
def simulator() -> Iterator[SimulatorProcess]:
    with SimulatorProcess(CONFIGS / "test.toml") as process:
        yield process


@dataclass
class World:
    task: Task
    routes: dict[str, Route]
    regions: list[Region]
    now: datetime


def configure(base_url: str) -> World:
    providers = {}
    for slug, (name, wire, path, key) in KEYS.items():
        # The simulator serves HTTP/2 and (for these test providers) msgpack bodies to all.
        p = Provider(
            name=name,
            slug=slug,
            base_url=base_url + path,
            wire_format=wire,
            http2=True,
            accepts_msgpack=True,
        )
        p.is_simulated = True
        p.set_api_key(key)
        p.save()
        providers[slug] = p
    routes = {
        model: Route.objects.create(
            provider=providers[slug],
            model_id=model,
            price_input_per_mtok=1,
            price_output_per_mtok=4,
        )
        for slug, model in ROUTES
    }
    regions = [
        Region.objects.create(name="EU West", slug="eu-west"),
        Region.objects.create(name="US East", slug="us-east"),
    ]
    task = Task.objects.create(
        name="Arithmetic",
        slug="arithmetic",
        user_template="{input}",
        input_tokens=200,
        max_tokens=80,  # room for every simulated answer and its ANSWER line
        probe_interval_s=60,
        probe_timeout_s=10,
        latency_metric="e2e_p50",
        min_pass_rate=0.8,
        min_graded=10,
        ttft_p95_budget_ms=1000,
        e2e_p95_budget_ms=3000,
        http_versions=["1.1", "2"],
        body_encodings=["json", "msgpack-gzip"],
        connection_modes=["warm", "cold"],
    )
    task.routes.set(routes.values())
    task.regions.set(regions)
    for i, q in enumerate(("What is 12 * 12?", "What is 21 * 3?")):
        answer = str(eval(q.removeprefix("What is ").rstrip("?")))  # noqa: S307 (our literal)
        EvalCase.objects.create(task=task, name=f"q{i}", input=q, grader="numeric", expected=answer)
    return World(task=task, routes=routes, regions=regions, now=timezone.now())


_MEASURED: dict[str, list[dict[str, Any]]] = {}


def _run_probes(world: World) -> list[dict[str, Any]]:
    cases = list(world.task.eval_cases.order_by("pk"))
    messages = []
    now = world.now
    for route in world.routes.values():
        for region in world.regions:
            for i in range(PROBES_PER_CELL):
                # The last probe of each cell is the freshest: routes are not stale.
                at = now - SPREAD + SPREAD * (i + 1) / PROBES_PER_CELL - timedelta(seconds=5)
                slot = slots.Slot(world.task, route, region, at.replace(microsecond=0))
                messages.append(slots.probe_message(slot, cases, n=i))
    # Starts spread over 10 s (the worker spreads a batch over one tick): little contention.
    with override_settings(TICK_SECONDS=10):
        return [dict(p) for p in worker.run_batch({"region": "test", "probes": messages})]


def _rekey(payloads: list[dict[str, Any]], world: World) -> list[dict[str, Any]]:
    """Payloads measured for an earlier test's rows, pointed at this test's rows."""
    by_model = {r.model_id: r.pk for r in world.routes.values()}
    regions = [g.pk for g in world.regions]
    cases = {c.name: c.pk for c in world.task.eval_cases.all()}
    out = []
    for p in payloads:
        q = copy.deepcopy(p)
        q["task_id"] = world.task.pk
        q["route_id"] = by_model[p["_model"]]
        q["region_id"] = regions[p["_region"]]
        q["eval_case_id"] = cases.get(p["_case"]) if p["_case"] else None
        shift = world.now - datetime.fromisoformat(p["_now"])
        for key in ("slot_at", "started_at"):
            q[key] = (datetime.fromisoformat(p[key]) + shift).isoformat()
        out.append({k: v for k, v in q.items() if not k.startswith("_")})
    return out


def probe_and_ingest(world: World, base_url: str) -> int:
    if base_url not in _MEASURED:
        payloads = _run_probes(world)
        models = {r.pk: r.model_id for r in world.routes.values()}
        regions = {g.pk: i for i, g in enumerate(world.regions)}
        cases = {c.pk: c.name for c in world.task.eval_cases.all()}
        for p in payloads:
            # The worker stamps real start times; place each probe at its slot in the spread.
            p["started_at"] = p["slot_at"]
            p["_model"] = models[p["route_id"]]
            p["_region"] = regions[p["region_id"]]
            p["_case"] = cases.get(p.get("eval_case_id") or 0, "")
            p["_now"] = world.now.isoformat()
        _MEASURED[base_url] = payloads
    return ingest.ingest(_rekey(_MEASURED[base_url], world))


@pytest.fixture
def probed_world(simulator: SimulatorProcess, transactional_db: None) -> World:
    world = configure(simulator.base_url)
    assert probe_and_ingest(world, simulator.base_url) == len(ROUTES) * 2 * PROBES_PER_CELL
    return world


@pytest.fixture
def empty_world(simulator: SimulatorProcess, db: None) -> World:
    return configure(simulator.base_url)
