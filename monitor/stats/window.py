"""Figures over an exact trailing window: the last W minutes, not the hours they touch.

The hourly rollups (monitor.stats.rollups) hold whole hours; a window from 10:47 to 11:12
holds parts of two. Read from the rollups alone it becomes 10:00 to 11:12, and fast probes
from 10:05 outvote slow ones from 11:05 (an alert rule that should fire in minutes fired in
seven, or in an hour). Here the whole hours inside the window come from the rollups, and the
partial hours at its edges from the raw results, folded exactly as ingest folds them into a
rollup row (rollup_writes.stats_of): the same counts, error kinds and histograms, so the same
percentiles and 95% intervals as the pages.

Raw results are kept RAW_RETENTION_DAYS; an edge older than that (a baseline "the same hours
last week" with a short retention) is read from the rollup rows of the hour it lies in, as
before: a coarser window, never an empty one.

Raw reads go through result_route_started and scenario_route_started (route, started_at): the
task's routes and the edge's time range, at most two hours of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from monitor.models import GRAIN_HOUR, ProbeResult, ScenarioResult
from monitor.stats import rollups
from monitor.stats.rollup_writes import ResultRow, scenario_row, stats_of
from monitor.stats.rollups import Stats, bucket_start

Keyed = dict[tuple[int | None, ...], Stats]

HOUR = timedelta(hours=1)

# ResultRow's fields as ProbeResult columns (app e2e is a scenario's, not a column).
_PROBE_COLUMNS = [f for f in ResultRow._fields if f != "app_e2e_ms"]
# What rollup_writes.scenario_row reads of a scenario.
_SCENARIO_FIELDS = (
    "task_id", "route_id", "region_id", "slot_at", "started_at", "outcome", "error_kind",
    "validation_pass", "cached_tokens", "input_tokens", "output_tokens", "cost_usd",
    "app_e2e_ms",
)  # fmt: skip


def raw_results(
    task_id: int, route_ids: Sequence[int], since: datetime, until: datetime
) -> list[ResultRow]:
    """The task's results of [since, until) as ingest hands them to the rollups: single probes
    and missed slots (a scenario's calls are not the task's probes), and each scenario as one
    result with its app e2e (rollup_writes.scenario_row)."""
    span = {"started_at__gte": since, "started_at__lt": until}
    found = [
        ResultRow(*values)
        for values in ProbeResult.objects.filter(
            task_id=task_id, route_id__in=route_ids, scenario__isnull=True, **span
        )
        .order_by()
        .values_list(*_PROBE_COLUMNS)
    ]
    scenarios = ScenarioResult.objects.filter(task_id=task_id, route_id__in=route_ids, **span)
    found += [scenario_row(s) for s in scenarios.order_by().only(*_SCENARIO_FIELDS)]
    return found


def edges(since: datetime, until: datetime) -> tuple[datetime, datetime] | None:
    """The whole hours inside [since, until) as (first hour, end of the last), or None when
    no whole hour fits."""
    first = bucket_start(since, GRAIN_HOUR)
    if first < since:
        first += HOUR
    end = bucket_start(until, GRAIN_HOUR)
    return (first, end) if first < end else None


def task_stats(
    *,
    task_id: int,
    route_ids: Sequence[int],
    since: datetime,
    until: datetime,
    by_region: bool = True,
) -> Keyed:
    """The task's figures over exactly [since, until): per (route id, region id), or per
    (route id,) over all regions (then counts only from the rollups, as stats_over without
    histograms; the raw edges carry theirs)."""
    kept_from = timezone.now() - timedelta(days=settings.RAW_RETENTION_DAYS)

    def hours(start: datetime, stop: datetime) -> Keyed:
        # Whole hours: [start, stop) and the rest of the hours it touches.
        return rollups.stats_over(
            since=start,
            until=stop,
            key_fields=["route_id", "region_id"] if by_region else ["route_id"],
            all_regions=not by_region,
            histograms=by_region,
            where={"task_id": task_id},
        )

    def raw(start: datetime, stop: datetime) -> Keyed:
        if start < kept_from:
            return hours(start, stop)
        return stats_of(raw_results(task_id, route_ids, start, stop), by_region=by_region)

    whole = edges(since, until)
    if whole is None:
        return raw(since, until)
    first, end = whole
    merged: Keyed = {}
    parts = [hours(first, end)]
    for start, stop in ((since, first), (end, until)):
        if start < stop:
            parts.append(raw(start, stop))
    for part in parts:
        for key, stats in part.items():
            into = merged.get(key)
            if into is None:
                into = merged[key] = Stats()
            into.add(stats)
    return merged
