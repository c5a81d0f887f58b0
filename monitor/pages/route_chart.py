"""The route page's chart data: one route's percentiles over time, packed as JSON text that the
page embeds as it is, read from the hour strips or the daily rollups in one query."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils.safestring import SafeString, mark_safe

from monitor.models import GRAIN_DAY, GRAIN_HOUR, Region, Route, Task
from monitor.pages import tails
from monitor.pages.common import Range
from monitor.stats import rollups

# Chart data, as JSON text that the page embeds as it is and static/js/app.js unfolds:
#   {"start": first point (UTC, ISO 8601), "step": "hour" | "day", "skip": k, "count": n,
#    "chunks": [[point | null, ...], ...]}
# The chunks joined, less their first k points, are the window's n points, one per hour or day
# from start, null where no rollup row exists (an outage shows as a gap, never as a line);
# a point is [ttft p50, p95, p99, e2e p50, p95, p99, tps p50, p95, p99, ttfat p50, p95, p99]
# (SERIES_METRICS; hours stored before migration 0013 end after tps), null where too few
# samples. An hourly chart joins one HourStrip per day (31 rows for a month,
# the text of each already JSON); a daily one writes one point per daily rollup row. Either
# way PostgreSQL hands back one string and Python parses no number. Beside them:
#   "counts": [successful probes of each point's bucket, ...] (the sample count on hover) and
#   "tails": {"p95" | "p99": {"width": buckets, "points": [[ttft, e2e, tps, ttfat] | null],
#             "samples": [...]}}: a tail drawn over `width` buckets ending with each point,
#   which replaces that quantile's one-bucket figures (monitor.pages.tails); absent when one
#   bucket holds enough samples.
SERIES_METRICS = ("ttft_ms", "e2e_ms", "tps", "ttfat_ms")
_EMPTY_STRIP = "[" + ", ".join(["null"] * 24) + "]"
# Each read also carries the points' sample counts (tails.COUNTS_SQL): one round trip.
_HOUR_CHUNKS_SQL = f"""
SELECT string_agg(coalesce(s.points, %(empty)s), ',' ORDER BY d.i), {tails.COUNTS_SQL}
FROM unnest(%(days)s::timestamptz[]) WITH ORDINALITY AS d(day, i)
LEFT JOIN monitor_hourstrip AS s
  ON s.task_id = %(task)s AND s.route_id = %(route)s AND s.region_id {{region}} AND s.day = d.day
"""
_DAY_CHUNKS_SQL = f"""
SELECT '[' || string_agg(CASE WHEN r.id IS NULL THEN 'null'
                             ELSE rw_chart_point(r.ttft_pcts, r.e2e_pcts, r.tps_pcts,
                                                 rw_pairs_pcts(r.ttfat_hist, 1.0))::text END,
                        ',' ORDER BY d.i) || ']',
       {tails.COUNTS_SQL}
FROM unnest(%(days)s::timestamptz[]) WITH ORDINALITY AS d(day, i)
LEFT JOIN monitor_rollup AS r
  ON r.grain = 'day' AND r.task_id = %(task)s AND r.route_id = %(route)s
  AND r.region_id {{region}} AND r.bucket_start = d.day
"""
# As Django's json_script: the text can only hold numbers and null, but it goes into a page.
# A page with no task probing the route has no chart.
NO_SERIES = mark_safe('{"start": null, "step": "hour", "skip": 0, "count": 0, "chunks": []}')
_JSON_ESCAPES = str.maketrans({"<": "\\u003C", ">": "\\u003E", "&": "\\u0026"})


def series(
    route: Route, task: Task, region: Region | None, window: Range, now: datetime
) -> SafeString:
    """The chart data alone (series_with_note)."""
    return series_with_note(route, task, region, window, now)[0]


def series_with_note(
    route: Route, task: Task, region: Region | None, window: Range, now: datetime
) -> tuple[SafeString, str]:
    """The route's percentiles over the window, one point per window.series_grain: p50 of
    the point's own bucket, p95 and p99 over as many buckets ending with it as their samples
    need (monitor.pages.tails)."""
    grain = window.series_grain
    first = rollups.bucket_start(window.since(now), grain)
    last = rollups.bucket_start(now, grain)
    step = timedelta(hours=1) if grain == GRAIN_HOUR else timedelta(days=1)
    day = rollups.bucket_start(first, GRAIN_DAY)
    days = [day + timedelta(days=i) for i in range((last - day).days + 1)]
    sql = _HOUR_CHUNKS_SQL if grain == GRAIN_HOUR else _DAY_CHUNKS_SQL
    params: dict[str, Any] = {
        "empty": _EMPTY_STRIP,
        "days": days,
        **tails.params(task, route, region, grain, first, first, last),
    }
    with connection.cursor() as cursor:
        cursor.execute(tails.region_sql(sql, region), params)
        # chunks never NULL: there is always at least one day
        chunks, found_counts = cursor.fetchone()
    count = (last - first) // step + 1
    # Each point's sample count, and p95 / p99 over wider trailing windows where a bucket
    # holds too few samples for them (monitor.pages.tails).
    counts, found = tails.tails(
        task,
        route,
        region,
        grain,
        first,
        count,
        window.length,
        tails.counts_of(found_counts, count),
    )
    extra = tails.packed(counts, found)
    text = (
        f'{{"start": "{first:%Y-%m-%dT%H:%M:%SZ}", "step": "{grain}",'
        f' "skip": {(first - day) // step}, "count": {count},'
        f' "chunks": [{chunks}], "counts": {json.dumps(extra["counts"])},'
        f' "tails": {json.dumps(extra["tails"])}}}'
    )
    chart = mark_safe(text.translate(_JSON_ESCAPES))  # noqa: S308 - escaped as json_script does
    return chart, tails.describe(grain, found)
