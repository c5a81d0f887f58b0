"""The figures the decision (monitor.answer.selection) reads: tasks' route stats over a window,
from the hourly rollups, per region (latency) and all regions merged (quality)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from monitor.models import Region, Route, Task
from monitor.stats import rollups
from monitor.stats.rollups import Stats


@dataclass
class Window:
    """Tasks' route stats over [since, until) from the hourly rollups, read once for many
    choices: per region (latency) and all regions merged (quality; counts only)."""

    per_region: dict[tuple[int | None, ...], Stats]
    per_route: dict[tuple[int | None, ...], Stats]

    @classmethod
    def read(
        cls,
        since: datetime,
        until: datetime,
        task_ids: Sequence[int] | None = None,
        *,
        keep_settled: bool = False,
    ) -> Window:
        """Every task's rows, or only those of `task_ids`; `keep_settled`: see
        rollups.stats_over (for a window read again and again as it slides)."""
        return cls(
            per_region=rollups.stats_over(
                since=since,
                until=until,
                key_fields=["task_id", "route_id", "region_id"],
                all_regions=False,
                task_ids=task_ids,
                keep_settled=keep_settled,
            ),
            per_route=rollups.stats_over(
                since=since,
                until=until,
                key_fields=["task_id", "route_id"],
                all_regions=True,
                histograms=False,
                task_ids=task_ids,
                keep_settled=keep_settled,
            ),
        )

    def quality(self, task: Task, routes: Sequence[Route]) -> dict[int, Stats]:
        """Per route id, all regions merged: `choose`'s quality."""
        keys = ((r.pk, (task.pk, r.pk)) for r in routes)
        return {pk: self.per_route[key] for pk, key in keys if key in self.per_route}

    def latency(self, task: Task, routes: Sequence[Route], region: Region) -> dict[int, Stats]:
        """Per route id, in one region: `choose`'s latency."""
        keys = ((r.pk, (task.pk, r.pk, region.pk)) for r in routes)
        return {pk: self.per_region[key] for pk, key in keys if key in self.per_region}


def per_route(
    task: Task,
    *,
    since: datetime,
    until: datetime,
    grain: str,
    region: Region | None = None,
    histograms: bool = True,
) -> dict[int, Stats]:
    """A task's stats per route id over [since, until), all regions merged or in `region`:
    `choose`'s quality (counts only are enough) or a page's latency. Settled hours are kept
    between reads (rollups.stats_over): pages refresh themselves in open tabs."""
    where = {"task_id": task.pk} | ({"region_id": region.pk} if region is not None else {})
    found = rollups.stats_over(
        since=since,
        until=until,
        grain=grain,
        key_fields=["route_id"],
        all_regions=region is None,
        histograms=histograms,
        where=where,
        keep_settled=True,
    )
    return {k[0]: s for k, s in found.items() if k[0] is not None}
