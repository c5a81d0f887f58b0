"""Log-bucket histograms: how rollups keep latency distributions small and mergeable.

A value v > 0 falls in bucket floor(log(v / LOW) / log(RATIO)) + 1 (bucket 0 holds v <= LOW,
the last bucket holds everything above the top). With RATIO = 1.05, a percentile read back
from the histogram is within about 2.5% of the exact one.

Stored sparse, as one flat integer array of (bucket, count) pairs sorted by bucket:
[b1, c1, b2, c2, ...]. An hour of one route in one region holds a dozen probes, so a dense
array of ~300 buckets would be 95% zeros, and reading a day of them for every route was the
overview's bottleneck. Histograms merge by adding counts of equal buckets, so hourly rows add
up to days, and regions to all regions (SQL: rw_pairs_add, in migration 0002).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

RATIO = 1.05
_LOG_RATIO = math.log(RATIO)


@dataclass(frozen=True)
class Scale:
    low: float
    high: float
    # Worked out once: index() runs for every value of every histogram a page builds.
    size: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        size = math.ceil(math.log(self.high / self.low) / _LOG_RATIO) + 2
        object.__setattr__(self, "size", size)

    def index(self, value: float) -> int:
        if value <= self.low:
            return 0
        i = int(math.log(value / self.low) / _LOG_RATIO) + 1
        return i if i < self.size else self.size - 1

    def bounds(self, index: int) -> tuple[float, float]:
        """(lowest, highest) value a bucket can hold: every value in it is above the first
        (bucket 0: at or below `low`, taken as 0) and at most the second (the last bucket:
        unbounded above)."""
        if index == 0:
            return 0.0, self.low
        upper = math.inf if index >= self.size - 1 else self.low * RATIO**index
        return self.low * RATIO ** (index - 1), upper

    def representative(self, index: int) -> float:
        """The geometric middle of a bucket, the value a percentile in it is reported as."""
        if index == 0:
            return self.low
        lower = self.low * RATIO ** (index - 1)
        return lower * math.sqrt(RATIO)


# Milliseconds from 1 ms to 30 minutes; tokens per second from 0.1 to 100,000.
MS = Scale(1.0, 1_800_000.0)
TPS = Scale(0.1, 100_000.0)

# Fewer samples than this and the percentile is not shown ("too few samples").
MIN_SAMPLES = {50: 5, 90: 10, 95: 20, 99: 100}


Pairs = list[int]


def build(values: Iterable[float | None], scale: Scale) -> Pairs:
    counts: dict[int, int] = {}
    for value in values:
        if value is not None and math.isfinite(value):
            i = scale.index(value)
            counts[i] = counts.get(i, 0) + 1
    return _flatten(counts)


def _flatten(counts: dict[int, int]) -> Pairs:
    pairs: Pairs = []
    for i in sorted(counts):
        if counts[i]:
            pairs.extend((i, counts[i]))
    return pairs


def add_into(counts: dict[int, int], pairs: Sequence[int]) -> None:
    """Accumulate a pairs array into a {bucket: count} dict (the fast path for merging)."""
    get = counts.get
    it = iter(pairs)
    # (bucket, count) pairs; a dangling odd element is ignored
    for b, n in zip(it, it, strict=False):
        counts[b] = get(b, 0) + n


def merge(histograms: Iterable[Sequence[int]]) -> Pairs:
    counts: dict[int, int] = {}
    for pairs in histograms:
        add_into(counts, pairs)
    return _flatten(counts)


def total(pairs: Sequence[int]) -> int:
    return sum(pairs[1::2])


def percentile(pairs: Sequence[int], q: int, scale: Scale) -> float | None:
    """The q-th percentile, or None when there are too few samples for it."""
    return percentiles(pairs, (q,), scale)[0]


def percentiles(pairs: Sequence[int], qs: Sequence[int], scale: Scale) -> list[float | None]:
    """Several percentiles in one pass (qs ascending); None where samples are too few."""
    n = total(pairs)
    out: list[float | None] = []
    k = 0
    seen = 0
    for q in qs:
        if n == 0 or n < MIN_SAMPLES.get(q, 1):
            out.append(None)
            continue
        rank = math.ceil(q / 100 * n)
        while k < len(pairs) - 1 and seen + pairs[k + 1] < rank:
            seen += pairs[k + 1]
            k += 2
        out.append(scale.representative(pairs[min(k, len(pairs) - 2)]))
    return out
