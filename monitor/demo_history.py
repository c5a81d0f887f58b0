"""Demo history: a week of results for the simulated routes, so a fresh demo shows every page at
once instead of empty charts for its first hour.

Made up, not measured. Each result is drawn from the simulated route's own model profile (the
simulator's TOML, simulator/configs/demo.toml) the way the simulator draws a response
(simulator.generation.plan): a lognormal queue around queue_ms, the uncached input tokens over
prefill_tokens_per_s, a decode rate with its per-request jitter, reasoning before the answer as
the model profile shapes the request (simulator.profiles), the provider's faults at their
configured rates; plus the region's round trip. Slots, option combinations and eval cases are
the scheduler's own (monitor.pipeline.beat.slots), at a sparser interval, and every result goes
through the real ingest path (monitor.pipeline.ingest.results.ingest), so rollups, hour strips and the
reference flags are what live probes make. Races go through monitor.pipeline.ingest.races.ingest.

A scenario task gets whole runs (hourly, and its last slots on its live schedule): its steps'
calls drawn one after another on the route as probes.scenario makes them (each call's input
the document plus the conversation so far, the step's token limit, the scenario's deadline
stopping a call that would overrun it), stored as monitor.pipeline.ingest.scenarios.ingest_scenario
stores one (a ScenarioResult, its calls as ProbeResult rows through ingest.insert_rows) and
folded into the rollups by `rollup_writes.scenario_row`, a day of them at a time.

Every row is marked `generated` (ProbeResult, RaceRun, ScenarioResult); pages say so and can
leave it out (monitor.pages.common.demo_history). It is never added to a database that holds a
measured result, and never twice. The history runs up to the moment it is made, so the
overview has fresh winners until live probes take over; a reader hiding it sees the rollup
pages from the next hour on (the current hour's rollups hold both).

The draws and payloads are monitor.demo_draws; the scenario runs monitor.demo_scenarios.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from monitor import partitions
from monitor.demo_draws import (
    Draw,
    Simulated,
    counterparts,
    draw,
    history_slot_times,
    payload,
    shape_for,
)
from monitor.demo_scenarios import ScenarioRuns, write_scenarios
from monitor.models import (
    OUTCOME_ERROR,
    OUTCOME_OK,
    EvalCase,
    OverviewSnapshot,
    ProbeResult,
    RaceRun,
    Region,
    Route,
    ScenarioResult,
    Task,
)
from monitor.pipeline.beat import races
from monitor.pipeline.beat.scheduling import active_eval_cases
from monitor.pipeline.beat.slots import assignment, options_for, phase_s, slot_number
from monitor.pipeline.ingest import races as ingest_races
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.messages import (
    LaneResult,
    RaceResult,
    ResultPayload,
    race_result_to_json,
    results_to_json,
)
from simulator.config import Config
from simulator.generation import Shape

log = logging.getLogger(__name__)


DAYS = 7


# Sparser than live probing (a week at the live rate would be half a million rows, minutes to
# write) but dense enough for every hourly chart point's median in each region.
PROBE_INTERVAL_S = 600
# Over its last RECENT, the history probes as a team probing every 5 minutes would: enough for
# the route page's 24 h chart to draw its p95 and p99 lines (p99 over 9 trailing hours at 12 an
# hour, monitor.pages.tails) from the first start, as live probing does once it has run.
RECENT = timedelta(hours=36)
RECENT_PROBE_INTERVAL_S = 300


RACE_INTERVAL_S = 7200


@dataclass(frozen=True)
class _Series:
    """One (task, route, region) probed through the history, as the scheduler would."""

    task: Task
    route: Route
    region: Region
    sim: Simulated
    shape: Shape
    variants: list[tuple[str, str, str, str]]
    reference: tuple[str, str, str, str]
    phase: float
    case_ids: list[int]

    @classmethod
    def of(
        cls, task: Task, route: Route, region: Region, sim: Simulated, cases: list[EvalCase]
    ) -> _Series:
        return cls(
            task=task,
            route=route,
            region=region,
            sim=sim,
            shape=shape_for(sim, route, task.max_tokens),
            variants=options_for(task, route.provider),
            reference=task.reference(route.provider),
            phase=phase_s(task.pk, route.pk, region.pk, PROBE_INTERVAL_S),
            case_ids=[c.pk for c in cases],
        )

    def payload_at(
        self, at: datetime, rtt_ms: float, rng: random.Random, interval_s: int = PROBE_INTERVAL_S
    ) -> ResultPayload:
        n = slot_number(at, self.phase, interval_s)
        variant, case_index = assignment(n, self.variants, self.reference, len(self.case_ids))
        case_id = self.case_ids[case_index] if self.case_ids else None
        d = draw(
            self.sim,
            self.shape,
            input_tokens=self.task.input_tokens,
            prefix_mode=variant[3],
            graded=case_id is not None,
            rtt_ms=rtt_ms,
            rng=rng,
        )
        return payload(
            d,
            task=self.task,
            route=self.route,
            region=self.region,
            at=at,
            variant=variant,
            eval_case_id=case_id,
            sim=self.sim,
        )


def has_real_data() -> bool:
    return (
        ProbeResult.objects.filter(generated=False).exists()
        or RaceRun.objects.filter(generated=False).exists()
        or ScenarioResult.objects.filter(generated=False).exists()
    )


def generate(
    config: Config,
    *,
    rtt_ms: Mapping[str, float] | None = None,
    now: datetime | None = None,
    days: int = DAYS,
    seed: int = 1,
) -> int:
    """Add `days` of demo history up to now; returns how many results were written (0: the database holds measured results, or history already)."""
    if has_real_data():
        log.info("demo history not added: the database holds measured results")
        return 0
    if ProbeResult.objects.filter(generated=True).exists():
        log.info("demo history not added: it is there already")
        return 0
    end = (now or timezone.now()).replace(microsecond=0)
    start = end - timedelta(days=days)
    rng = random.Random(seed)
    tasks = list(
        Task.objects.filter(is_active=True)
        .prefetch_related("routes__provider", "regions", "steps")
        .order_by("pk")
    )
    rtt = rtt_ms or {}
    series, runs = _plan(config, tasks, rtt)
    # The history's days get their partitions first (beat creates only the days ahead), so
    # each day is written and analyzed on its own, not into the default partition.
    for n in range(days + 1):
        partitions.create_day(start + timedelta(days=n))
    written, ran_total = _write_days(series, runs, start, end, rtt, rng)
    written_tail, ran_tail = _write_last_slots(series, runs, end, rtt, rng)
    written, ran_total = written + written_tail, ran_total + ran_tail
    raced = _races(tasks, config, start, end, rtt, rng)
    # An overview computed while the history was being written (an open page refreshing
    # itself) lacks most of it: drop it, so the next read has the whole history at once.
    OverviewSnapshot.objects.all().delete()
    log.info(
        "demo history: %d generated results (scenario calls included), %d scenario runs "
        "and %d races from %s to %s",
        written,
        ran_total,
        raced,
        start.isoformat(),
        end.isoformat(),
    )
    return written


def _plan(
    config: Config, tasks: list[Task], rtt: Mapping[str, float]
) -> tuple[list[_Series], list[ScenarioRuns]]:
    """What to generate: a series of single probes per (task, simulated route, region), and
    a scenario task's whole runs instead of single probes."""
    cases = active_eval_cases()
    series = []
    runs: list[ScenarioRuns] = []
    for task in tasks:
        routes = [r for r in task.routes.all() if r.is_active and r.provider.is_active]
        sims = counterparts(config, routes)
        for region in task.regions.filter(is_active=True).order_by("pk"):
            for route in routes:
                if route.pk not in sims:  # not a simulated route: no profile to draw from
                    continue
                sim, case_list = sims[route.pk], cases[task.pk]
                if task.is_scenario:
                    runs.append(ScenarioRuns.of(task, route, region, sim, case_list, rtt))
                else:
                    series.append(_Series.of(task, route, region, sim, case_list))
    return series, runs


def _write_days(
    series: list[_Series],
    runs: list[ScenarioRuns],
    start: datetime,
    end: datetime,
    rtt: Mapping[str, float],
    rng: random.Random,
) -> tuple[int, int]:
    """A day of every series at a time (each hourly rollup row is written once per batch);
    returns the results written (scenario calls included) and the scenario runs."""
    written = ran_total = 0
    chunk = timedelta(days=1)
    at = start
    while at < end:
        upto = min(at + chunk, end)
        pending = [
            s.payload_at(when, rtt.get(s.region.slug, 0.0), rng, interval)
            for s in series
            for when, interval in _slot_times(at, upto, end, s.phase)
        ]
        written += ingest.ingest(results_to_json(pending))
        due = [
            (r, when) for r in runs for when in history_slot_times(at, upto, r.phase, r.interval_s)
        ]
        ran, calls = write_scenarios(due, end, rng)
        ran_total, written = ran_total + ran, written + calls
        # Statistics for the days just written: the next day's exactly-once check reads them.
        partitions.analyze(at, upto)
        at = upto
    return written, ran_total


def _slot_times(
    start: datetime, upto: datetime, end: datetime, phase: float
) -> list[tuple[datetime, int]]:
    """A series' history slots in [start, upto), each with its interval: every
    PROBE_INTERVAL_S, then every RECENT_PROBE_INTERVAL_S over the history's last RECENT (on the
    same phase; the interval numbers the slot, which picks its options and eval case)."""
    recent = end - RECENT
    sparse = history_slot_times(start, min(upto, recent), phase, PROBE_INTERVAL_S)
    dense = history_slot_times(max(start, recent), upto, phase, RECENT_PROBE_INTERVAL_S)
    return [(at, PROBE_INTERVAL_S) for at in sparse] + [
        (at, RECENT_PROBE_INTERVAL_S) for at in dense
    ]


def _write_last_slots(
    series: list[_Series],
    runs: list[ScenarioRuns],
    end: datetime,
    rtt: Mapping[str, float],
    rng: random.Random,
) -> tuple[int, int]:
    """Each series' last slot on its live schedule: the figures are fresh (Task.stale_after)
    until live probes take over, however sparse the history before it. A scenario task's last
    runs: since its deadline plus an interval, so one has ended by now however long the route
    takes."""
    tail = []
    for one in series:
        interval = one.task.probe_interval_s
        phase = phase_s(one.task.pk, one.route.pk, one.region.pk, interval)
        since = end - timedelta(seconds=interval)
        tail += [
            one.payload_at(when, rtt.get(one.region.slug, 0.0), rng, interval)
            for when in history_slot_times(since, end, phase, interval)
        ]
    written = ingest.ingest(results_to_json(tail))
    ran, calls = write_scenarios([(r, at) for r in runs for at in r.last_slots(end)], end, rng)
    return written + calls, ran


def _races(
    tasks: list[Task],
    config: Config,
    start: datetime,
    end: datetime,
    rtt: Mapping[str, float],
    rng: random.Random,
) -> int:
    """Races every RACE_INTERVAL_S for tasks that race: each lane a draw with the task's
    reference options; the first valid answer wins, the others are cancelled at that moment
    (probes.race). Claimed and stored through monitor.pipeline.beat.races like live races."""
    due: list[tuple[Task, Region, datetime]] = []
    for task in tasks:
        if task.race_interval_s is None or task.is_scenario:
            continue
        for region in task.regions.filter(is_active=True).order_by("pk"):
            phase = phase_s(task.pk, 0, region.pk, RACE_INTERVAL_S)
            due.extend(
                (task, region, at) for at in history_slot_times(start, end, phase, RACE_INTERVAL_S)
            )
    claimed = races.claim(due)
    count = 0
    for task, region, at in claimed:
        routes = [r for r in task.routes.all() if r.is_active and r.provider.is_active]
        sims = counterparts(config, routes)
        draws = {
            route: draw(
                sims[route.pk],
                shape_for(sims[route.pk], route, task.max_tokens),
                input_tokens=task.input_tokens,
                prefix_mode=task.reference(route.provider)[3],
                graded=False,
                rtt_ms=rtt.get(region.slug, 0.0),
                rng=rng,
            )
            for route in routes
            if route.pk in sims
        }
        finished = {r: d for r, d in draws.items() if d.ok and d.e2e_ms is not None}
        winner = min(finished, key=lambda r: finished[r].e2e_ms or 0.0, default=None)
        winner_ms = finished[winner].e2e_ms if winner else None
        lanes: dict[str, LaneResult] = {}
        for route, d in draws.items():
            lanes[str(route.pk)] = _lane(route, d, winner, winner_ms, task)
        result: RaceResult = {
            "race": {"task_id": task.pk, "region_id": region.pk, "slot_at": at.isoformat()},
            "started_at": at.isoformat(),
            "winner_route_id": str(winner.pk) if winner else None,
            "winner_ms": winner_ms,
            "lanes": lanes,
        }
        count += ingest_races.ingest(race_result_to_json(result))
    with transaction.atomic():
        RaceRun.objects.filter(slot_at__gte=start, slot_at__lt=end).update(generated=True)
    return count


def _lane(
    route: Route, d: Draw, winner: Route | None, winner_ms: float | None, task: Task
) -> LaneResult:
    lane: LaneResult = {
        "elapsed_ms": d.e2e_ms,
        "cancelled": False,
        "tokens_paid": d.answer_tokens + d.reasoning_tokens,
        "saved_ms": None,
        "outcome": OUTCOME_OK if d.ok else OUTCOME_ERROR,
        "error_kind": d.error_kind,
        "input_tokens": task.input_tokens,
    }
    if winner_ms is None:
        return lane
    if route == winner:
        lane["saved_ms"] = 0.0
    elif d.ok and d.e2e_ms is not None and d.e2e_ms > winner_ms:
        # Stopped when the winner finished: it had streamed what it generated by then.
        started = d.ttft_ms if d.ttft_ms is not None else winner_ms
        generated = max(0.0, (winner_ms - started) / 1000.0 * d.tokens_per_s)
        lane["elapsed_ms"] = winner_ms
        lane["cancelled"] = True
        lane["tokens_paid"] = min(round(generated), d.answer_tokens + d.reasoning_tokens)
        lane["saved_ms"] = d.e2e_ms - winner_ms
        lane["outcome"] = "cancelled"
    return lane
