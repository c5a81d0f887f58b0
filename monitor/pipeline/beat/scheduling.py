"""Which (task, route, region) slots are due, claimed once, and what to send for them.

Each (task, route, region) probes every `task.probe_interval_s` seconds, at a phase of its own
inside the interval (the arithmetic is monitor.pipeline.beat.slots). A slot is created by
INSERT ... ON CONFLICT DO NOTHING on its key, and only the beat that created it dispatches it:
two beats ticking at once still send each slot once. Slots the scheduler could not create
while it was down are created late and, once past their deadline, recorded missed by the
sweep, never silently absent (up to slots.MAX_CATCH_UP back).

Probe slots are claimed ahead of their time (settings.SCHEDULE_AHEAD_SECONDS, two ticks by
default) and sent at once; the region worker starts each probe at its slot's time. So a tick
that runs slow (a busy database) or a message that waits in a queue delays no probe and expires
no batch, as long as they take less than the look-ahead less one tick; the start lag measures the
region alone. Scenario slots are claimed when their time comes (a run starts as it arrives).

`plan(now)` returns the messages to send (monitor.pipeline.messages.Dispatch); monitor.tasks
sends them, so the scheduler never imports the tasks that import it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from monitor import limits
from monitor.models import EvalCase, ProbeSlot, Region, Task
from monitor.pipeline.beat import races, scenarios
from monitor.pipeline.beat.slots import (
    Slot,
    expires_at,
    in_time,
    phase_s,
    probe_message,
    slot_times,
    starts_later,
)
from monitor.pipeline.ingest.results import record_missed
from monitor.pipeline.messages import (
    RUN_PROBE_BATCH,
    Dispatch,
    ProbeBatch,
    probe_batch_to_json,
)
from monitor.stats import spend


def month_spend_by_task(now: datetime) -> dict[int, Decimal]:
    """What each task's ingested probes and finished races cost this month."""
    return spend.spent_by_task(now)


def latest_slots() -> dict[tuple[int, int, int], datetime]:
    """Each active (task, route, region)'s latest slot: one backward step of the slot key's
    index per combination, so a tick costs the same after a day or after 90 days of slots (a
    GROUP BY over the whole slot table grew with retention: 470M rows at 3,600 combinations
    a minute)."""
    routes = Task.routes.through._meta.db_table
    regions = Task.regions.through._meta.db_table
    sql = f"""
        SELECT tr.task_id, tr.route_id, tg.region_id,
          (SELECT s.slot_at FROM {ProbeSlot._meta.db_table} AS s
           WHERE s.task_id = tr.task_id AND s.route_id = tr.route_id
             AND s.region_id = tg.region_id
           ORDER BY s.slot_at DESC LIMIT 1)
        FROM {Task._meta.db_table} AS t
        JOIN {routes} AS tr ON tr.task_id = t.id
        JOIN {regions} AS tg ON tg.task_id = t.id
        WHERE t.is_active
    """
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return {(t, r, g): last for t, r, g, last in cursor.fetchall() if last is not None}


def due_slots(
    now: datetime, committed: dict[int, Decimal] | None = None, ahead_s: float = 0.0
) -> list[Slot]:
    """The slots to create now: those whose time has come, and a probe task's up to `ahead_s`
    ahead (a scenario's only once its time has come: it starts as it arrives). `committed`
    (spent plus in flight, per task; read here when not given) grows by each in-time slot's
    estimated cost as it is taken, so the cap holds within the tick: a task stops taking slots
    at the first that would pass its cap. Slots already too late to send (slots.in_time) cost
    nothing: `plan` records them missed unsent."""
    if committed is None:
        committed = spend.committed_by_task(now)
    tasks = Task.objects.filter(is_active=True).prefetch_related(
        "routes__provider", "regions", "steps"
    )
    latest = latest_slots()
    usage = spend.usage_if_capped(tasks, now)
    slots: list[Slot] = []
    ahead = timedelta(seconds=max(0.0, ahead_s))
    for task in tasks:
        capped = False
        horizon = now if task.is_scenario else now + ahead
        for route in task.routes.all():
            if capped:
                break
            if not (route.is_active and route.provider.is_active):
                continue
            cost = spend.cost_if_capped(task, partial(spend.probe_estimate_usd, task, route, usage))
            if spend.would_pass_cap(task, committed, cost):
                continue  # this route's probe would pass the cap; a cheaper one may not
            for region in task.regions.all():
                if not region.is_active or capped:
                    continue
                phase = phase_s(task.pk, route.pk, region.pk, task.probe_interval_s)
                after = latest.get((task.pk, route.pk, region.pk))
                for at in slot_times(horizon, task.probe_interval_s, phase, after):
                    if after is None and starts_later(at, now):
                        continue
                    if in_time(at, now):
                        if spend.would_pass_cap(task, committed, cost):
                            # Nothing more for this task this tick: the next tick sees the
                            # route capped (in flight counts) and creates none of its slots.
                            capped = True
                            break
                        committed[task.pk] = committed.get(task.pk, Decimal("0")) + cost
                    slots.append(Slot(task, route, region, at))
    return slots


def claim(slots: list[Slot]) -> list[Slot]:
    """Create the slots; return only those this call created (another beat may have)."""
    if not slots:
        return []
    # Five arrays, not five parameters a slot: a tick of thousands of slots stays one short
    # statement to parse (client and server).
    sql = (
        "INSERT INTO monitor_probeslot (task_id, route_id, region_id, slot_at, deadline_at, "
        "status, created_at) SELECT t, r, g, a, d, 'dispatched', now() FROM unnest("
        "%s::bigint[], %s::bigint[], %s::bigint[], %s::timestamptz[], %s::timestamptz[]) "
        "AS k(t, r, g, a, d) "
        "ON CONFLICT DO NOTHING RETURNING task_id, route_id, region_id, slot_at"
    )
    params: list[Any] = [
        [s.task.pk for s in slots],
        [s.route.pk for s in slots],
        [s.region.pk for s in slots],
        [s.slot_at for s in slots],
        [s.deadline_at for s in slots],
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        created = {tuple(r) for r in cursor.fetchall()}
    return [s for s in slots if (s.task.pk, s.route.pk, s.region.pk, s.slot_at) in created]


def active_eval_cases() -> dict[int, list[EvalCase]]:
    """Each active task's eval cases, in a stable order (a slot's number picks one)."""
    cases: dict[int, list[EvalCase]] = defaultdict(list)
    for case in EvalCase.objects.filter(is_active=True, task__is_active=True).order_by("pk"):
        cases[case.task_id].append(case)
    return cases


def plan(now: datetime | None = None, ahead_s: float | None = None) -> list[Dispatch]:
    """Claim the due slots (probe slots up to `ahead_s`, SCHEDULE_AHEAD_SECONDS unless
    given, ahead of their time) and races; return what to send for them: one batch per region,
    then one message per race. monitor.tasks sends them (this module never touches the
    broker), so a slot claimed here is sent by the tick that claimed it, or by nobody."""
    now = now or timezone.now()
    if ahead_s is None:
        ahead_s = float(settings.SCHEDULE_AHEAD_SECONDS)
    committed = spend.committed_if_capped(now)
    with transaction.atomic():
        claimed = claim(due_slots(now, committed, ahead_s))
        # Too late to make their deadline (the scheduler was down): recorded missed at once,
        # never sent, never paid for.
        late = [s for s in claimed if not in_time(s.slot_at, now)]
        record_missed(
            [(s.task.pk, s.route.pk, s.region.pk, s.slot_at) for s in late],
            now,
            "not sent: the slot was created too late for its probe deadline (scheduler down)",
        )
    cases = active_eval_cases()
    by_region: dict[Region, list[Slot]] = defaultdict(list)
    scenario_slots = []
    for slot in claimed:
        if not in_time(slot.slot_at, now):
            continue
        if slot.task.is_scenario:  # a whole application run each (monitor.pipeline.beat.scenarios)
            scenario_slots.append(slot)
        else:
            by_region[slot.region].append(slot)
    # Scenarios and races first, though sent after the batches: a batch's planned start is
    # stamped as it is made, and whatever the tick does after that (races.plan claims in the
    # database) would be start lag for the probes of slots whose time had already come.
    others = scenarios.dispatches(scenario_slots, cases, now) + races.plan(now, committed, cases)
    probes = {region: [probe_message(s, cases[s.task.pk]) for s in slots] for region, slots in by_region.items()}  # fmt: skip
    dispatches = []
    for region, slots in by_region.items():
        batch: ProbeBatch = {
            "region": region.slug,
            "probes": probes[region],
            # Each probe starts at its slot's time; those whose time has already come (a tick
            # that ran late, a scheduler catching up), spread over one tick from now. What each
            # probe's start lag is measured against (monitor.pipeline.region.worker.planned_starts).
            "planned_at": time.time(),
            "window_s": float(min(settings.TICK_SECONDS, limits.BATCH_SPREAD_MAX_S)),
            "at_slots": True,
        }
        dispatches.append(
            Dispatch(
                task_name=RUN_PROBE_BATCH,
                queue=region.queue_name,
                message=probe_batch_to_json(batch),
                # A worker that picks the batch up later could not finish before the deadlines.
                expires=expires_at(min(s.slot_at for s in slots)),
                tally_key=region.slug,
                tally=len(slots),
            )
        )
    return dispatches + others
