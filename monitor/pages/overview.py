"""What the overview shows: per task and region, the fastest qualifying route and its figures.

Everything comes from the rollups (monitor.stats.rollups): one query for the window's rows of all
tasks, merged in memory per (task, route, region) and per (task, route) for quality. The
result is plain data (no model instances), so it can be kept as a snapshot and read back in
one small query (see SNAPSHOT_KEY).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from monitor.models import (
    METRIC_E2E_P95,
    METRIC_TTFT_P95,
    STATUS_NEAR,
    STATUS_OK,
    STATUS_OVER,
    STATUS_UNKNOWN,
    OverviewSnapshot,
    Task,
    fresh_within,
)
from monitor.stats import selection

WINDOW = timedelta(hours=24)


@dataclass
class TaskInfo:
    """What the overview shows of a task's configuration."""

    slug: str
    name: str
    latency_class: str  # display labels
    latency_metric: str
    min_pass_rate: float | None
    min_quality_index: float | None
    ttft_p95_budget_ms: int | None
    e2e_p95_budget_ms: int | None

    @classmethod
    def of(cls, task: Task) -> TaskInfo:
        return cls(
            slug=task.slug,
            name=task.name,
            latency_class=task.get_latency_class_display(),
            latency_metric=task.get_latency_metric_display(),
            min_pass_rate=task.min_pass_rate,
            min_quality_index=task.min_quality_index,
            ttft_p95_budget_ms=task.ttft_p95_budget_ms,
            e2e_p95_budget_ms=task.e2e_p95_budget_ms,
        )


@dataclass
class Cell:
    """One task in one region: its fastest qualifying route (None: none qualifies, and
    `reason` says why) with that route's figures in the region."""

    region_slug: str
    region_name: str
    route_id: int | None
    route_label: str
    reason: str
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    tps_p50: float | None
    e2e_p95_ms: float | None
    pass_rate: float | None
    last_probe_at: datetime | None
    stale_after_s: float
    ttft_status: str
    e2e_status: str
    stale: bool = True  # set against the time of the read (see `Overview.at`)

    @property
    def overall_status(self) -> str:
        if self.stale or self.route_id is None:
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
                last = cell["last_probe_at"]
                cell["last_probe_at"] = last.isoformat() if last else None
        return {"built_at": self.built_at.isoformat(), "rows": rows}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Overview:
        rows = []
        for row in data["rows"]:
            cells = []
            for cell in row["cells"]:
                last = cell["last_probe_at"]
                cell["last_probe_at"] = datetime.fromisoformat(last) if last else None
                cells.append(Cell(**cell))
            rows.append(TaskRow(task=TaskInfo(**row["task"]), cells=cells))
        return cls(rows=rows, built_at=datetime.fromisoformat(data["built_at"]))


def build(now: datetime | None = None, window: timedelta = WINDOW) -> Overview:
    """Compute the overview from the rollups (the work a snapshot saves each reader)."""
    now = now or timezone.now()
    since = now - window
    tasks = list(
        Task.objects.filter(is_active=True).prefetch_related("routes__provider", "regions")
    )
    figures = selection.Window.read(since, now + timedelta(hours=1))
    rows: list[TaskRow] = []
    for task in tasks:
        routes = [r for r in task.routes.all() if r.is_active]
        quality = figures.quality(task, routes)
        cells = []
        for region in task.regions.all():
            latency = figures.latency(task, routes, region)
            choice = selection.choose(task, routes, selection.fresh(task, latency, now), quality)
            last = max((s.last_probe_at for s in latency.values() if s.last_probe_at), default=None)
            winner = choice.winner
            stats = latency.get(winner.route.pk) if winner else None
            cells.append(
                Cell(
                    region_slug=region.slug,
                    region_name=region.name,
                    route_id=winner.route.pk if winner else None,
                    route_label=str(winner.route) if winner else "",
                    reason=choice.reason,
                    ttft_p50_ms=stats.ttft_ms(50) if stats else None,
                    ttft_p95_ms=stats.ttft_ms(95) if stats else None,
                    tps_p50=stats.tps(50) if stats else None,
                    e2e_p95_ms=stats.e2e_ms(95) if stats else None,
                    pass_rate=winner.pass_rate if winner else None,
                    last_probe_at=last,
                    stale_after_s=task.stale_after().total_seconds(),
                    ttft_status=task.budget_status(
                        METRIC_TTFT_P95, stats.ttft_ms(95) if stats else None
                    ),
                    e2e_status=task.budget_status(
                        METRIC_E2E_P95, stats.e2e_ms(95) if stats else None
                    ),
                )
            )
        rows.append(TaskRow(task=TaskInfo.of(task), cells=cells))
    return Overview(rows=rows, built_at=now).at(now)


# The overview is the same for every reader and refreshes itself in every open tab, so it is
# computed once, stored as a snapshot, and read ready-made: beat rebuilds it every half
# refresh interval (monitor.tasks.refresh_overview); a reader that finds it older than the
# refresh interval (beat down, first start) rebuilds it itself, and a configuration change
# drops it (monitor.apps), so no page shows figures older than one refresh interval.
SNAPSHOT_KEY = "overview"


def max_age() -> timedelta:
    return timedelta(seconds=settings.DASHBOARD_REFRESH_SECONDS)


def refresh(now: datetime | None = None) -> Overview:
    now = now or timezone.now()
    overview = build(now)
    OverviewSnapshot.objects.update_or_create(
        key=SNAPSHOT_KEY, defaults={"built_at": now, "data": overview.to_json()}
    )
    return overview


def current(now: datetime | None = None) -> Overview:
    """The overview as of at most one refresh interval ago (one small read when it is)."""
    now = now or timezone.now()
    snapshot = (
        OverviewSnapshot.objects.filter(key=SNAPSHOT_KEY, built_at__gt=now - max_age())
        .values_list("data", flat=True)
        .first()
    )
    if snapshot is None:
        return refresh(now)
    return Overview.from_json(snapshot).at(now)


def forget(**kwargs: object) -> None:
    """Drop the snapshot (a signal receiver: tasks, routes or regions changed)."""
    OverviewSnapshot.objects.filter(key=SNAPSHOT_KEY).delete()
