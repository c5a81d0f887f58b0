"""A route of each newer wire format (OpenAI Responses, Gemini native, Bedrock with SigV4),
probed for real: beat, an ingest worker and a region worker (Celery processes), Redis,
PostgreSQL and the simulator; stored through ingest with their reasoning, cache and server-time
figures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from devstack.stack import SERVER_ONLY_SECRETS
from monitor.models import ProbeResult, Provider, Region, RegionKey, Route, Task
from simulator.testing import CONFIGS, SimulatorProcess
from tests import support
from tests.processes import ProcessStack, running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

REGION = "r-wire"
KEYS: dict[str, str] = {}


def _configure(sim: SimulatorProcess) -> list[Route]:
    responses = Provider(
        name="Responses",
        slug="oairesp",
        base_url=f"{sim.base_url}/oairesp/v1",
        wire_format="responses",
    )
    responses.set_api_key("sk-test-oairesp-0123456789")
    responses.save()
    gemini = Provider(
        name="Gemini", slug="gemsim", base_url=f"{sim.base_url}/gemsim/v1beta", wire_format="gemini"
    )
    gemini.set_api_key("test-gemsim-key-0123456789")
    gemini.save()
    bedrock = Provider(
        name="Bedrock",
        slug="bedsim",
        base_url=f"{sim.base_url}/bedsim",
        wire_format="bedrock",
        aws_region="us-west-2",
    )
    bedrock.set_aws_credentials("AKIDTESTBEDSIM01", "test-secret-bedsim-0123456789")
    bedrock.save()
    routes = [
        Route.objects.create(provider=responses, model_id="resp-think", reasoning_effort="low"),
        Route.objects.create(provider=gemini, model_id="gem-think", thinking_budget_tokens=1024),
        Route.objects.create(
            provider=bedrock, model_id="anthropic.claude-sim-v1:0", thinking_budget_tokens=1024
        ),
    ]
    region = Region.objects.create(name=REGION, slug=REGION)
    key, secret = RegionKey.issue(region)
    KEYS[REGION] = f"{key.key_id}:{secret}"
    task = Task.objects.create(
        name="wire",
        slug="wire",
        user_template="What is 12 * 12?",
        input_tokens=1500,  # past the caches' minimum: later probes read the prefix cached
        max_tokens=100,
        probe_interval_s=5,
        probe_timeout_s=10,
    )
    task.routes.set(routes)
    task.regions.set([region])
    return routes


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[ProcessStack, list[Route]]]:
    with SimulatorProcess(CONFIGS / "test.toml") as sim:
        routes = _configure(sim)
        env = support.child_env(
            connection.settings_dict,
            TICK_SECONDS="1",
            SLOT_GRACE_SECONDS="10",  # a batch expires at its first slot + grace: room on a loaded machine
            PROVIDER_ALLOW_PRIVATE_NETWORKS="true",
        )
        with running(ProcessStack(tmp_path, env)) as s:
            s.start(
                "ingest",
                support.celery(
                    "worker", "-Q", "schedule,ingest,default", "-c", "2", "-n", "ingest@%h"
                ),
            )
            s.start(
                REGION,
                support.region_worker(REGION, f"{REGION}@%h"),
                {
                    **dict.fromkeys(SERVER_ONLY_SECRETS, ""),
                    "RW_REGION": REGION,
                    "RW_REGION_KEYS": KEYS[REGION],
                    "RW_WORKER_ONLY": "true",
                    "DATABASE_URL": "",
                },
            )
            s.start("beat", support.celery("beat", "-s", str(s.tmp / "beat.schedule")))
            yield s, routes


def test_a_route_of_each_format_is_probed_by_a_region_worker_and_stored(
    stack: tuple[ProcessStack, list[Route]],
) -> None:
    _, routes = stack

    def three_each() -> bool:
        connection.close()
        return all(ProbeResult.objects.filter(route=r, outcome="ok").count() >= 3 for r in routes)

    assert support.wait_until(three_each, 90, interval_s=1), {
        r.model_id: list(
            ProbeResult.objects.filter(route=r).values_list("outcome", "error_kind", "error_detail")
        )
        for r in routes
    }
    responses, gemini, bedrock = routes
    for route in routes:
        rows = ProbeResult.objects.filter(route=route, outcome="ok").order_by("started_at")
        for row in rows:
            # Reasoning apart from the answer: billed, reported, and kept out of speed.
            assert row.reasoning_tokens is not None
            assert row.reasoning_tokens > 0
            assert row.ttfat_ms is not None
            assert row.ttft_ms is not None
            assert row.ttfat_ms >= row.ttft_ms
            assert row.tps is not None
            assert row.streamed_output_tokens is not None
        assert any((row.cached_tokens or 0) >= 1024 for row in rows), route.model_id
    hidden = ProbeResult.objects.filter(route=responses, outcome="ok")
    assert all(r.hidden_reasoning_tokens == r.reasoning_tokens for r in hidden)
    # The provider's own time, where it reports one: Bedrock's latencyMs, openai-processing-ms.
    for route in (responses, bedrock):
        for row in ProbeResult.objects.filter(route=route, outcome="ok"):
            assert row.server_ms is not None
            assert row.e2e_ms is not None
            assert row.server_ms <= row.e2e_ms
    assert not ProbeResult.objects.filter(route=gemini, server_ms__isnull=False).exists()
