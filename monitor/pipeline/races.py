"""Races on a schedule: a task's request fired at all its routes at once from each region.

A task with `race_interval_s` races its candidate routes once per interval per region, at a
phase of its own. The lifecycle follows probe slots (monitor.pipeline.scheduling, ingest):
- dispatch: the RaceRun row is created by INSERT ... ON CONFLICT DO NOTHING on (task, region,
  slot_at); only the beat that created it sends the race to the region's queue (`plan` returns
  the message, monitor.tasks sends it), so two beats still race once;
- run: the region worker builds one probe per route from the same message and calls
  probes.race (the first complete answer that passes the task's grader wins, the rest are
  cancelled); the result travels back over the broker to the ingest queue;
- ingest: the row is filled in only while it is still `dispatched` (a redelivered result, or
  one that arrives after the sweep, changes nothing);
- sweep: a race with no result by its deadline is marked `missed`, never silently absent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from monitor.models import (
    GRAIN_HOUR,
    SLOT_DISPATCHED,
    SLOT_DONE,
    SLOT_MISSED,
    EvalCase,
    RaceRun,
    Region,
    Route,
    Task,
)
from monitor.pipeline import signing
from monitor.pipeline.ingest import INT_MAX, UNAVAILABLE, count_rejected, refusal
from monitor.pipeline.messages import (
    RUN_RACE,
    ContractError,
    Dispatch,
    RaceMessage,
    race_message_to_json,
    race_result_from_json,
)
from monitor.pipeline.slots import (
    Slot,
    expires_at,
    grace,
    phase_s,
    probe_message,
    slot_number,
    slot_times,
    starts_later,
)
from monitor.stats import rollups, spend

log = logging.getLogger(__name__)

# The reference for a cancelled lane's saving: its median e2e over this window, this region.
REFERENCE_WINDOW = timedelta(hours=24)


def deadline(task: Task, slot_at: datetime) -> datetime:
    return slot_at + timedelta(seconds=task.probe_timeout_s) + grace()


def _racing_routes(task: Task) -> list[Route]:
    return [r for r in task.routes.all() if r.is_active and r.provider.is_active]


def race_cost_estimate(
    task: Task, routes: list[Route], usage: spend.Usages | None = None
) -> Decimal:
    return spend.race_estimate_usd(task, routes, usage)


def due_races(now: datetime, committed: dict[int, Decimal]) -> list[tuple[Task, Region, datetime]]:
    """Races due now. `committed` (spent plus in flight per task) grows by each race's
    estimated cost as it is taken: a race that would pass the task's cap is not run."""
    tasks = Task.objects.filter(is_active=True, race_interval_s__isnull=False).prefetch_related(
        "routes__provider", "regions"
    )
    latest = {
        (r["task_id"], r["region_id"]): r["last"]
        for r in RaceRun.objects.values("task_id", "region_id").annotate(last=Max("slot_at"))
    }
    usage = spend.measured_usage(now)
    due = []
    for task in tasks:
        interval = task.race_interval_s
        assert interval is not None
        routes = _racing_routes(task)
        if len(routes) < 2:
            continue  # a race needs two lanes
        cost = race_cost_estimate(task, routes, usage)
        for region in task.regions.all():
            if not region.is_active:
                continue
            so_far = committed.get(task.pk, Decimal("0"))
            if task.monthly_spend_cap_usd is not None and (
                so_far + cost > task.monthly_spend_cap_usd
            ):
                break
            phase = phase_s(task.pk, 0, region.pk, interval)
            after = latest.get((task.pk, region.pk))
            # Races are not caught up after downtime: only the current one counts.
            times = slot_times(now, interval, phase, after)
            # A first race too late to get its whole deadline is not started.
            if times and not (after is None and starts_later(times[-1], now)):
                due.append((task, region, times[-1]))
                committed[task.pk] = so_far + cost
    return due


def claim(due: list[tuple[Task, Region, datetime]]) -> list[tuple[Task, Region, datetime]]:
    """Create the race rows; return only those this call created (another beat may have)."""
    if not due:
        return []
    row = "(%s, %s, %s, %s, 'dispatched', now(), '{}'::jsonb, 0, 0, 0)"
    sql = (
        "INSERT INTO monitor_racerun (task_id, region_id, slot_at, deadline_at, status, "
        "started_at, lanes, loser_tokens, loser_cost_usd, cost_usd) VALUES "
        + ", ".join([row] * len(due))
        + " ON CONFLICT DO NOTHING RETURNING task_id, region_id, slot_at"
    )
    params: list[Any] = []
    for task, region, at in due:
        params.extend([task.pk, region.pk, at, deadline(task, at)])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        created = {tuple(r) for r in cursor.fetchall()}
    return [(t, r, at) for t, r, at in due if (t.pk, r.pk, at) in created]


def reference_e2e_ms(task: Task, region: Region, now: datetime) -> dict[str, float]:
    """Each route's median e2e in this region over the last day, keyed by route id (str)."""
    qs = rollups.rows(since=now - REFERENCE_WINDOW, until=now, grain=GRAIN_HOUR).filter(
        task=task, region=region
    )
    out = {}
    for (route_id,), stats in rollups.stats_by(qs, ["route_id"]).items():
        p50 = stats.e2e_ms(50)
        if p50 is not None:
            out[str(route_id)] = p50
    return out


def race_message(
    task: Task, region: Region, at: datetime, cases: list[EvalCase], now: datetime
) -> RaceMessage:
    """One message for the region worker: a probe message per lane, all the same request."""
    assert task.race_interval_s is not None
    n = slot_number(at, phase_s(task.pk, 0, region.pk, task.race_interval_s), task.race_interval_s)
    return {
        "race": {"task_id": task.pk, "region_id": region.pk, "slot_at": at.isoformat()},
        "lanes": {
            str(route.pk): probe_message(Slot(task, route, region, at), cases, n=n)
            for route in _racing_routes(task)
        },
        "reference_ms": reference_e2e_ms(task, region, now),
        "timeout_s": task.probe_timeout_s,
    }


def plan(
    now: datetime, committed: dict[int, Decimal], cases: Mapping[int, list[EvalCase]]
) -> list[Dispatch]:
    """Claim due races; return one message to send for each (monitor.tasks sends them)."""
    with transaction.atomic():
        claimed = claim(due_races(now, committed))
    return [
        Dispatch(
            task_name=RUN_RACE,
            queue=region.queue_name,
            message=race_message_to_json(
                race_message(task, region, at, cases.get(task.pk, []), now)
            ),
            expires=expires_at(at, now),
            tally_key="races",
            tally=1,
        )
        for task, region, at in claimed
    ]


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
