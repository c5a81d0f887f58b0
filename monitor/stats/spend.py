"""A task's probe spend this month, against its monthly cap.

What counts toward the cap: results ingested this month (their cost in the daily rollups),
races finished this month, and what is in flight: slots and races dispatched and not yet closed,
each at its estimated cost (the route's prices for the task's prompt size and the whole token
limit sent, so no probe can cost more than its estimate). The scheduler adds each probe's
estimate as it dispatches it within a tick (monitor.pipeline.scheduling), so a tick cannot
overshoot the cap either; every page reads `cap_states` to say why a capped task stopped.

In flight also holds what ran more often than it was dispatched. Ingest keeps one result a
slot, so a message a region worker ran twice (Celery's redelivery after a killed worker, or a
replay the broker's nonce claim missed: monitor.pipeline.replay) cost twice and shows once.
Each run after a message's first is reported by the worker that runs it, as it starts
(`record_reruns`, into the broker: region workers have no database), counted per region,
month, task and route in RERUNS_KEY, and added here at each probe's estimate for the rest of
the month (such a run is never ingested, so never spent: it is as good as the estimate gets).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db.models import Count, Sum
from django.utils import timezone

from monitor.models import (
    GRAIN_DAY,
    SLOT_DISPATCHED,
    SLOT_DONE,
    STEP_FAN_OUT,
    ProbeSlot,
    RaceRun,
    Region,
    Rollup,
    Route,
    Task,
)

log = logging.getLogger(__name__)

ZERO = Decimal("0")
# Probes run again, per region and month (UTC): a hash of "<task id>:<route id>" -> runs.
RERUNS_KEY = "rw:reruns:{region}:{month}"
# Kept past the month it counts, so the month's last reruns are still read at its end.
RERUNS_TTL_S = 40 * 86400


def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def probe_estimate_usd(task: Task, route: Route) -> Decimal:
    """The most one probe of this route can cost for this task: the prompt at its target size
    and the whole token limit sent (route.token_limit) as output. A scenario task's slot is
    every call of its steps (`scenario_estimate_usd`)."""
    if task.is_scenario:
        return scenario_estimate_usd(task, route)
    return route.cost_usd(task.input_tokens, route.token_limit(task.max_tokens))


def scenario_estimate_usd(task: Task, route: Route) -> Decimal:
    """Every call of a scenario's steps (a fan-out step is that many calls), each sent its
    step's document, the task's prompt size and, where the step carries the conversation, the
    earlier steps' whole answers; each answer at its whole token limit."""
    total, carried = ZERO, 0
    for step in task.steps.all():
        calls = step.fan_out if step.kind == STEP_FAN_OUT else 1
        prompt = step.input_tokens + task.input_tokens + (carried if step.carry_context else 0)
        limit = route.token_limit(step.max_tokens)
        total += route.cost_usd(prompt, limit) * calls
        carried += limit * calls
    return total


def race_estimate_usd(task: Task, routes: Iterable[Route]) -> Decimal:
    return sum((probe_estimate_usd(task, r) for r in routes), ZERO)


def _active_routes(task: Task) -> list[Route]:
    return [r for r in task.routes.all() if r.is_active and r.provider.is_active]


def spent_by_task(now: datetime) -> dict[int, Decimal]:
    """What this month's ingested probes and finished races cost, per task."""
    start = month_start(now)
    spent: dict[int, Decimal] = defaultdict(Decimal)
    rows = (
        Rollup.objects.filter(grain=GRAIN_DAY, region__isnull=True, bucket_start__gte=start)
        .values("task_id")
        .annotate(spent=Sum("cost_usd"))
    )
    for r in rows:
        spent[r["task_id"]] += r["spent"] or ZERO
    races = (
        RaceRun.objects.filter(slot_at__gte=start, status=SLOT_DONE)
        .values("task_id")
        .annotate(spent=Sum("cost_usd"))
    )
    for r in races:
        spent[r["task_id"]] += r["spent"] or ZERO
    return dict(spent)


def rerun_key(region: str, at: float) -> str:
    return RERUNS_KEY.format(region=region, month=time.strftime("%Y-%m", time.gmtime(at)))


def record_reruns(client: Any, region: str, slots: Iterable[tuple[int, int]], at: float) -> None:
    """A region worker's side: it is about to run these (task id, route id) probes again (a
    message it or another worker ran before). Raises the broker's errors."""
    counts: dict[str, int] = defaultdict(int)
    for task_id, route_id in slots:
        counts[f"{task_id}:{route_id}"] += 1
    if not counts:
        return
    key = rerun_key(region, at)
    with client.pipeline(transaction=True) as pipe:
        for name, n in counts.items():
            pipe.hincrby(key, name, n)
        pipe.expire(key, RERUNS_TTL_S)
        pipe.execute()


@cache
def _broker(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def reruns(now: datetime) -> dict[tuple[int, int], int]:
    """Probes run again this month, per (task id, route id), every region summed; nothing
    when the broker does not answer (logged: the cap then counts dispatched slots only)."""
    slugs = list(Region.objects.values_list("slug", flat=True))
    if not slugs:
        return {}
    at = now.timestamp()
    try:
        with _broker(settings.REDIS_URL).pipeline(transaction=False) as pipe:
            for slug in slugs:
                pipe.hgetall(rerun_key(slug, at))
            tables = pipe.execute()
    except redis.RedisError as exc:
        log.warning("probes run again are not counted in flight: the broker (%s)", exc)
        return {}
    out: dict[tuple[int, int], int] = defaultdict(int)
    for table in tables:
        for name, n in table.items():
            task_id, _, route_id = name.decode(errors="replace").partition(":")
            if task_id.isdigit() and route_id.isdigit() and n.isdigit():
                out[int(task_id), int(route_id)] += int(n)
    return dict(out)


def in_flight_by_task(now: datetime | None = None) -> dict[int, Decimal]:
    """Slots and races dispatched and not closed yet, and probes run again this month (see
    the module's docstring), at their estimated cost, per task."""
    open_slots = list(
        ProbeSlot.objects.filter(status=SLOT_DISPATCHED)
        .values("task_id", "route_id")
        .annotate(n=Count("id"))
    )
    open_races = list(
        RaceRun.objects.filter(status=SLOT_DISPATCHED).values("task_id").annotate(n=Count("id"))
    )
    again = reruns(now or timezone.now())
    task_ids = (
        {r["task_id"] for r in open_slots}
        | {r["task_id"] for r in open_races}
        | {task_id for task_id, _ in again}
    )
    if not task_ids:
        return {}
    # Steps too: a scenario task estimates every call (is_scenario reads them, no query each).
    tasks = Task.objects.prefetch_related("routes__provider", "steps").in_bulk(task_ids)
    routes = Route.objects.in_bulk({r["route_id"] for r in open_slots} | {r for _, r in again})
    out: dict[int, Decimal] = defaultdict(Decimal)
    for r in [*open_slots, *({"task_id": t, "route_id": r, "n": n} for (t, r), n in again.items())]:
        task, route = tasks.get(r["task_id"]), routes.get(r["route_id"])
        if task is not None and route is not None:
            out[task.pk] += probe_estimate_usd(task, route) * r["n"]
    for r in open_races:
        task = tasks.get(r["task_id"])
        if task is not None:
            out[task.pk] += race_estimate_usd(task, _active_routes(task)) * r["n"]
    return dict(out)


def committed_by_task(now: datetime) -> dict[int, Decimal]:
    """Spent plus in flight: what the cap is checked against before dispatching more."""
    committed: dict[int, Decimal] = defaultdict(Decimal, spent_by_task(now))
    for task_id, amount in in_flight_by_task(now).items():
        committed[task_id] += amount
    return dict(committed)


@dataclass
class CapState:
    """A capped task's month: what it spent, what is in flight, and what the cap stops."""

    task: Task
    cap_usd: Decimal
    spent_usd: Decimal
    in_flight_usd: Decimal
    paused_routes: list[Route] = field(default_factory=list)
    active_routes: int = 0

    @property
    def committed_usd(self) -> Decimal:
        return self.spent_usd + self.in_flight_usd

    @property
    def stopped(self) -> bool:
        """No route of the task can be probed again this month."""
        return self.active_routes > 0 and len(self.paused_routes) == self.active_routes

    @property
    def reason(self) -> str:
        """Why probing stopped (or partly stopped), for every page."""
        figures = (
            f"monthly spend cap ${self.cap_usd:,.2f} reached: ${self.spent_usd:,.4f} spent"
            + (f" and ${self.in_flight_usd:,.4f} in flight" if self.in_flight_usd else "")
            + " this month"
        )
        if self.stopped:
            return f"Probing stopped: {figures}; it resumes next month or with a higher cap."
        names = ", ".join(r.model_id for r in self.paused_routes)
        return f"Probing paused for {names}: {figures} (another probe would pass it)."


def cap_states(tasks: Iterable[Task], now: datetime) -> dict[int, CapState]:
    """The capped tasks among `tasks` that have at least one route paused by their cap."""
    capped = [t for t in tasks if t.monthly_spend_cap_usd is not None]
    if not capped:
        return {}
    spent = spent_by_task(now)
    in_flight = in_flight_by_task(now)
    out = {}
    for task in capped:
        assert task.monthly_spend_cap_usd is not None
        state = CapState(
            task=task,
            cap_usd=task.monthly_spend_cap_usd,
            spent_usd=spent.get(task.pk, ZERO),
            in_flight_usd=in_flight.get(task.pk, ZERO),
        )
        routes = _active_routes(task)
        state.active_routes = len(routes)
        state.paused_routes = [
            r for r in routes if state.committed_usd + probe_estimate_usd(task, r) > state.cap_usd
        ]
        if state.paused_routes:
            out[task.pk] = state
    return out
