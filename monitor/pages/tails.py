"""The tail over time on the route page's charts: p95 and p99 points wide enough to hold
the samples they need.

An hourly point holds an hour's probes: about 12 at one probe every 5 minutes in a region,
enough for its p50 (5 samples) but not its p95 (20) or p99 (100). So each point keeps its own
bucket's p50, and its p95 and p99 are read over the `width` buckets ending with it (a trailing
window), the narrowest width that holds enough samples at the route's usual rate: at 12 an
hour, p95 over 2 hours and p99 over 9. The width is chosen once per chart, from the window and
the sample count (the median count of the buckets with data), and is never wider than
MAX_WIDTH of the window's length: where even that is too few, the point says so (no line).

Read from the rollups, like every chart: the counts of each bucket (for the sample count on
hover, COUNTS_SQL: carried by the chart's own read of the hour strips, no round trip of its
own), and the histograms only when a tail needs a width above one bucket (one read of the
same rows, bounded the same way, with binary results: _fetch). Both read through the (route,
grain, region, time) index alone: with task_id among its index conditions too, PostgreSQL
ANDed in the task's whole index (30,000 entries on the 30-day bench set, 6 ms a read for 169
rows). A tail point is a few lookups into running sums of each hour's top samples
(_Running), not a merge of its span's histograms.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
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
# The rollup rows of one (task, route, region) and grain over [since, until], each with its
# bucket as an index from `first` (0 for first, -1 the bucket before it), worked out by
# PostgreSQL: loading a timestamp goes through Django's time-zone-aware loader, in Python,
# which took more time than the rest of the read. `task_id + 0`: a filter on the rows the
# route's index finds, never an index of its own to AND in (the module's docstring).
_INDEX = "((extract(epoch FROM bucket_start) - %(first)s) / %(step)s)::int"
_ROWS = f"""
FROM {Rollup._meta.db_table}
WHERE grain = %(grain)s AND task_id + 0 = %(task)s AND route_id = %(route)s
  AND region_id {{region}} AND bucket_start >= %(since)s AND bucket_start <= %(until)s"""
# Each bucket's successful probes, as [[index, count_ok], ...] (NULL: no row), a scalar
# subquery the chart's own read carries (monitor.pages.route_chart): no round trip of its own.
COUNTS_SQL = f"(SELECT array_agg(ARRAY[{_INDEX}, count_ok]){_ROWS})"
_HISTOGRAMS_SQL = f"SELECT {_INDEX}, count_ok, {', '.join(c for c, _ in HISTOGRAMS)}{_ROWS}"


def params(
    task: Task,
    route: Route,
    region: Region | None,
    grain: str,
    first: datetime,
    since: datetime,
    until: datetime,
) -> dict[str, Any]:
    """The query parameters of COUNTS_SQL (its {region} replaced by region_sql(region))."""
    return {
        "first": first.timestamp(),
        "step": _step(grain).total_seconds(),
        "grain": grain,
        "task": task.pk,
        "route": route.pk,
        "region": region.pk if region is not None else None,
        "since": since,
        "until": until,
    }


def region_sql(sql: str, region: Region | None) -> str:
    return sql.replace("{region}", _REGION[region is None])


def counts_of(found: list[list[int]] | None, count: int) -> list[int]:
    """COUNTS_SQL's answer as each bucket's successful probes, 0 where no row."""
    counts = [0] * count
    for i, n in found or ():
        counts[i] = n
    return counts


def _step(grain: str) -> timedelta:
    return timedelta(hours=1) if grain == GRAIN_HOUR else timedelta(days=1)


class _Running:
    """One metric's histograms over the read buckets as running sums: for each histogram
    bucket kept (highest first), the samples in it up to each read bucket, so a trailing
    window's count in it is two lookups and a subtraction, whatever its width.

    A tail is read from the top: its point is where the window's samples counted from the
    highest bucket down reach `from_top` (1 or 2 at the widths choose_widths picks). So each
    read bucket's histogram is kept only from its highest bucket down to `keep` samples, the
    most any window asks for: a window's buckets above its answer hold fewer than from_top
    samples in all, so every read bucket keeps each of them and the answer's own, and the
    answer is the one the whole histograms give (tests/monitor/pages/test_route_tails.py).
    The rest (a dozen pairs an hour against one or two) is never walked."""

    def __init__(self, rows: list[Sequence[int] | None], totals: list[int], keep: int) -> None:
        size = len(rows)
        dense: dict[int, list[int]] = {}
        # The highest histogram bucket of each read bucket (-1: none), where a window's walk
        # starts: past the empty buckets above it.
        self.tops = [-1] * size
        for t, pairs in enumerate(rows):
            if not pairs:
                continue
            seen = 0
            i = len(pairs) - 2
            while i >= 0 and seen < keep:
                n = pairs[i + 1]
                if n:
                    b = pairs[i]
                    column = dense.get(b)
                    if column is None:
                        column = dense[b] = [0] * size
                    column[t] += n
                    if not seen:
                        self.tops[t] = b
                    seen += n
                i -= 2
        self.order = sorted(dense, reverse=True)
        self.position = {b: i for i, b in enumerate(self.order)}
        self.sums = [[0, *itertools.accumulate(dense[b])] for b in self.order]
        self.total = [0, *itertools.accumulate(totals)]

    def buckets(self, q: int, width: int, ends: list[int]) -> list[int | None]:
        """For the `width` read buckets ending with each of `ends`, merged: the histogram
        bucket holding their hist.percentile(q), None where they hold too few samples."""
        total, tops, position, sums, order = (
            self.total,
            self.tops,
            self.position,
            self.sums,
            self.order,
        )
        least = max(1, hist.MIN_SAMPLES.get(q, 1))
        out: list[int | None] = []
        for t in ends:
            hi = t + 1
            lo = max(0, hi - width)
            n = total[hi] - total[lo]
            if n < least:
                out.append(None)
                continue
            from_top = _from_top(q, n)
            seen = 0
            k = position[max(tops[lo:hi])]
            while True:
                column = sums[k]
                seen += column[hi] - column[lo]
                if seen >= from_top:
                    out.append(order[k])
                    break
                k += 1  # never past the last: the window's samples sum to n
        return out


def _from_top(q: int, n: int) -> int:
    """Quantile q of n samples as hist.percentile ranks it, counted from the highest."""
    return n - math.ceil(q / 100 * n) + 1


def _keep(totals: list[int], widths: dict[int, int], first: int) -> int:
    """The most samples from the top any chart point's window asks for (from `first` on):
    from_top grows with the window's samples."""
    sums = [0, *itertools.accumulate(totals)]
    keep = 1
    for q, width in widths.items():
        most = max(sums[hi] - sums[max(0, hi - width)] for hi in range(first + 1, len(sums)))
        keep = max(keep, _from_top(q, most))
    return keep


def _tail(
    q: int, width: int, count: int, reach: int, ok: list[int], running: list[_Running]
) -> Tail:
    """Quantile q over the `width` buckets ending with each of the chart's `count` points;
    `ok` and `running` cover the `reach` buckets before the first point too."""
    ends = [t for t in range(reach, reach + count) if ok[t]]
    metrics = [
        [None if b is None else value[b] for b in r.buckets(q, width, ends)]
        for r, value in zip(running, _VALUES, strict=True)
    ]
    drawn = dict(zip(ends, zip(*metrics, strict=True), strict=True))
    ok_sums = [0, *itertools.accumulate(ok)]
    points: list[list[float | None] | None] = []
    samples: list[int] = []
    for t in range(reach, reach + count):
        point = drawn.get(t)
        if point is None:  # a gap: no successful probe in the point's own bucket
            points.append(None)
            samples.append(0)
            continue
        points.append(list(point))
        samples.append(ok_sums[t + 1] - ok_sums[max(0, t + 1 - width)])
    return Tail(width=width, points=points, samples=samples)


# Each metric's bucket representatives (the value a percentile in the bucket reads as), worked
# out once, in HISTOGRAMS' order.
_VALUES = [[scale.representative(b) for b in range(scale.size)] for _, scale in HISTOGRAMS]


def tails(
    task: Task,
    route: Route,
    region: Region | None,
    grain: str,
    first: datetime,
    count: int,
    window_length: timedelta,
    counts: list[int] | None = None,
) -> tuple[list[int], dict[int, Tail]]:
    """Each bucket's successful probes from `first` (count buckets of `grain`), and the tail
    quantiles that need more than one bucket, over their chosen widths. `counts`: the first,
    when the caller's own read carried them (COUNTS_SQL)."""
    step = _step(grain)
    max_width = max(1, int(window_length * MAX_WIDTH / step))
    last = first + (count - 1) * step
    if counts is None:
        counts = counts_of(
            _fetch(
                f"SELECT {COUNTS_SQL}",
                region,
                params(task, route, region, grain, first, first, last),
            )[0][0],
            count,
        )
    widths = {q: w for q, w in choose_widths(counts, max_width).items() if w > 1}
    if not widths:
        return counts, {}
    # The histograms from as far back as the widest chosen window reaches, no further.
    reach = max(widths.values()) - 1
    ok = [0] * (reach + count)
    rows: list[list[Sequence[int] | None]] = [[None] * (reach + count) for _ in HISTOGRAMS]
    for i, n, *pairs in _fetch(
        _HISTOGRAMS_SQL,
        region,
        params(task, route, region, grain, first, first - reach * step, last),
    ):
        ok[i + reach] = n
        for metric, p in zip(rows, pairs, strict=True):
            metric[i + reach] = p
    running = []
    for metric in rows:
        totals = [sum(p[1::2]) if p else 0 for p in metric]
        running.append(_Running(metric, totals, _keep(totals, widths, reach)))
    return counts, {q: _tail(q, w, count, reach, ok, running) for q, w in widths.items()}


def _fetch(sql: str, region: Region | None, values: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The rows of `sql`, with binary results: a week of hours is 700 histograms, and
    psycopg loads their integers from the text form at 1.0-1.4 ms of CPU a read against
    0.3-0.4 from the binary one (wall 2.4 against 1.5 ms). Django's cursors bind parameters
    on the client, which cannot ask for binary results, so this read takes a psycopg cursor
    of its own on Django's connection (the same session and transaction); Django's query
    log and execute wrappers do not see it."""
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(
            region_sql(sql, region),
            values,
            binary=True,
            # Never a server-side prepared statement: a connection pooler in transaction
            # mode (PgBouncer) may give the next read another server session.
            prepare=False,
        )
        return cursor.fetchall()


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
