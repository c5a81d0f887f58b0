"""The board: per task and region, the fastest qualifying route (monitor.answer.selection.decide)
and its runner-up, with their figures. The overview page, the read API (monitor.api) and
/metrics read it; beat rebuilds it (refresh), which is the one writer of the winner's history
(monitor.answer.winners): a reader that finds the board old rebuilds it without recording.

Everything comes from the rollups (monitor.stats.rollups): one query for the window's rows of all
tasks, merged in memory per (task, route, region) and per (task, route) for quality. The
result is plain data (no model instances), so it can be kept as a snapshot and read back in
one small query (see SNAPSHOT_KEY).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.template.loader import render_to_string
from django.utils import timezone

from monitor.answer import selection, winners
from monitor.models import (
    HEARTBEAT_TICK,
    LATENCY_METRICS,
    METRIC_E2E_P95,
    METRIC_TTFT_P95,
    STATUS_NEAR,
    STATUS_OK,
    STATUS_OVER,
    STATUS_UNKNOWN,
    Heartbeat,
    OverviewSnapshot,
    Region,
    Task,
    WinnerChange,
    fresh_within,
)
from monitor.stats.rollups import Stats

WINDOW = timedelta(hours=24)


@dataclass
class TaskInfo:
    """What the overview shows of a task's configuration."""

    slug: str
    name: str
    latency_class: str  # display labels
    latency_metric: str  # the ranking metric's label (the class default resolved)
    min_pass_rate: float | None
    min_quality_index: float | None
    ttft_p95_budget_ms: int | None
    e2e_p95_budget_ms: int | None
    max_error_rate: float = 0.0  # the availability bar (Task.error_ceiling)
    metric: str = ""  # the ranking metric's key (the read API names it)

    @classmethod
    def of(cls, task: Task) -> TaskInfo:
        return cls(
            slug=task.slug,
            name=task.name,
            latency_class=task.get_latency_class_display(),
            latency_metric=metric_label(task.ranking_metric()),
            metric=task.ranking_metric(),
            min_pass_rate=task.min_pass_rate,
            max_error_rate=task.error_ceiling(),
            min_quality_index=task.min_quality_index,
            ttft_p95_budget_ms=task.ttft_p95_budget_ms,
            e2e_p95_budget_ms=task.e2e_p95_budget_ms,
        )


@dataclass
class Ranked:
    """A route the board names (the winner or the runner-up), with its figures in the region:
    the one shape both share (the read API's FiguresJSON)."""

    route_id: int
    label: str
    # The ranking metric over the reference probes, with its 95% interval (None: no end).
    metric_ms: float | None
    metric_low_ms: float | None
    metric_high_ms: float | None
    samples: int
    # Pass rate, all regions, and its 95% Wilson interval (graded 0: not graded).
    passed: int
    graded: int
    pass_low: float | None
    pass_high: float | None
    # Availability here: the provider's failures out of its attempts, with its 95% interval
    # (the bar needs the whole interval above the ceiling).
    errors: int
    attempts: int
    errors_low: float | None = None
    errors_high: float | None = None
    # Slots our workers missed for it here: ours, never its errors.
    missed: int = 0

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.graded if self.graded else None

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.attempts if self.attempts else None

    @classmethod
    def of(cls, c: selection.Candidate, stats: Stats | None) -> Ranked:
        rate = c.pass_rate
        return cls(
            route_id=c.route.pk,
            label=str(c.route),
            metric_ms=c.metric.point,
            metric_low_ms=c.metric.low,
            metric_high_ms=c.metric.high,
            samples=c.metric.n,
            passed=rate.k if rate else 0,
            graded=rate.n if rate else 0,
            pass_low=rate.low if rate else None,
            pass_high=rate.high if rate else None,
            errors=c.errors.k,
            attempts=c.errors.n,
            errors_low=c.errors.low,
            errors_high=c.errors.high,
            missed=stats.count_missed if stats else 0,
        )


@dataclass
class Cell:
    """One task in one region: its fastest qualifying route (None: none qualifies, and
    `reason` says why, for the task as a whole) and the runner-up, with the winner's latency
    figures in the region."""

    region_slug: str
    region_name: str
    winner: Ranked | None
    runner_up: Ranked | None
    reason: str
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tps_p50: float | None
    e2e_p95_ms: float | None
    last_probe_at: datetime | None
    stale_after_s: float
    ttft_status: str
    e2e_status: str
    tied: list[str] = field(default_factory=list)  # routes within noise of the winner
    tied_ids: list[int] = field(default_factory=list)
    winner_since: datetime | None = None
    why: str = ""  # why this route is the winner (the change that made it)
    stale: bool = True  # set against the time of the read (see `Overview.at`)
    silence: str = ""  # a stale winner's silence in facts (selection.Candidate.silence)

    @property
    def route_id(self) -> int | None:
        return self.winner.route_id if self.winner else None

    @property
    def route_label(self) -> str:
        return self.winner.label if self.winner else ""

    @property
    def overall_status(self) -> str:
        if self.stale or self.winner is None:
            return STATUS_UNKNOWN
        statuses = {self.ttft_status, self.e2e_status}
        for s in (STATUS_OVER, STATUS_NEAR, STATUS_OK):
            if s in statuses:
                return s
        return STATUS_UNKNOWN


@dataclass
class TaskRow:
    task: TaskInfo
    cells: list[Cell]


@dataclass
class Overview:
    rows: list[TaskRow]
    built_at: datetime
    # The rows as the page shows them, rendered when beat builds the snapshot: the overview
    # refreshes itself in every open tab, and rendering 120 cells was most of a read's time.
    # Its relative times and stale badges are as of built_at (the page says so).
    rows_html: str = ""

    def at(self, now: datetime) -> Overview:
        """Staleness depends on the time of the read, not of the build."""
        for row in self.rows:
            for cell in row.cells:
                stale_after = timedelta(seconds=cell.stale_after_s)
                cell.stale = not fresh_within(cell.last_probe_at, now, stale_after)
        return self

    def to_json(self) -> dict[str, Any]:
        rows = [asdict(r) for r in self.rows]
        for row in rows:
            for cell in row["cells"]:
                for name in ("last_probe_at", "winner_since"):
                    when = cell[name]
                    cell[name] = when.isoformat() if when else None
        return {"built_at": self.built_at.isoformat(), "rows": rows, "rows_html": self.rows_html}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Overview:
        rows = []
        for row in data["rows"]:
            cells = []
            for cell in row["cells"]:
                for name in ("last_probe_at", "winner_since"):
                    when = cell.get(name)
                    cell[name] = datetime.fromisoformat(when) if when else None
                for name in ("winner", "runner_up"):
                    cell[name] = Ranked(**cell[name]) if cell.get(name) else None
                cells.append(Cell(**cell))
            rows.append(TaskRow(task=TaskInfo(**row["task"]), cells=cells))
        return cls(
            rows=rows,
            built_at=datetime.fromisoformat(data["built_at"]),
            rows_html=data.get("rows_html", ""),
        )


def metric_label(metric: str) -> str:
    return dict(LATENCY_METRICS).get(metric, metric)


Decision = tuple[winners.Key, selection.Choice]


def build(
    now: datetime | None = None, window: timedelta = WINDOW, *, since: datetime | None = None
) -> Overview:
    """Compute the overview from the rollups (the work a snapshot saves each reader): over
    `window` before now, or from `since` (an hour's start: the hidden demo history's end, which
    may still be ahead of now, and then nothing is read)."""
    now = now or timezone.now()
    return _build(now, window, since=since)[0]


def _build(
    now: datetime, window: timedelta, *, keep_settled: bool = False, since: datetime | None = None
) -> tuple[Overview, list[Decision]]:
    since = since if since is not None else now - window
    tasks = list(
        Task.objects.filter(is_active=True).prefetch_related("routes__provider", "regions", "steps")
    )
    figures = selection.Window.read(since, now + timedelta(hours=1), keep_settled=keep_settled)
    held = winners.latest()
    rows: list[TaskRow] = []
    decisions: list[Decision] = []
    for task in tasks:
        routes = [r for r in task.routes.all() if r.is_active]
        quality = figures.quality(task, routes)
        ttft_basis = task.ttft_budget_metric(routes)
        cells = []
        regions = list(task.regions.all())
        latency_in = {g.pk: figures.latency(task, routes, g) for g in regions}
        # The task's stale routes' missed slots, every region's in one read.
        missed = selection.missed_in_regions(
            task,
            {g.pk: selection.quiet_routes(task, routes, latency_in[g.pk], now) for g in regions},
            now,
        )
        for region in regions:
            latency = latency_in[region.pk]
            last_change = held.get((task.pk, region.pk))
            choice = selection.decide(
                task,
                routes,
                latency,
                quality,
                region=region,
                now=now,
                incumbent=last_change.route_id if last_change else None,
                missed=missed.get(region.pk, {}),
            )
            decisions.append(((task.pk, region.pk), choice))
            cells.append(_cell(task, region, choice, latency, ttft_basis, now, last_change))
        rows.append(TaskRow(task=TaskInfo.of(task), cells=cells))
    return Overview(rows=rows, built_at=now).at(now), decisions


def _cell(
    task: Task,
    region: Region,
    choice: selection.Choice,
    latency: dict[int, Stats],
    ttft_basis: str,
    now: datetime,
    last_change: WinnerChange | None,
) -> Cell:
    winner, runner = choice.winner, choice.runner_up
    stats = latency.get(winner.route.pk) if winner else None
    # The winner's own last probe: a stale winner reads stale beside fresh routes.
    last = (
        stats.last_probe_at
        if stats is not None
        else max((s.last_probe_at for s in latency.values() if s.last_probe_at), default=None)
    )
    if winner is None:
        why, since = "", None  # choice.reason says why, for the task as a whole
    elif choice.changed or last_change is None:
        why, since = choice.change, now
    else:
        why, since = last_change.reason, last_change.at
    return Cell(
        region_slug=region.slug,
        region_name=region.name,
        winner=Ranked.of(winner, stats) if winner else None,
        runner_up=Ranked.of(runner, latency.get(runner.route.pk)) if runner else None,
        reason=choice.reason,
        ttft_p50_ms=stats.ttft_ms(50) if stats else None,
        ttft_p95_ms=stats.metric(ttft_basis, reference=True) if stats else None,
        tps_p50=stats.tps(50) if stats else None,
        e2e_p95_ms=stats.metric(METRIC_E2E_P95, reference=True) if stats else None,
        last_probe_at=last,
        stale_after_s=task.stale_after().total_seconds(),
        ttft_status=task.budget_status(
            METRIC_TTFT_P95, stats.metric(ttft_basis, reference=True) if stats else None
        ),
        e2e_status=task.budget_status(
            METRIC_E2E_P95, stats.metric(METRIC_E2E_P95, reference=True) if stats else None
        ),
        tied=[str(c.route) for c in choice.candidates if c.tied],
        tied_ids=[c.route.pk for c in choice.candidates if c.tied],
        winner_since=since,
        why=why,
        silence=winner.silence if winner else "",
    )


# The overview is the same for every reader and refreshes itself in every open tab, so it is
# computed once, stored as a snapshot, and read ready-made: beat rebuilds it every half
# refresh interval (monitor.tasks.refresh_overview); a reader that finds it older than the
# refresh interval rebuilds it itself when beat is not ticking (down, first start), and a
# configuration change drops it (monitor.apps). While beat ticks, its rebuild is running late
# (at 3x the bench's load it took 6.7 s, every 7.5 s): up to LATE_REFRESHES intervals readers
# get the snapshot, which says when it was built, instead of each rebuilding it for seconds.
SNAPSHOT_KEY = "overview"
LATE_REFRESHES = 4
# One rebuild at a time, beat's or a reader's (a PostgreSQL advisory lock, held by the
# rebuilding session, so a killed worker releases it). While one runs, the snapshot stays old
# and every ask would find it due: at the realistic mix's 1x, four ran at once on the ingest
# workers for 70-130 s each, and readers rebuilt it for seconds each. Readers get the old
# snapshot (it says when it was built) while a rebuild runs, up to REBUILDING_MAX.
REBUILD_LOCK = 0x52570001
REBUILDING_MAX = timedelta(minutes=10)


@contextmanager
def rebuilding() -> Iterator[bool]:
    """Take the rebuild lock if no one holds it: yields whether this session has it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [REBUILD_LOCK])
        mine = bool(cursor.fetchone()[0])
    try:
        yield mine
    finally:
        if mine:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [REBUILD_LOCK])


def max_age() -> timedelta:
    return timedelta(seconds=settings.DASHBOARD_REFRESH_SECONDS)


def refresh(now: datetime | None = None, *, keep_settled: bool = False) -> Overview:
    """Beat's rebuild (monitor.tasks.refresh_overview): the snapshot, and every winner that
    changed recorded (monitor.answer.winners), the one place that writes them.
    `keep_settled`: for beat's rebuild every few seconds over the same sliding window, read the
    window's settled hours once an hour, not every time (rollups.stats_over)."""
    return _rebuild(now or timezone.now(), keep_settled=keep_settled, record=True)


def rebuilt(now: datetime) -> Overview:
    """The board rebuilt for a reader (its snapshot replaced), recording nothing."""
    return _rebuild(now, record=False)


def _rebuild(now: datetime, *, keep_settled: bool = False, record: bool) -> Overview:
    started = time.perf_counter()
    overview, decisions = _build(now, WINDOW, keep_settled=keep_settled)
    if record:
        winners.record(decisions, now)
    overview.rows_html = render_to_string("front/_overview_rows.html", {"rows": overview.rows})
    OverviewSnapshot.objects.update_or_create(
        key=SNAPSHOT_KEY,
        defaults={
            "built_at": now,
            "data": overview.to_json(),
            "build_s": time.perf_counter() - started,
        },
    )
    return overview


def rebuild_due(now: datetime | None = None) -> bool:
    """Whether beat's rebuild should run now. Beat asks every half refresh interval; a build
    that takes longer than that (10.8 s at 10x the bench's load) would take the whole worker,
    and the ticks queued behind it expire: their slots are never created. So the next build
    starts no sooner than twice the last build's time after that one began (the rebuild takes
    at most half of its worker, a tick waits behind at most one build), and never later than
    readers still take the snapshot (LATE_REFRESHES - 1 intervals)."""
    now = now or timezone.now()
    last = (
        OverviewSnapshot.objects.filter(key=SNAPSHOT_KEY).values_list("built_at", "build_s").first()
    )
    if last is None:
        return True
    age_s = (now - last[0]).total_seconds()
    latest_s = max_age().total_seconds() * (LATE_REFRESHES - 1)
    return age_s >= min(2 * last[1], latest_s)


def current(now: datetime | None = None) -> Overview:
    """The overview as beat last built it, at most one refresh interval ago; up to
    LATE_REFRESHES while beat is ticking (its rebuild is running late), never more. One small
    read when it is."""
    now = now or timezone.now()
    snapshot = (
        OverviewSnapshot.objects.filter(key=SNAPSHOT_KEY).values_list("data", "built_at").first()
    )
    if snapshot is not None:
        age = now - snapshot[1]
        late = age <= max_age() * LATE_REFRESHES and _beat_ticking(now)
        if age <= max_age() or late:
            with contextlib.suppress(KeyError, TypeError):  # else an older release's: rebuild
                return Overview.from_json(snapshot[0]).at(now)
    # Rebuilt for this reader, never recorded: a change it shows is recorded by beat's next
    # rebuild, which reads the same figures (or later ones). While another rebuild runs, the
    # old snapshot is what there is.
    with rebuilding() as mine:
        if not mine and snapshot is not None and now - snapshot[1] <= REBUILDING_MAX:
            with contextlib.suppress(KeyError, TypeError):
                return Overview.from_json(snapshot[0]).at(now)
        return _rebuild(now, record=False)


def _beat_ticking(now: datetime) -> bool:
    """Beat ticked within the last two refresh intervals: it is there to rebuild the snapshot."""
    return Heartbeat.objects.filter(name=HEARTBEAT_TICK, last_seen__gt=now - 2 * max_age()).exists()


def forget(**kwargs: object) -> None:
    """Drop the snapshot (a signal receiver: tasks, routes or regions changed)."""
    OverviewSnapshot.objects.filter(key=SNAPSHOT_KEY).delete()
