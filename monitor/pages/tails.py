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
width above one bucket (a second read of the same rows, bounded the same way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

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


def _rows(
    task: Task, route: Route, region: Region | None, grain: str, since: datetime, until: datetime
) -> Any:
    rows = Rollup.objects.filter(
        grain=grain, task=task, route=route, bucket_start__gte=since, bucket_start__lte=until
    )
    return rows.filter(region=region) if region is not None else rows.filter(region__isnull=True)


def _tail_percentile(counts: dict[int, int], q: int, scale: hist.Scale) -> float | None:
    """hist.percentile of a {bucket: count} window, read from its top: a tail quantile's rank
    is a few samples below the highest, so the walk is short and builds no pairs."""
    n = sum(counts.values())
    if n == 0 or n < hist.MIN_SAMPLES.get(q, 1):
        return None
    from_top = n - math.ceil(q / 100 * n) + 1  # the same sample, counted from the highest
    seen = 0
    for bucket in sorted(counts, reverse=True):
        seen += counts[bucket]
        if seen >= from_top:
            return scale.representative(bucket)
    return scale.representative(min(counts))  # not reached: the counts sum to n


def _subtract(counts: dict[int, int], pairs: list[int]) -> None:
    for i in range(0, len(pairs) - 1, 2):
        left = counts[pairs[i]] - pairs[i + 1]
        if left:
            counts[pairs[i]] = left
        else:
            del counts[pairs[i]]


def _tail(
    q: int, width: int, first: int, count: int, hists: dict[int, tuple[list[int], ...]]
) -> Tail:
    """Quantile q over a sliding window of `width` buckets: each bucket's histograms added
    as it enters and taken away as it leaves, so a point costs two bucket merges."""
    windows: list[dict[int, int]] = [{} for _ in HISTOGRAMS]
    ok: dict[int, int] = {}
    n = 0
    points: list[list[float | None] | None] = []
    samples: list[int] = []
    for i in range(first - width + 1, first + count):
        entering = hists.get(i)
        if entering is not None:
            for window, pairs in zip(windows, entering[1:], strict=True):
                hist.add_into(window, pairs)
            n += entering[0][0]
            ok[i] = entering[0][0]
        leaving = i - width
        if leaving in ok:
            gone = hists[leaving]
            for window, pairs in zip(windows, gone[1:], strict=True):
                _subtract(window, pairs)
            n -= ok.pop(leaving)
        if i < first:
            continue
        if entering is None or entering[0][0] == 0:
            points.append(None)
            samples.append(0)
            continue
        points.append(
            [
                _tail_percentile(window, q, scale)
                for window, (_, scale) in zip(windows, HISTOGRAMS, strict=True)
            ]
        )
        samples.append(n)
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
    by_index = {
        (start - first) // step: n
        for start, n in _rows(task, route, region, grain, first, last).values_list(
            "bucket_start", "count_ok"
        )
    }
    counts = [by_index.get(i, 0) for i in range(count)]
    widths = {q: w for q, w in choose_widths(counts, max_width).items() if w > 1}
    if not widths:
        return counts, {}
    # The histograms from as far back as the widest chosen window reaches, no further.
    since = first - (max(widths.values()) - 1) * step
    columns = [column for column, _ in HISTOGRAMS]
    hists: dict[int, tuple[list[int], ...]] = {}
    for start, n, *pairs in _rows(task, route, region, grain, since, last).values_list(
        "bucket_start", "count_ok", *columns
    ):
        hists[(start - first) // step] = ([n], *pairs)
    return counts, {q: _tail(q, w, 0, count, hists) for q, w in widths.items()}


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
