"""Ingest's side of scenarios (monitor.pipeline.beat.scenarios tells the whole story): one
ScenarioResult per open slot, its calls as ProbeResult rows linked to it, folded into the
rollups once per slot.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from monitor.models import (
    OUTCOME_OK,
    SLOT_DISPATCHED,
    SLOT_DONE,
    SLOT_MISSED,
    EvalCase,
    ProbeResult,
    ProbeSlot,
    Route,
    ScenarioResult,
)
from monitor.pipeline import signing
from monitor.pipeline.ingest.results import count_rejected, insert_rows, take_back_missed
from monitor.pipeline.ingest.rows import BadPayload, row_from_payload
from monitor.pipeline.messages import (
    ContractError,
    ScenarioPayload,
    scenario_payload_from_json,
)
from monitor.stats import health, rollup_writes

log = logging.getLogger(__name__)


def _open_slot(payload: ScenarioPayload, region_id: int | None, now: datetime) -> ProbeSlot | None:
    """The payload's slot, locked, if it is still open (and of the region that signed it)."""
    key = payload["slot"]
    if region_id is not None and key["region_id"] != region_id:
        log.warning("rejected a scenario result: sent by another region's worker")
        return None
    try:
        slot_at = datetime.fromisoformat(key["slot_at"])
    except ValueError:
        log.warning("rejected a scenario result: its slot time is not a time")
        return None
    slot = (
        ProbeSlot.objects.select_for_update()
        .filter(
            task_id=key["task_id"],
            route_id=key["route_id"],
            region_id=key["region_id"],
            slot_at=slot_at,
        )
        .first()
    )
    if slot is None or slot.status not in (SLOT_DISPATCHED, SLOT_MISSED):
        log.warning("rejected a scenario result: no open slot for it")
        return None
    if region_id is not None and now > slot.deadline_at:
        log.warning("rejected a scenario result: sent after its slot's deadline")
        return None
    if slot.status == SLOT_MISSED and _ended_at(payload, now) > slot.deadline_at:
        log.warning("rejected a scenario result: its slot was missed and it ended after")
        return None
    return slot


def _ended_at(payload: ScenarioPayload, default: datetime) -> datetime:
    """When the scenario ended: its start plus its app e2e time (to the failure, for a failed
    one; its start when it has none)."""
    took_ms = _finite(payload["app_e2e_ms"]) or 0.0
    return _time(payload["started_at"], default) + timedelta(milliseconds=took_ms)


def ingest_signed(envelope: object) -> bool:
    """A scenario result as a region worker sends it (signed, monitor.pipeline.signing)."""
    try:
        opened = signing.open_results(envelope, signing.KIND_SCENARIO_RESULT)
    except signing.Refused as exc:
        log.warning("refused a scenario result: %s", exc)
        count_rejected(1)
        return False
    stored = ingest_scenario(opened.body, from_region=opened.region_id, sealed_at=opened.sealed_at)
    return stored is not None


def ingest_scenario(
    data: object, *, from_region: int | None = None, sealed_at: datetime | None = None
) -> ScenarioResult | None:
    """Store one scenario result and its calls, fold it into the rollups, close its slot.
    `from_region`: the region whose key signed it (then only that region's open slots), and
    `sealed_at` when it signed it: one sealed after its slot's deadline is refused."""
    now = sealed_at or timezone.now()
    try:
        payload = scenario_payload_from_json(data)
    except ContractError as exc:
        log.warning("rejected a scenario result: %s", exc)
        count_rejected(1)
        return None
    with transaction.atomic():
        slot = _open_slot(payload, from_region, now)
        if slot is None:
            count_rejected(1)
            return None
        route = Route.objects.select_related("provider").get(pk=slot.route_id)
        case_id = payload["eval_case_id"]
        if case_id is not None and not EvalCase.objects.filter(pk=case_id).exists():
            case_id = None
        started_at = _time(payload["started_at"], now)
        scenario = ScenarioResult.objects.create(
            task_id=slot.task_id,
            route_id=slot.route_id,
            region_id=slot.region_id,
            slot_at=slot.slot_at,
            started_at=started_at,
            app_e2e_ms=_finite(payload["app_e2e_ms"]),
            calls_e2e_ms=_finite(payload["calls_e2e_ms"]),
            gaps_ms=[g for g in payload["gaps_ms"] if _finite(g) is not None],
            outcome=OUTCOME_OK if payload["outcome"] == OUTCOME_OK else "error",
            failed_step=payload["failed_step"],
            error_kind=payload["error_kind"][:30],
            error_detail=payload["error_detail"][:500],
            validation_ms=_finite(payload["validation_ms"]),
            validation_pass=payload["validation_pass"],
            eval_case_id=case_id,
            call_count=len(payload["calls"]),
        )
        rows = []
        for call in payload["calls"]:
            fixed: dict[str, Any] = {
                **call,
                "task_id": slot.task_id,
                "route_id": slot.route_id,
                "region_id": slot.region_id,
                "slot_at": None,
                "scenario_id": scenario.pk,
                "reference": False,
                "eval_case_id": None,
            }
            try:
                rows.append(row_from_payload(fixed, {route.pk: route}, now))
            except BadPayload as exc:
                log.warning("rejected a scenario call: %s", exc)
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        insert_rows(rows)
        totals = ProbeResult.objects.filter(scenario=scenario).aggregate(
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            cached_tokens=Sum("cached_tokens"),
            cost_usd=Sum("cost_usd"),
        )
        scenario.input_tokens = totals["input_tokens"] or 0
        scenario.output_tokens = totals["output_tokens"] or 0
        scenario.cached_tokens = totals["cached_tokens"]
        scenario.cost_usd = totals["cost_usd"] or Decimal("0")
        scenario.save(update_fields=["input_tokens", "output_tokens", "cached_tokens", "cost_usd"])
        if slot.status == SLOT_MISSED:
            # Recorded missed while the result was on its way (broker or ingest down), but
            # measured in time: the real result replaces the missed one, in the rollups too.
            take_back_missed((slot.task_id, slot.route_id, slot.region_id, slot.slot_at))
        ProbeSlot.objects.filter(pk=slot.pk).update(status=SLOT_DONE)
        row = rollup_writes.scenario_row(scenario)
        rollup_writes.apply([row])
        if from_region is not None:  # a live slot of the schedule (monitor.stats.health)
            health.count([row])
    return scenario


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def _time(value: str, default: datetime) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return default
