"""What the overview shows: per task and region, the fastest qualifying route and its figures.

Everything comes from the rollups (monitor.rollups): one query for the window's rows of all
tasks, merged in memory per (task, route, region) and per (task, route) for quality.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from monitor import rollups, selection
from monitor.models import GRAIN_HOUR, Region, Task
from monitor.rollups import Stats

WINDOW = timedelta(hours=24)

STATUS_OK = "ok"
STATUS_NEAR = "near"
STATUS_OVER = "over"
STATUS_UNKNOWN = "unknown"
NEAR_FRACTION = 0.9  # within 90-100% of a budget is "near"


def budget_status(value_ms: float | None, budget_ms: int | None) -> str:
    if budget_ms is None or value_ms is None:
        return STATUS_UNKNOWN
    if value_ms > budget_ms:
        return STATUS_OVER
    if value_ms > budget_ms * NEAR_FRACTION:
        return STATUS_NEAR
    return STATUS_OK


def stale_after(task: Task) -> timedelta:
    """No result for this long means the figures are stale: three intervals, or one interval
    plus the probe deadline and a minute, whichever is longer."""
    return max(
        timedelta(seconds=3 * task.probe_interval_s),
        timedelta(seconds=task.probe_interval_s + task.probe_timeout_s + 60),
    )


@dataclass
class Cell:
    region: Region
    choice: selection.Choice
    stats: Stats | None  # of the winner in this region
    last_probe_at: datetime | None
    stale: bool
    ttft_status: str
    e2e_status: str

    @property
    def ttft_p50_ms(self) -> float | None:
        return self.stats.ttft_ms(50) if self.stats else None

    @property
    def ttft_p95_ms(self) -> float | None:
        return self.stats.ttft_ms(95) if self.stats else None

    @property
    def tps_p50(self) -> float | None:
        return self.stats.tps(50) if self.stats else None

    @property
    def e2e_p95_ms(self) -> float | None:
        return self.stats.e2e_ms(95) if self.stats else None

    @property
    def pass_rate(self) -> float | None:
        return self.choice.winner.pass_rate if self.choice.winner else None

    @property
    def overall_status(self) -> str:
        if self.stale or self.choice.winner is None:
            return STATUS_UNKNOWN
        statuses = {self.ttft_status, self.e2e_status}
        for s in (STATUS_OVER, STATUS_NEAR, STATUS_OK):
            if s in statuses:
                return s
        return STATUS_UNKNOWN


@dataclass
class TaskRow:
    task: Task
    cells: list[Cell]


def build(now: datetime | None = None, window: timedelta = WINDOW) -> list[TaskRow]:
    now = now or timezone.now()
    since = now - window
    tasks = list(
        Task.objects.filter(is_active=True).prefetch_related("routes__provider", "regions")
    )
    per_region = rollups.stats_by(
        rollups.rows(since=since, until=now + timedelta(hours=1), grain=GRAIN_HOUR),
        ["task_id", "route_id", "region_id"],
    )
    per_route = rollups.stats_by(
        rollups.rows(
            since=since, until=now + timedelta(hours=1), grain=GRAIN_HOUR, all_regions=True
        ),
        ["task_id", "route_id"],
        histograms=False,  # quality needs counts only
    )
    rows: list[TaskRow] = []
    for task in tasks:
        routes = [r for r in task.routes.all() if r.is_active]
        quality = {r.pk: per_route[(task.pk, r.pk)] for r in routes if (task.pk, r.pk) in per_route}
        cells = []
        for region in task.regions.all():
            latency = {
                r.pk: per_region[(task.pk, r.pk, region.pk)]
                for r in routes
                if (task.pk, r.pk, region.pk) in per_region
            }
            # A route with nothing recent in this region cannot win it.
            fresh = {
                pk: s
                for pk, s in latency.items()
                if s.last_probe_at and now - s.last_probe_at <= stale_after(task)
            }
            choice = selection.choose(task, routes, fresh, quality)
            last = max((s.last_probe_at for s in latency.values() if s.last_probe_at), default=None)
            stats = latency.get(choice.winner.route.pk) if choice.winner else None
            cells.append(
                Cell(
                    region=region,
                    choice=choice,
                    stats=stats,
                    last_probe_at=last,
                    stale=last is None or now - last > stale_after(task),
                    ttft_status=budget_status(
                        stats.ttft_ms(95) if stats else None, task.ttft_p95_budget_ms
                    ),
                    e2e_status=budget_status(
                        stats.e2e_ms(95) if stats else None, task.e2e_p95_budget_ms
                    ),
                )
            )
        rows.append(TaskRow(task=task, cells=cells))
    return rows
