"""Scenario results as ingest stores them, read back: the ranking by app e2e, the route page
(app e2e, calculator estimate, median waterfall), /metrics, and the admin's presets."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from monitor import scenario_presets
from monitor.answer import selection
from monitor.models import (
    GRAIN_HOUR,
    METRIC_APP_E2E_P50,
    METRIC_APP_E2E_P95,
    ProbeResult,
    ProbeSlot,
    Rollup,
    Route,
    ScenarioResult,
    Task,
)
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.ingest import retention as ingest_retention
from monitor.pipeline.ingest import scenarios
from monitor.stats import rollups
from tests.monitor import factories as f

pytestmark = pytest.mark.django_db


def _payload(t: Task, r: Route, region_id: int, at: Any, app_ms: float, n: int) -> dict[str, Any]:
    ProbeSlot.objects.create(
        task=t, route=r, region_id=region_id, slot_at=at, deadline_at=at + timedelta(minutes=5)
    )
    per_call = app_ms / n - 10
    calls = [
        {
            "task_id": t.pk,
            "route_id": r.pk,
            "region_id": region_id,
            "slot_at": None,
            "started_at": (at + timedelta(milliseconds=i * app_ms / n)).isoformat(),
            "outcome": "ok",
            "ttfb_ms": 5.0,
            "ttft_ms": 100.0,
            "e2e_ms": per_call,
            "tps": 100.0,
            "output_tokens": 20,
            "input_tokens": 1000,
            "cached_tokens": 0 if i == 0 else 768,
            "step": i,
        }
        for i in range(n)
    ]
    return {
        "slot": {
            "task_id": t.pk,
            "route_id": r.pk,
            "region_id": region_id,
            "slot_at": at.isoformat(),
        },
        "started_at": at.isoformat(),
        "outcome": "ok",
        "error_kind": "",
        "error_detail": "",
        "failed_step": None,
        "app_e2e_ms": app_ms,
        "calls_e2e_ms": per_call * n,
        "gaps_ms": [10.0] * n,
        "validation_ms": 0.5,
        "validation_pass": True,
        "eval_case_id": None,
        "calls": calls,
    }


@pytest.fixture
def world() -> tuple[Task, list[Route], Any]:
    p = f.provider("fastchip")
    fast, slow = f.route(p, "fast-small"), f.route(p, "slow-large")
    region = f.region("eu")
    t = f.task("agent", [fast, slow], [region], latency_metric="", latency_class="async")
    scenario_presets.apply(t, "agent-loop")
    now = timezone.now().replace(second=0, microsecond=0)
    # The slow route's scenarios take twice as long.
    for i in range(8):
        at = now - timedelta(minutes=10 * (i + 1))
        scenarios.ingest_scenario(_payload(t, fast, region.pk, at, 2000.0 + i, 10))
        scenarios.ingest_scenario(_payload(t, slow, region.pk, at, 4000.0 + i, 10))
    return t, [fast, slow], region


def test_a_scenario_task_ranks_its_routes_by_app_e2e(world) -> None:
    t, (fast, slow), region = world
    assert t.is_scenario
    assert t.ranking_metric() == METRIC_APP_E2E_P50
    t.latency_class = "interactive"
    assert t.ranking_metric() == METRIC_APP_E2E_P95
    t.latency_class = "async"
    now = timezone.now()
    window = selection.Window.read(now - timedelta(days=1), now + timedelta(hours=1), [t.pk])
    routes = [fast, slow]
    choice = selection.choose(
        t, routes, window.latency(t, routes, region), window.quality(t, routes)
    )
    assert choice.metric == METRIC_APP_E2E_P50
    assert choice.winner is not None
    assert choice.winner.route == fast
    assert choice.winner.metric_ms is not None
    assert 1900 < choice.winner.metric_ms < 2100


def test_ingest_keeps_one_result_per_slot_with_its_calls(world) -> None:
    t, (fast, _), region = world
    first = ScenarioResult.objects.filter(route=fast).order_by("slot_at").first()
    assert first is not None
    assert first.calls.count() == 10
    assert first.input_tokens == 10_000
    assert first.cached_tokens == 9 * 768
    # A redelivered result changes nothing: its slot is closed.
    again = _payload(t, fast, region.pk, first.slot_at - timedelta(days=1), 1.0, 1)
    again["slot"]["slot_at"] = first.slot_at.isoformat()
    assert scenarios.ingest_scenario(again) is None
    assert ScenarioResult.objects.filter(route=fast).count() == 8
    assert ProbeResult.objects.filter(route=fast).count() == 80
    stats = rollups.stats_by(
        rollups.rows(
            since=timezone.now() - timedelta(days=1),
            until=timezone.now() + timedelta(hours=1),
            grain="hour",
            all_regions=True,
        ).filter(route=fast),
        ["route_id"],
    )[(fast.pk,)]
    assert stats.count_ok == 8
    assert stats.passed == 8


def test_the_route_page_shows_app_e2e_beside_the_calculator_and_the_median_waterfall(
    world, teammate: User
) -> None:
    t, (fast, _), _region = world
    client = Client()
    client.force_login(teammate)
    response = client.get(f"/routes/{fast.pk}/?task={t.slug}")
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="app-e2e"' in page
    assert "Measured app e2e" in page
    panel = response.context["scenario"]
    assert panel.measured_p50_ms is not None
    assert 1900 < panel.measured_p50_ms < 2100
    # The calculator multiplies single-call medians: 10 steps x (100 ms + 20 tokens at 100 tok/s).
    assert panel.estimate_ms == pytest.approx(10 * (100 + 200))
    assert "What-if calculator" in page
    assert panel.calculator_error == pytest.approx(panel.measured_p50_ms / 3000)
    rows = panel.waterfall["rows"]
    assert rows[:2] == ["step 1", "step 2"]
    assert rows[-1] == "validation"
    decode = next(p for p in panel.waterfall["phases"] if p["name"] == "decode")["data"]
    assert decode[1][0] > decode[0][1]  # the second call starts after the first ends


def test_the_route_page_shows_a_scenarios_calls_own_ttft_e2e_and_speed(
    world, teammate: User
) -> None:
    t, (fast, _), region = world
    client = Client()
    client.force_login(teammate)
    response = client.get(f"/routes/{fast.pk}/?task={t.slug}")
    by_region = {s.region: s for s in response.context["page"].summaries}
    # 8 scenarios of 10 calls: the figures are the 80 calls' own, not "too few" from the
    # rollups' one app e2e sample per scenario.
    for summary in (by_region[region], by_region[None]):
        assert summary.calls is not None
        assert summary.calls.calls == 80
        assert summary.ttft[0] == pytest.approx(100, rel=0.05)
        assert summary.speed[0] == pytest.approx(100, rel=0.05)
        assert summary.e2e[0] == pytest.approx(2000 / 10 - 10, rel=0.05)
        assert summary.ttft[1] is not None  # p95: 80 calls are enough
    row = response.content.decode().split('<tr data-region="eu"')[1].split("</tr>")[0]
    # Only p99 (100 samples) is short of 80 calls: once each for TTFT, e2e and speed.
    assert row.split('data-metric="errors"')[0].count("too few") == 3
    assert "80 calls" in row


def test_the_task_page_shows_each_routes_app_e2e_beside_the_calculator(
    world, teammate: User
) -> None:
    t, (fast, slow), _region = world
    client = Client()
    client.force_login(teammate)
    response = client.get(f"/tasks/{t.slug}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="scenario-summary"' in page
    assert "10 calls in sequence" in page
    summary = response.context["page"].scenario
    lines = {line.route: line for line in summary.lines}
    assert [line.route for line in summary.lines] == [fast, slow]  # in ranked order
    assert 1900 < lines[fast].p50.point < 2100
    assert 3900 < lines[slow].p50.point < 4100
    assert lines[fast].p50.n == 8
    # Both routes' calls: 100 ms TTFT, 20 tokens at 100 tok/s: the calculator says 10 x 300 ms.
    for line in lines.values():
        assert line.estimate_ms == pytest.approx(3000)
        assert line.ratio == pytest.approx(line.p50.point / 3000)
    assert f'href="/routes/{fast.pk}/?task={t.slug}#scenario"' in page
    # The what-if calculator starts from the scenario (one call per step) and its calls' medians.
    whatif = {line.speed.route_id: line for line in response.context["page"].whatif_lines}
    assert response.context["page"].whatif.scenario.calls == 10
    assert whatif[fast.pk].speed.ttft_ms == pytest.approx(100)


def test_metrics_include_app_e2e(world, settings: Any) -> None:
    from monitor.pages import metrics

    body, _ = metrics.exposition("", timezone.now())
    text = body.decode()
    assert "# TYPE routewatch_app_e2e_seconds histogram" in text
    assert "routewatch_app_e2e_seconds_bucket{" in text


def test_the_admin_presets_make_scenarios(world, owner: User) -> None:
    t, _, _ = world
    owner.is_staff = owner.is_superuser = True
    owner.save()
    client = Client()
    client.force_login(owner)
    response = client.post(
        "/admin/monitor/task/",
        {"action": "scenario_fan_out_merge", "_selected_action": [t.pk]},
    )
    assert response.status_code == 302
    steps = list(t.steps.all())
    assert [s.kind for s in steps] == ["fan-out", "sequential"]
    assert steps[0].fan_out == 5
    assert "{previous}" in steps[1].prompt_template


def test_a_late_scenario_measured_in_time_replaces_missed(world) -> None:
    t, (fast, slow), region = world
    at = timezone.now().replace(second=0, microsecond=0) + timedelta(minutes=1)
    in_time = _payload(t, fast, region.pk, at, 2000.0, 10)  # deadline: 5 min after the slot
    too_late = _payload(t, slow, region.pk, at, 2000.0, 10)
    too_late["started_at"] = (at + timedelta(minutes=4, seconds=59)).isoformat()

    def counts(route: Route) -> tuple[int, int, int]:
        hour = Rollup.objects.get(
            grain=GRAIN_HOUR, region=region, route=route, bucket_start=at.replace(minute=0)
        )
        return hour.count_ok, hour.count_missed, hour.error_kinds.get("missed", 0)

    assert ingest.sweep_missed(now=at + timedelta(minutes=6)) == 2
    ok, missed, kinds = counts(fast)
    assert missed >= 1
    assert kinds == missed
    # The broker was down: it arrives after the sweep, but was sealed (and ended) in time.
    sealed = at + timedelta(seconds=3)
    stored = scenarios.ingest_scenario(in_time, from_region=region.pk, sealed_at=sealed)
    assert stored is not None
    assert stored.app_e2e_ms == 2000.0
    assert ProbeSlot.objects.get(route=fast, slot_at=at).status == "done"
    assert not ProbeResult.objects.filter(route=fast, slot_at=at, outcome="missed").exists()
    assert counts(fast) == (ok + 1, missed - 1, kinds - 1)
    # Redelivered: its slot is closed now.
    assert scenarios.ingest_scenario(in_time, from_region=region.pk, sealed_at=sealed) is None
    assert counts(fast) == (ok + 1, missed - 1, kinds - 1)
    # Ended two seconds after its deadline: it proves nothing, missed stays.
    slow_counts = counts(slow)
    assert scenarios.ingest_scenario(too_late, from_region=region.pk, sealed_at=sealed) is None
    assert ProbeSlot.objects.get(route=slow, slot_at=at).status == "missed"
    assert counts(slow) == slow_counts


def test_retention_deletes_old_scenarios_with_their_calls_and_keeps_rollups(world) -> None:
    t, (fast, _), region = world
    old = timezone.now().replace(second=0, microsecond=0) - timedelta(days=100)
    assert scenarios.ingest_scenario(_payload(t, fast, region.pk, old, 2500.0, 4)) is not None
    kept = ScenarioResult.objects.count() - 1
    calls_kept = ProbeResult.objects.filter(scenario__isnull=False).count() - 4
    assert ingest_retention.delete_old_results(days=90) >= 1
    assert ScenarioResult.objects.count() == kept
    assert not ScenarioResult.objects.filter(slot_at__lt=timezone.now() - timedelta(days=90))
    assert ProbeResult.objects.filter(scenario__isnull=False).count() == calls_kept
    assert Rollup.objects.filter(route=fast, bucket_start__lt=old + timedelta(days=1)).exists()
