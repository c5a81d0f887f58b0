"""Ingest's side of races (monitor.pipeline.beat.races tells the whole lifecycle): a race's
result fills in its row once, while the race is still dispatched; the sweep records the ones
with no result by their deadline missed.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import DatabaseError, transaction
from django.utils import timezone

from monitor.models import (
    SLOT_DISPATCHED,
    SLOT_DONE,
    SLOT_MISSED,
    RaceRun,
    Route,
    Task,
)
from monitor.pipeline import signing
from monitor.pipeline.ingest.results import UNAVAILABLE, count_rejected, refusal
from monitor.pipeline.ingest.rows import INT_MAX
from monitor.pipeline.messages import (
    ContractError,
    race_result_from_json,
)

log = logging.getLogger(__name__)


# Costs are stored as numeric(12, 6): a total that does not fit is capped there (it can only
# come from a token count no real race pays; the tokens themselves are capped at INT_MAX).
_COST_MAX = Decimal("999999.999999")


def _finite(value: float | None) -> float | None:
    """NaN and infinities are not JSON PostgreSQL accepts (jsonb), nor a measurement."""
    return value if value is None or math.isfinite(value) else None


def ingest_signed(envelope: object) -> bool:
    """A race result as a region worker sends it (signed, monitor.pipeline.signing): stored
    only when signed by its race's region and sealed by the race's deadline."""
    try:
        opened = signing.open_results(envelope, signing.KIND_RACE_RESULT)
    except signing.Refused as exc:
        log.warning("refused a race result: %s", exc)
        count_rejected(1)
        return False
    race = opened.body.get("race") if isinstance(opened.body, dict) else None
    if not isinstance(race, dict) or race.get("region_id") != opened.region_id:
        log.warning("refused a race result: signed by another region than its race's")
        count_rejected(1)
        return False
    return ingest(opened.body, sealed_at=opened.sealed_at)


def ingest(data: object, *, sealed_at: datetime | None = None) -> bool:
    """Store one race result from a region worker; False when the race was already closed,
    or when the result does not match the contract (logged and counted as ingest-rejected;
    the race is then recorded missed by the sweep). `sealed_at` (the broker path): when the
    worker signed it (signing.Opened); a race whose deadline had passed by then is closed."""
    try:
        result = race_result_from_json(data)
        key = result["race"]
        try:
            slot_at = datetime.fromisoformat(key["slot_at"])
            started_at = datetime.fromisoformat(result["started_at"])
        except ValueError:  # its message quotes the value
            raise ContractError(
                "race result: slot_at or started_at is not an ISO 8601 time"
            ) from None
    except ContractError as exc:
        log.warning("rejected a race result: %s", exc)
        count_rejected(1)
        return False
    lanes = result["lanes"]
    # Lane names are route ids; one that is not a bigint names no route (and prices nothing).
    prices = {
        str(r.pk): r
        for r in Route.objects.filter(
            pk__in=[int(k) for k in lanes if k.isdigit() and len(k) <= 18]
        )
    }
    task = Task.objects.filter(pk=key["task_id"]).first()
    winner = result["winner_route_id"]
    total = loser_cost = Decimal("0")
    loser_tokens = 0
    stored: dict[str, dict[str, Any]] = {}
    for route_id, lane in lanes.items():
        route = prices.get(route_id)
        tokens = min(max(lane["tokens_paid"], 0), INT_MAX)
        input_tokens = lane["input_tokens"]
        if input_tokens is None or not 0 <= input_tokens <= INT_MAX:
            input_tokens = task.input_tokens if task else 0
        cost = min(route.cost_usd(input_tokens, tokens), _COST_MAX) if route else Decimal("0")
        stored[route_id] = {
            **{k: _finite(v) if isinstance(v, float) else v for k, v in lane.items()},
            "tokens_paid": tokens,
            "cost_usd": float(cost),
        }
        total += cost
        if route_id != str(winner):
            loser_cost += cost
            loser_tokens += tokens
    try:
        with transaction.atomic():
            open_race = RaceRun.objects.filter(
                task_id=key["task_id"],
                region_id=key["region_id"],
                slot_at=slot_at,
                status=SLOT_DISPATCHED,
            )
            if sealed_at is not None:  # sealed after the deadline: too late
                open_race = open_race.filter(deadline_at__gte=sealed_at)
            updated = open_race.update(
                status=SLOT_DONE,
                started_at=started_at,
                winner_id=int(winner) if winner and winner in prices else None,
                winner_ms=_finite(result["winner_ms"]),
                lanes=stored,
                loser_tokens=min(loser_tokens, INT_MAX),
                loser_cost_usd=min(loser_cost, _COST_MAX),
                cost_usd=min(total, _COST_MAX),
            )
    except UNAVAILABLE:
        raise  # retried by the ingest task (monitor.tasks), not a refusal
    except DatabaseError as exc:
        log.warning("rejected race result %s: the database refused it (%s)", key, refusal(exc))
        count_rejected(1)
        return False
    if not updated:
        log.info("race result for a closed race ignored: %s", key)
    return bool(updated)


def sweep_missed(now: datetime | None = None) -> int:
    """Races with no result by their deadline are recorded missed."""
    now = now or timezone.now()
    return RaceRun.objects.filter(status=SLOT_DISPATCHED, deadline_at__lt=now).update(
        status=SLOT_MISSED
    )
