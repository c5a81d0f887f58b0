"""The tail over time on the route page's charts: p95 and p99 points wide enough to hold
the samples they need.

An hourly point holds an hour's probes: about 12 at one probe every 5 minutes in a region,
enough for its p50 (5 samples) but not its p95 (20) or p99 (100). So each point keeps its own
bucket's p50, and its p95 and p99 are read over the `width` buckets ending with it (a trailing
window), the narrowest width that holds enough samples at the route's usual rate: at 12 an
hour, p95 over 2 hours and p99 over 9. The width is chosen once per chart, from the window and
the sample count (the median count of the buckets with data), and is never wider than
MAX_WIDTH of the window's length: where even that is too few, the point says so (no line).

Read from the rollups, like every chart: the counts of each bucket (one indexed read of the
window's rows, for the sample count on hover), and the histograms only when a tail needs a
width above one bucket (a second read of the same rows, bounded the same way). Both read
through the (route, grain, region, time) index alone: with task_id among its index conditions
too, PostgreSQL ANDed in the task's whole index (30,000 entries on the 30-day bench set,
6 ms a read for 169 rows). A tail point is a few lookups into running sums (_Running), not
a merge of its span's histograms.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from monitor.models import GRAIN_HOUR, Region, Rollup, Route, Task
from monitor.stats import hist

TAIL_QUANTILES = (95, 99)
# The charted metrics, in the order of a chart point (monitor.pages.route.SERIES_METRICS),
# with each one's histogram column and scale.
HISTOGRAMS = (
    ("ttft_hist", hist.MS),
    ("e2e_hist", hist.MS),
    ("tps_hist", hist.TPS),
    ("ttfat_hist", hist.MS),
)
# The widest trailing window, as a share of the chart's window: half (12 h of a day, 3.5
# days of a week, 15 days of a month): p99 at one probe every 5 minutes needs 9 hours.
MAX_WIDTH = 0.5


@dataclass
class Tail:
    """One quantile's points: each [ttft, e2e, tps, ttfat] (None: too few samples) over the
    `width` buckets ending with it, with the samples it rests on; None where the bucket
    itself has no successful probe (a gap, as in every line)."""

    width: int
    points: list[list[float | None] | None]
    samples: list[int]


def choose_widths(counts: list[int], max_width: int) -> dict[int, int]:
    """For each tail quantile, the narrowest number of buckets whose usual sample count (the
    median over the buckets with data) reaches the quantile's minimum, at most max_width."""
    busy = sorted(c for c in counts if c > 0)
    if not busy:
        return dict.fromkeys(TAIL_QUANTILES, 1)
    rate = busy[len(busy) // 2]
    return {
        q: max(1, min(max_width, math.ceil(hist.MIN_SAMPLES[q] / rate))) for q in TAIL_QUANTILES
    }


_REGION = {True: "IS NULL", False: "= %(region)s"}
# Each row's bucket as its index from `first` (0 for first, -1 the bucket before it), worked
# out by PostgreSQL: loading a timestamp goes through Django's time-zone-aware loader, in
# Python, which took more time than the rest of the read. `task_id + 0`: a filter on the rows
# the route's index finds, never an index of its own to AND in (the module's docstring).
_READ_SQL = f"""
SELECT ((extract(epoch FROM bucket_start) - %(first)s) / %(step)s)::int, count_ok{{columns}}
FROM {Rollup._meta.db_table}
WHERE grain = %(grain)s AND task_id + 0 = %(task)s AND route_id = %(route)s
  AND region_id {{region}} AND bucket_start >= %(since)s AND bucket_start <= %(until)s
"""


def _read(
    task: Task,
    route: Route,
    region: Region | None,
    grain: str,
    first: datetime,
    step: timedelta,
    since: datetime,
    until: datetime,
    columns: tuple[str, ...] = (),
) -> list[tuple[Any, ...]]:
    """(index, count_ok, *columns) of each rollup row of [since, until], through the rollup
    key's index."""
    sql = _READ_SQL.replace("{columns}", "".join(f", {c}" for c in columns))
    with connection.cursor() as cursor:
        cursor.execute(
            sql.replace("{region}", _REGION[region is None]),
            {
                "first": first.timestamp(),
                "step": step.total_seconds(),
                "grain": grain,
                "task": task.pk,
                "route": route.pk,
                "region": region.pk if region is not None else None,
                "since": since,
                "until": until,
            },
        )
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows


class _Running:
    """One metric's histograms over the read buckets as running sums: for each bucket of the
    histogram seen anywhere (highest first), the samples in it up to each read bucket, so a
    trailing window's count in it is two lookups and a subtraction, whatever its width."""

    def __init__(self, rows: list[Sequence[int] | None], scale: hist.Scale) -> None:
        size = len(rows)
        dense: dict[int, list[int]] = {}
        totals = [0] * size
        # The highest histogram bucket of each read bucket (-1: none), where a window's walk
        # starts: past the empty buckets above it.
        self.tops = [-1] * size
        for t, pairs in enumerate(rows):
            if not pairs:
                continue
            top = -1
            for i in range(0, len(pairs) - 1, 2):
                b, n = pairs[i], pairs[i + 1]
                column = dense.get(b)
                if column is None:
                    column = dense[b] = [0] * size
                column[t] += n
                totals[t] += n
                if n and b > top:
                    top = b
            self.tops[t] = top
        order = sorted(dense, reverse=True)
        self.position = {b: i for i, b in enumerate(order)}
        self.values = [scale.representative(b) for b in order]
        self.sums = [[0, *itertools.accumulate(dense[b])] for b in order]
        self.total = [0, *itertools.accumulate(totals)]

    def percentile(self, q: int, lo: int, hi: int) -> float | None:
        """_tail_percentile of the read buckets lo..hi-1 merged."""
        n = self.total[hi] - self.total[lo]
        if n == 0 or n < hist.MIN_SAMPLES.get(q, 1):
            return None
        from_top = n - math.ceil(q / 100 * n) + 1  # the same sample, counted from the highest
        seen = 0
        sums = self.sums
        k = self.position[max(self.tops[lo:hi])]
        while True:
            column = sums[k]
            seen += column[hi] - column[lo]
            if seen >= from_top:
                return self.values[k]
            k += 1  # never past the last: the window's samples sum to n


def _tail(
    q: int, width: int, count: int, reach: int, ok: list[int], running: list[_Running]
) -> Tail:
    """Quantile q over the `width` buckets ending with each of the chart's `count` points;
    `ok` and `running` cover the `reach` buckets before the first point too."""
    points: list[list[float | None] | None] = []
    samples: list[int] = []
    ok_sums = [0, *itertools.accumulate(ok)]
    for t in range(reach, reach + count):
        if ok[t] == 0:
            points.append(None)
            samples.append(0)
            continue
        lo, hi = max(0, t + 1 - width), t + 1
        points.append([r.percentile(q, lo, hi) for r in running])
        samples.append(ok_sums[hi] - ok_sums[lo])
    return Tail(width=width, points=points, samples=samples)


def tails(
    task: Task,
    route: Route,
    region: Region | None,
    grain: str,
    first: datetime,
    count: int,
    window_length: timedelta,
) -> tuple[list[int], dict[int, Tail]]:
    """Each bucket's successful probes from `first` (count buckets of `grain`), and the tail
    quantiles that need more than one bucket, over their chosen widths."""
    step = timedelta(hours=1) if grain == GRAIN_HOUR else timedelta(days=1)
    max_width = max(1, int(window_length * MAX_WIDTH / step))
    last = first + (count - 1) * step
    counts = [0] * count
    for i, n in _read(task, route, region, grain, first, step, first, last):
        counts[i] = n
    widths = {q: w for q, w in choose_widths(counts, max_width).items() if w > 1}
    if not widths:
        return counts, {}
    # The histograms from as far back as the widest chosen window reaches, no further.
    reach = max(widths.values()) - 1
    columns = tuple(column for column, _ in HISTOGRAMS)
    ok = [0] * (reach + count)
    rows: list[list[Sequence[int] | None]] = [[None] * (reach + count) for _ in HISTOGRAMS]
    for i, n, *pairs in _read(
        task, route, region, grain, first, step, first - reach * step, last, columns
    ):
        ok[i + reach] = n
        for metric, p in zip(rows, pairs, strict=True):
            metric[i + reach] = p
    running = [_Running(r, scale) for r, (_, scale) in zip(rows, HISTOGRAMS, strict=True)]
    return counts, {q: _tail(q, w, count, reach, ok, running) for q, w in widths.items()}


def packed(counts: list[int], found: dict[int, Tail]) -> dict[str, Any]:
    """The chart data's additions (static/js/app.js reads them): each point's sample count,
    and per tail quantile its width in buckets, points and samples."""
    return {
        "counts": counts,
        "tails": {
            f"p{q}": {
                "width": t.width,
                "points": [
                    None if p is None else [None if v is None else round(v, 1) for v in p]
                    for p in t.points
                ],
                "samples": t.samples,
            }
            for q, t in found.items()
        },
    }


def describe(grain: str, found: dict[int, Tail]) -> str:
    """The one sentence that says what a chart point is."""
    unit = "hour" if grain == GRAIN_HOUR else "day"
    short = "h" if grain == GRAIN_HOUR else "days"
    if not found:
        return (
            f"Each point is one {unit}: the p50, p95 and p99 of that {unit}'s successful "
            "probes; hover for how many."
        )
    spans = " and ".join(f"p{q} of the {t.width} {short}" for q, t in sorted(found.items()))
    own = "p50" + "".join(f", p{q}" for q in TAIL_QUANTILES if q not in found)
    return (
        f"Each point is one {unit}: the {own} of that {unit}'s successful probes, and the "
        f"{spans} ending with it (the narrowest spans that hold the samples a tail needs at "
        "this route's probe rate); hover for each figure's sample count."
    )
