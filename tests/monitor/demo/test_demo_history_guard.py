"""Demo history never goes into a database that holds measured results (an empty database of
its own: test_demo_history.py shares one loaded demo between its tests)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from monitor.models import OUTCOME_OK, ProbeResult, ProbeSlot, RaceRun, ScenarioResult, Task
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.ingest import scenarios
from tests.monitor.demo.test_demo_history import _load_demo

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_is_never_added_to_a_database_with_measured_results(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _load_demo(history=False)
    task = Task.objects.get(slug="support-answer")
    route = task.routes.first()
    region = task.regions.first()
    assert route is not None
    assert region is not None
    now = timezone.now()
    ingest.ingest(
        [
            {
                "task_id": task.pk,
                "route_id": route.pk,
                "region_id": region.pk,
                "slot_at": None,
                "started_at": now.isoformat(),
                "outcome": OUTCOME_OK,
                "ttft_ms": 300.0,
                "e2e_ms": 900.0,
            }
        ]
    )
    with caplog.at_level("INFO", logger="monitor.demo_history"):
        output = _load_demo()
    assert "Demo history not added" in output
    assert "the database holds measured results" in caplog.text
    assert ProbeResult.objects.count() == 1
    assert not RaceRun.objects.exists()


def test_a_measured_scenario_without_calls_is_measured_results_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A scenario that failed before its first call leaves no probe result, only itself."""
    _load_demo(history=False)
    task = Task.objects.get(slug="agent-loop-10")
    route = task.routes.first()
    region = task.regions.first()
    assert route is not None
    assert region is not None
    at = timezone.now().replace(microsecond=0)
    ProbeSlot.objects.create(
        task=task,
        route=route,
        region=region,
        slot_at=at,
        status="dispatched",
        deadline_at=at + timedelta(minutes=5),
    )
    stored = scenarios.ingest_scenario(
        {
            "slot": {
                "task_id": task.pk,
                "route_id": route.pk,
                "region_id": region.pk,
                "slot_at": at.isoformat(),
            },
            "started_at": at.isoformat(),
            "outcome": "error",
            "error_kind": "config",
            "error_detail": "the provider has no API key",
            "failed_step": None,
            "app_e2e_ms": 0.5,
            "calls_e2e_ms": None,
            "gaps_ms": [],
            "validation_ms": None,
            "validation_pass": None,
            "eval_case_id": None,
            "calls": [],
        }
    )
    assert stored is not None
    assert stored.generated is False
    with caplog.at_level("INFO", logger="monitor.demo_history"):
        output = _load_demo()
    assert "Demo history not added" in output
    assert "the database holds measured results" in caplog.text
    assert not ProbeResult.objects.exists()
    assert ScenarioResult.objects.count() == 1
