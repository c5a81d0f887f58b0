"""Issue 30, item 5: spend that matches the bill. A probe's estimate is what the route's own
recent probes of the task used, at its prices; the worst case (the whole token limit) only
until there are any. Checked for every route of the demo (simulator/configs/demo.toml: a plain
model, hidden and visible reasoning, an Anthropic-style thinker, Azure, and whatever the demo
adds) and for the test config's deepseek-style visible reasoner: the demo's own configuration
(load_demo), real probes through the region worker's engine against the simulator, the real
ingest, then the estimate against what the next probes really cost.

The simulator runs a copy of demo.toml with its timing made fast and its faults off: time and
faults do not change what a request uses (tokens), which is what an estimate prices.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from monitor.management.commands.load_demo import DEMO_CONFIG
from monitor.models import ProbeResult, ProbeSlot, Route, ScenarioResult, Task
from monitor.pipeline.beat import scenarios as beat_scenarios
from monitor.pipeline.beat import slots
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.ingest import scenarios
from monitor.pipeline.region import scenarios as region_scenarios
from monitor.pipeline.region import worker
from monitor.stats import spend
from simulator.testing import CONFIGS, SimulatorProcess
from tests.monitor import factories as f

pytestmark = pytest.mark.django_db(transaction=True)

MEASURED = spend.MIN_USAGE_PROBES  # probes (scenario runs) before the estimate
CHECKED = 2  # probes after it, whose real cost it is judged against


def fast_copy(config: Path, folder: Path) -> Path:
    """The config with each model's timing made fast, rate limits lifted and faults off."""
    out: list[str] = []
    in_faults = False
    for line in config.read_text().splitlines():
        if line.startswith("["):
            in_faults = line.strip().endswith(".faults]")
        if in_faults and not line.startswith("[") and "=" in line:
            continue
        line = re.sub(r"^queue_ms = .*", "queue_ms = 1", line)
        line = re.sub(r"^prefill_tokens_per_s = .*", "prefill_tokens_per_s = 10000000", line)
        line = re.sub(r"^decode_tokens_per_s = .*", "decode_tokens_per_s = 200000", line)
        line = re.sub(r"^(requests|tokens)_per_minute = .*", r"\1_per_minute = 1000000000", line)
        out.append(line)
    path = folder / f"fast-{config.name}"
    path.write_text("\n".join(out) + "\n")
    return path


@pytest.fixture(scope="module")
def demo_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatorProcess]:
    with SimulatorProcess(fast_copy(DEMO_CONFIG, tmp_path_factory.mktemp("sim"))) as process:
        yield process


@pytest.fixture(scope="module")
def test_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatorProcess]:
    with SimulatorProcess(fast_copy(CONFIGS / "test.toml", tmp_path_factory.mktemp("sim"))) as p:
        yield p


def _probe(task: Task, route: Route, n: int, start: int) -> list[Decimal]:
    """n real probes (scenario runs) of the route for the task, ingested as a region's results
    are; their real costs."""
    region = task.regions.order_by("pk").first()
    assert region is not None
    cases = list(task.eval_cases.order_by("pk"))
    steps = list(task.steps.all())
    now = timezone.now().replace(microsecond=0)
    costs: list[Decimal] = []
    planned = []
    for i in range(start, start + n):
        at = now - timedelta(minutes=30) + timedelta(seconds=i)
        ProbeSlot.objects.create(
            task=task, route=route, region=region, slot_at=at, deadline_at=at + timedelta(hours=1)
        )
        planned.append(slots.Slot(task, route, region, at))
    if steps:
        for slot in planned:
            payload = region_scenarios.run(beat_scenarios.scenario_message(slot, steps, cases))
            assert payload is not None
            stored = scenarios.ingest_scenario(dict(payload))
            assert stored is not None
            run = ScenarioResult.objects.get(pk=stored.pk)
            assert run.outcome == "ok", (route, run.error_kind, run.error_detail)
            costs.append(run.cost_usd)
        return costs
    messages = [slots.probe_message(slot, cases, n=i) for i, slot in enumerate(planned)]
    # All at once (no spread over a tick): what a probe uses does not depend on when it starts.
    batch = {"region": region.slug, "probes": messages, "window_s": 0}
    payloads = [dict(p) for p in worker.run_batch(batch)]
    assert ingest.ingest(payloads) == n
    for p in payloads:
        assert p["outcome"] == "ok", (route, p["error_kind"], p.get("error_detail"))
    rows = ProbeResult.objects.filter(
        task=task, route=route, slot_at__in=[s.slot_at for s in planned]
    )
    costs = [r.cost_usd for r in rows if r.cost_usd is not None]
    assert len(costs) == n  # every probe priced
    return costs


def _judge(task: Task, route: Route) -> dict[str, Any]:
    worst = spend.worst_case_usd(task, route)
    assert spend.probe_estimate_usd(task, route, spend.measured_usage(timezone.now())) == worst
    _probe(task, route, MEASURED, 0)
    estimate = spend.probe_estimate_usd(task, route, spend.measured_usage(timezone.now()))
    real = _probe(task, route, CHECKED, MEASURED)
    mean = sum(real, Decimal(0)) / len(real)
    return {
        "route": str(route),
        "task": task.slug,
        "worst": worst,
        "estimate": estimate,
        "real": mean,
    }


def _within_2x(figures: dict[str, Any]) -> bool:
    real, estimate = figures["real"], figures["estimate"]
    return real > 0 and real / 2 <= estimate <= real * 2


def test_every_demo_route_is_estimated_within_2x_of_what_it_really_costs(
    demo_sim: SimulatorProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("load_demo", "--simulator", demo_sim.base_url)
    judged = []
    for task in Task.objects.prefetch_related("steps").order_by("slug"):
        for route in task.routes.select_related("provider").order_by("pk"):
            judged.append(_judge(task, route))
    with capsys.disabled():
        print("\ntask / route: worst case, estimate, real (mean of the next probes)")
        for j in judged:
            print(
                f"  {j['task']} / {j['route']}: ${j['worst']:.5f}, ${j['estimate']:.5f},"
                f" ${j['real']:.5f} ({j['estimate'] / j['real']:.2f}x)"
            )
    assert [j for j in judged if not _within_2x(j)] == []
    # The reasoning routes the worst case priced many times over are among them.
    assert any(j["worst"] > 5 * j["real"] for j in judged)


def test_a_visible_reasoning_route_is_estimated_within_2x_of_what_it_really_costs(
    test_sim: SimulatorProcess,
) -> None:
    p = f.provider("visible", base_url=f"{test_sim.base_url}/visible/v1")
    p.set_api_key("sk-test-visible-0123456789")
    p.save()
    route = f.route(p, "ds-think")
    region = f.region("local")
    task = f.task("think", [route], [region], input_tokens=500, max_tokens=200)
    figures = _judge(task, route)
    assert _within_2x(figures), figures


# --- what counts: measured usage, never generated history -------------------------------


def _cheap_world() -> tuple[Task, Route, Any]:
    p = f.provider()
    route = f.route(p, "m")  # $1/M in, $2/M out: a factories.payload result costs $0.0014
    region = f.region("eu-west")
    # The worst case: 1000 in, 5000 out: $0.011, eight times what its probes cost.
    task = f.task("qa", [route], [region], input_tokens=1000, max_tokens=5000)
    return task, route, region


@pytest.mark.django_db
def test_in_flight_probes_are_counted_at_the_routes_measured_usage_and_replaced_by_real_cost() -> (
    None
):
    task, route, region = _cheap_world()
    now = timezone.now().replace(microsecond=0)
    assert spend.probe_estimate_usd(task, route, spend.measured_usage(now)) == Decimal("0.011")
    ingest.ingest(
        [f.payload(task, route, region, now - timedelta(minutes=i + 2)) for i in range(3)]
    )
    # Three measured probes: an open slot is counted at their usage, not the token limit.
    ProbeSlot.objects.create(
        task=task, route=route, region=region, slot_at=now, deadline_at=now + timedelta(minutes=1)
    )
    assert spend.in_flight_by_task(now) == {task.pk: Decimal("0.0014")}
    assert spend.committed_by_task(now)[task.pk] == Decimal("0.0056")
    # At ingest the estimate leaves in flight and the real cost is spent: 300 tokens out.
    result = f.payload(task, route, region, now)
    result["output_tokens"] = 300
    assert ingest.ingest([result]) == 1
    assert spend.in_flight_by_task(now) == {}
    assert spend.committed_by_task(now)[task.pk] == Decimal("0.0042") + Decimal("0.0016")


@pytest.mark.django_db
def test_generated_demo_history_is_never_spend_and_never_usage() -> None:
    task, route, region = _cheap_world()
    now = timezone.now().replace(microsecond=0)
    history = [
        {**f.payload(task, route, region, now - timedelta(hours=5, minutes=i)), "generated": True}
        for i in range(20)
    ]
    assert ingest.ingest(history) == 20
    # Drawn, not paid for: nothing spent; drawn, not measured: the worst case still.
    assert spend.spent_by_task(now).get(task.pk, Decimal(0)) == 0
    assert spend.measured_usage(now) == {}
    assert spend.probe_estimate_usd(task, route, spend.measured_usage(now)) == Decimal("0.011")
    # Measured probes after the history's last hour: spend, and the route's usage.
    later = now + timedelta(hours=1)
    measured = [f.payload(task, route, region, later - timedelta(seconds=i + 1)) for i in range(3)]
    assert ingest.ingest(measured) == 3
    assert spend.spent_by_task(later)[task.pk] == Decimal("0.0042")
    assert spend.probe_estimate_usd(task, route, spend.measured_usage(later)) == Decimal("0.0014")


@pytest.mark.django_db
def test_spend_estimates_prints_each_routes_estimate_beside_its_real_cost() -> None:
    task, route, region = _cheap_world()
    now = timezone.now().replace(microsecond=0)
    results = [f.payload(task, route, region, now - timedelta(seconds=i + 1)) for i in range(3)]
    results[0]["output_tokens"] = 500  # $0.0020; the others $0.0014: mean $0.0016
    assert ingest.ingest(results) == 3
    out = io.StringIO()
    call_command("spend_estimates", stdout=out)
    assert f"  qa / {route}: $0.00160, $0.00160 (3), 1.00x, worst $0.01100" in out.getvalue()
