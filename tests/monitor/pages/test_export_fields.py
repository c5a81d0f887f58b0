"""Issue 30, item 4: the CSV and JSON exports carry what a reader needs to compare their
figures with the pages': whether a row was generated demo history, whether it ranks routes
(reference), the tokens streamed apart from those billed, the planned slot, and for a
scenario's call its scenario and step. Rows stored by the real ingest (PostgreSQL)."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from monitor import scenario_presets
from monitor.models import ProbeResult, ProbeSlot, ScenarioResult
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.ingest import scenarios
from tests.monitor import factories as f


def test_the_exports_carry_generated_reference_streamed_tokens_slot_and_scenario_step(
    client: Client, teammate: User, db: None
) -> None:
    p = f.provider()
    r = f.route(p, "chat")
    g = f.region("eu-west")
    single = f.task("qa", [r], [g])
    agent = f.task("agent", [r], [g], latency_metric="", latency_class="async")
    scenario_presets.apply(agent, "agent-loop")
    now = timezone.now().replace(microsecond=0)
    probe = f.payload(single, r, g, now - timedelta(minutes=5))
    probe["streamed_output_tokens"] = 150  # reference: judged at ingest by the task's options
    assert ingest.ingest([probe]) == 1
    at = now - timedelta(minutes=3)
    ProbeSlot.objects.create(
        task=agent, route=r, region=g, slot_at=at, deadline_at=at + timedelta(minutes=5)
    )
    calls = [
        {
            **f.payload(agent, r, g, at + timedelta(seconds=i), slot=False),
            "step": i,
            "streamed_output_tokens": 20,
        }
        for i in range(2)
    ]
    scenarios.ingest_scenario(
        {
            "slot": {
                "task_id": agent.pk,
                "route_id": r.pk,
                "region_id": g.pk,
                "slot_at": at.isoformat(),
            },
            "started_at": at.isoformat(),
            "outcome": "ok",
            "error_kind": "",
            "error_detail": "",
            "failed_step": None,
            "app_e2e_ms": 4100.0,
            "calls_e2e_ms": 4000.0,
            "gaps_ms": [10.0, 10.0],
            "validation_ms": 0.5,
            "validation_pass": True,
            "eval_case_id": None,
            "calls": calls,
        }
    )
    scenario = ScenarioResult.objects.get()
    # One row of demo history (monitor.demo_history writes such rows).
    history = f.payload(single, r, g, now - timedelta(minutes=9))
    assert ingest.ingest([history]) == 1
    ProbeResult.objects.filter(started_at=now - timedelta(minutes=9)).update(generated=True)
    client.force_login(teammate)

    response = client.get(reverse("rw-export", args=["json"]))
    rows = json.loads(b"".join(response.streaming_content))  # type: ignore[attr-defined]
    assert [(row["task"], row["generated"]) for row in rows] == [
        ("qa", True),
        ("qa", False),
        ("agent", False),
        ("agent", False),
    ]
    measured = rows[1]
    assert measured["reference"] is True
    assert measured["streamed_output_tokens"] == 150
    assert measured["slot_at"] is not None
    assert measured["scenario_id"] is None
    assert measured["step"] is None
    first, second = rows[2], rows[3]
    assert (first["scenario_id"], first["step"]) == (scenario.pk, 0)
    assert (second["scenario_id"], second["step"]) == (scenario.pk, 1)
    assert first["slot_at"] is None  # a call's slot is its scenario's
    assert first["scenario_slot_at"] is not None
    assert first["streamed_output_tokens"] == 20

    response = client.get(reverse("rw-export", args=["csv"]))
    text = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    header = next(csv.reader(io.StringIO(text)))
    for name in (
        "generated",
        "reference",
        "streamed_output_tokens",
        "slot_at",
        "scenario_id",
        "scenario_slot_at",
        "step",
    ):
        assert name in header
    last = list(csv.DictReader(io.StringIO(text)))[-1]
    assert (last["scenario_id"], last["step"]) == (str(scenario.pk), "1")
