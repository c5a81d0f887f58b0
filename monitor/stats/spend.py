"""A task's probe spend this month, against its monthly cap.

What counts toward the cap: results ingested this month (their cost in the daily rollups),
races finished this month, and what is in flight: slots and races dispatched and not yet closed,
each at its estimated cost. Generated demo history (ProbeResult.generated, RaceRun.generated)
was never paid for: it is taken back out of the rollups' cost and never counts.

A probe's estimate is what the route's own recent probes of the task used (`Usage`, from the
hourly rollups of the last USAGE_WINDOW, regions merged): their mean input, cached input and
billed output tokens (reasoning included, hidden or not) per successful probe (a scenario
task's rollup rows are whole runs, so per run), at the route's current prices. Only where a
route has fewer than MIN_USAGE_PROBES such probes is it priced at its worst case: the prompt
at its target size and the whole token limit sent as output. The worst case priced hidden
reasoning routes 8 to 28 times over (a token limit with 25,000 tokens of room), and a route
whose visible reasoning is not bounded by the limit overran it. Hours up to the end of
generated demo history are not read: a route's usage is measured, never drawn.

At ingest a slot closes and its estimate leaves in flight as its real cost enters the rollups:
the cap then holds the real figure (reconciled per slot, so an estimate's error lasts only
while its probe runs). The scheduler adds each probe's estimate as it dispatches it within a
tick (monitor.pipeline.beat.scheduling), so a tick cannot overshoot the cap by more than its
probes' estimates' error; every page reads `cap_states` to say why a capped task stopped.

In flight also holds what ran more often than it was dispatched. Ingest keeps one result a
slot, so a message a region worker ran twice (Celery's redelivery after a killed worker, or a
replay the broker's nonce claim missed: monitor.pipeline.region.replay) cost twice and shows once.
Each run after a message's first is reported by the worker that runs it, as it starts
(`record_reruns`, into the broker: region workers have no database), counted per region,
month, task and route in RERUNS_KEY, and added here at each probe's estimate for the rest of
the month (such a run is never ingested, so never spent: it is as good as the estimate gets).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db import connection
from django.db.models import Count, Sum
from django.utils import timezone

from monitor.models import (
    GRAIN_DAY,
    GRAIN_HOUR,
    SLOT_DISPATCHED,
    SLOT_DONE,
    STEP_FAN_OUT,
    GeneratedSpan,
    ProbeResult,
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


# A route's recent usage is read over this window of hourly rollups...
USAGE_WINDOW = timedelta(hours=24)
# ...and used once it holds this many successful probes (scenario runs); the worst case before.
MIN_USAGE_PROBES = 3


@dataclass(frozen=True)
class Usage:
    """What a route's recent successful probes of a task used, each on average (a scenario
    task's: each run, all its calls)."""

    probes: int
    input_tokens: float
    cached_tokens: float
    output_tokens: float  # billed: the answer and the reasoning, streamed or hidden

    def cost_usd(self, route: Route) -> Decimal:
        return route.cost_usd(
            round(self.input_tokens), round(self.output_tokens), round(self.cached_tokens)
        )


Usages = dict[tuple[int, int], Usage]

_USAGE_SQL = f"""
SELECT task_id, route_id, sum(count_ok), sum(input_tokens), sum(cached_tokens),
       sum(output_tokens)
FROM {Rollup._meta.db_table}
WHERE grain = %s AND region_id IS NULL AND bucket_start >= %s
  AND bucket_start > coalesce(
      (SELECT date_trunc('hour', last) FROM {GeneratedSpan._meta.db_table}), '-infinity')
GROUP BY task_id, route_id
HAVING sum(count_ok) >= %s
"""


def measured_usage(now: datetime) -> Usages:
    """Per (task id, route id), the mean usage of its successful probes over the last
    USAGE_WINDOW of hourly rollups (regions merged), after the hour the generated demo history
    ended in (rollups do not tell drawn results from measured ones: a demo's first live hour
    is priced at the worst case). Failed probes' tokens count in the sums (a probe that
    streamed then broke was billed) but not in the divisor, which errs high. Pairs with fewer
    than MIN_USAGE_PROBES are left out. One query."""
    with connection.cursor() as cursor:
        cursor.execute(_USAGE_SQL, [GRAIN_HOUR, now - USAGE_WINDOW, MIN_USAGE_PROBES])
        rows = cursor.fetchall()
    return {
        (task_id, route_id): Usage(
            probes=n,
            input_tokens=int(inp or 0) / n,
            cached_tokens=int(cached or 0) / n,
            output_tokens=int(out or 0) / n,
        )
        for task_id, route_id, n, inp, cached, out in rows
    }


def probe_estimate_usd(task: Task, route: Route, usage: Usages | None = None) -> Decimal:
    """What one probe of this route is expected to cost for this task: its recent measured
    usage in `usage` (measured_usage) at the route's prices; where there is none, the most it
    can cost (`worst_case_usd`)."""
    measured = (usage or {}).get((task.pk, route.pk))
    if measured is not None:
        return measured.cost_usd(route)
    return worst_case_usd(task, route)


def worst_case_usd(task: Task, route: Route) -> Decimal:
    """The most one probe can cost when nothing is measured yet: the prompt at its target size
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


def race_estimate_usd(task: Task, routes: Iterable[Route], usage: Usages | None = None) -> Decimal:
    return sum((probe_estimate_usd(task, r, usage) for r in routes), ZERO)


def _active_routes(task: Task) -> list[Route]:
    return [r for r in task.routes.all() if r.is_active and r.provider.is_active]


def spent_by_task(now: datetime) -> dict[int, Decimal]:
    """What this month's ingested probes and finished races cost, per task; generated demo
    history never counts (`generated_by_task`)."""
    start = month_start(now)
    spent: dict[int, Decimal] = defaultdict(Decimal)
    rows = (
        Rollup.objects.filter(grain=GRAIN_DAY, region__isnull=True, bucket_start__gte=start)
        .values("task_id")
        .annotate(spent=Sum("cost_usd"))
    )
    for r in rows:
        spent[r["task_id"]] += r["spent"] or ZERO
    for task_id, drawn in generated_by_task(start).items():
        spent[task_id] -= drawn
    races = (
        RaceRun.objects.filter(slot_at__gte=start, status=SLOT_DONE, generated=False)
        .values("task_id")
        .annotate(spent=Sum("cost_usd"))
    )
    for r in races:
        spent[r["task_id"]] += r["spent"] or ZERO
    return {task_id: max(amount, ZERO) for task_id, amount in spent.items()}


def generated_by_task(since: datetime) -> dict[int, Decimal]:
    """The cost the generated demo history's results since `since` put into the rollups (a
    scenario's rollup row costs its calls, which are these rows too), per task: taken back out
    of the month's spend. Only read when there is generated history this month (GeneratedSpan),
    through the generated results' partial index. Raw results are kept RAW_RETENTION_DAYS
    (90 by default), longer than a month."""
    if not GeneratedSpan.objects.filter(last__gte=since).exists():
        return {}
    rows = (
        ProbeResult.objects.filter(generated=True, started_at__gte=since)
        .values("task_id")
        .annotate(drawn=Sum("cost_usd"))
    )
    return {r["task_id"]: r["drawn"] or ZERO for r in rows}


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
    now = now or timezone.now()
    again = reruns(now)
    task_ids = (
        {r["task_id"] for r in open_slots}
        | {r["task_id"] for r in open_races}
        | {task_id for task_id, _ in again}
    )
    if not task_ids:
        return {}
    # Steps too: a scenario task estimates every call (is_scenario reads them, no query each).
    tasks = Task.objects.prefetch_related("routes__provider", "steps").in_bulk(task_ids)
    # The tasks' routes came with them; a route no longer one of its task's is read apart.
    routes = {r.pk: r for t in tasks.values() for r in t.routes.all()}
    others = ({r["route_id"] for r in open_slots} | {r for _, r in again}) - routes.keys()
    if others:
        routes.update(Route.objects.in_bulk(others))
    usage = measured_usage(now)
    out: dict[int, Decimal] = defaultdict(Decimal)
    for r in [*open_slots, *({"task_id": t, "route_id": r, "n": n} for (t, r), n in again.items())]:
        task, route = tasks.get(r["task_id"]), routes.get(r["route_id"])
        if task is not None and route is not None:
            out[task.pk] += probe_estimate_usd(task, route, usage) * r["n"]
    for r in open_races:
        task = tasks.get(r["task_id"])
        if task is not None:
            out[task.pk] += race_estimate_usd(task, _active_routes(task), usage) * r["n"]
    return dict(out)


def committed_by_task(now: datetime) -> dict[int, Decimal]:
    """Spent plus in flight: what the cap is checked against before dispatching more."""
    committed: dict[int, Decimal] = defaultdict(Decimal, spent_by_task(now))
    for task_id, amount in in_flight_by_task(now).items():
        committed[task_id] += amount
    return dict(committed)


# The gate the scheduler and the races share. Costs matter only to a task with a cap: without
# one, nothing is read and nothing is priced (the month's rollups, the open slots and the
# recent usage: three reads a tick, 0.03 cores at bench-load's 1x for no slot).


def committed_if_capped(now: datetime) -> dict[int, Decimal]:
    """`committed_by_task`, read only when an active task has a cap (else empty)."""
    if Task.objects.filter(is_active=True, monthly_spend_cap_usd__isnull=False).exists():
        return committed_by_task(now)
    return {}


def usage_if_capped(tasks: Iterable[Task], now: datetime) -> Usages:
    """`measured_usage`, read only when one of `tasks` has a cap (else empty)."""
    if any(t.monthly_spend_cap_usd is not None for t in tasks):
        return measured_usage(now)
    return {}


def cost_if_capped(task: Task, estimate: Callable[[], Decimal]) -> Decimal:
    """What to count against the task's cap for one more dispatch: `estimate()`, priced only
    when the task has a cap (else 0)."""
    return ZERO if task.monthly_spend_cap_usd is None else estimate()


def would_pass_cap(task: Task, committed: Mapping[int, Decimal], cost: Decimal) -> bool:
    """Would `cost` more, on top of what is committed (spent plus in flight), take the task
    past its monthly cap? Never for a task without one."""
    cap = task.monthly_spend_cap_usd
    return cap is not None and committed.get(task.pk, ZERO) + cost > cap


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
    usage = measured_usage(now)
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
            r
            for r in routes
            if state.committed_usd + probe_estimate_usd(task, r, usage) > state.cap_usd
        ]
        if state.paused_routes:
            out[task.pk] = state
    return out
