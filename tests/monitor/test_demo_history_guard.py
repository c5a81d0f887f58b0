"""Demo history never goes into a database that holds measured results (an empty database of
its own: test_demo_history.py shares one loaded demo between its tests)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from monitor.models import OUTCOME_OK, ProbeResult, RaceRun, Task
from monitor.pipeline import ingest
from tests.monitor.test_demo_history import _load_demo

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
