"""Races on a schedule: a task's request fired at all its routes at once from each region.

A task with `race_interval_s` races its candidate routes once per interval per region, at a
phase of its own. The lifecycle follows probe slots (monitor.pipeline.beat.scheduling,
monitor.pipeline.ingest):
- dispatch: the RaceRun row is created by INSERT ... ON CONFLICT DO NOTHING on (task, region,
  slot_at); only the beat that created it sends the race to the region's queue (`plan` returns
  the message, monitor.tasks sends it), so two beats still race once;
- run: the region worker builds one probe per route from the same message and calls
  probes.race (the first complete answer that passes the task's grader wins, the rest are
  cancelled); the result travels back over the broker to the ingest queue;
- ingest: the row is filled in only while it is still `dispatched` (a redelivered result, or
  one that arrives after the sweep, changes nothing);
- sweep: a race with no result by its deadline is marked `missed`, never silently absent.

This module is the beat's side (due, claim, the message); the region worker runs a race in
monitor.pipeline.region.worker, ingest stores it in monitor.pipeline.ingest.races.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.db.models import Max

from monitor.models import (
    GRAIN_HOUR,
    EvalCase,
    RaceRun,
    Region,
    Route,
    Task,
)
from monitor.pipeline.beat.slots import (
    Slot,
    expires_at,
    grace,
    phase_s,
    probe_message,
    slot_number,
    slot_times,
    starts_later,
)
from monitor.pipeline.messages import (
    RUN_RACE,
    Dispatch,
    RaceMessage,
    race_message_to_json,
)
from monitor.stats import rollups, spend

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
    tasks = list(
        Task.objects.filter(is_active=True, race_interval_s__isnull=False).prefetch_related(
            "routes__provider", "regions"
        )
    )
    latest = {
        (r["task_id"], r["region_id"]): r["last"]
        for r in RaceRun.objects.values("task_id", "region_id").annotate(last=Max("slot_at"))
    }
    usage = spend.usage_if_capped(tasks, now)
    due = []
    for task in tasks:
        interval = task.race_interval_s
        assert interval is not None
        routes = _racing_routes(task)
        if len(routes) < 2:
            continue  # a race needs two lanes
        cost = spend.cost_if_capped(task, partial(race_cost_estimate, task, routes, usage))
        for region in task.regions.all():
            if not region.is_active:
                continue
            if spend.would_pass_cap(task, committed, cost):
                break
            phase = phase_s(task.pk, 0, region.pk, interval)
            after = latest.get((task.pk, region.pk))
            # Races are not caught up after downtime: only the current one counts.
            times = slot_times(now, interval, phase, after)
            # A first race too late to get its whole deadline is not started.
            if times and not (after is None and starts_later(times[-1], now)):
                due.append((task, region, times[-1]))
                committed[task.pk] = committed.get(task.pk, Decimal("0")) + cost
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
            expires=expires_at(at),
            tally_key="races",
            tally=1,
        )
        for task, region, at in claimed
    ]
