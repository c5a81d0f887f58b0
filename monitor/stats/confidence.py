"""How sure a figure is: 95% intervals for pass rates and percentiles, and "faster with
confidence".

Every interval here is a two-sided 95% interval (LEVEL):
- A rate (pass rate, error rate) out of n probes: the Wilson score interval. A route clears a
  pass-rate bar only when the whole interval is at or above it (monitor.answer.selection).
- A percentile: the distribution-free order-statistic interval. For the q-th percentile of n
  samples, the ranks l and u are the widest the binomial Bin(n, q) allows at 2.5% on each side:
  P(B < l) <= 2.5% and P(B < u) >= 97.5%; the interval is [sample l, sample u], read from the
  log-bucket histogram (so each end also carries the histogram's ~2.5% bucket width). An end the
  samples cannot give (too few of them) is None, shown as "?".
- "Faster with confidence": one figure's interval lies wholly below the other's. With 95% on
  each, overlapping intervals mean "tied within noise".

A percentile's point value still needs monitor.stats.hist.MIN_SAMPLES samples ("too few samples"
below that); its interval says how far it could be off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from monitor.stats import hist

LEVEL = 0.95
Z = 1.959963984540054  # the standard normal quantile for a two-sided 95%
_TAIL = (1 - LEVEL) / 2
# Exact binomial sums up to this many samples; the normal approximation beyond (its error at
# that size is well under one rank).
_EXACT_UP_TO = 2000


@dataclass(frozen=True)
class Rate:
    """k out of n, with its Wilson interval."""

    k: int
    n: int

    @property
    def point(self) -> float | None:
        return self.k / self.n if self.n else None

    @property
    def low(self) -> float | None:
        return wilson(self.k, self.n)[0] if self.n else None

    @property
    def high(self) -> float | None:
        return wilson(self.k, self.n)[1] if self.n else None


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion k/n (n > 0)."""
    p = k / n
    z2 = Z * Z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Estimate:
    """A percentile with its 95% interval; point None means too few samples."""

    point: float | None
    low: float | None
    high: float | None
    n: int

    def faster_than(self, other: Estimate) -> bool:
        """Lower than `other` with confidence: this interval lies wholly below the other's."""
        return self.high is not None and other.low is not None and self.high < other.low


NO_ESTIMATE = Estimate(None, None, None, 0)


def _binom_cdf_table(n: int, p: float) -> list[float]:
    """P(B <= k) for k = 0..n, B ~ Bin(n, p), summed in log space (no overflow)."""
    log_p, log_q = math.log(p), math.log1p(-p)
    cdf, total = [], 0.0
    for k in range(n + 1):
        log_pmf = (
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + k * log_p
            + (n - k) * log_q
        )
        total += math.exp(log_pmf)
        cdf.append(total)
    return cdf


@lru_cache(maxsize=4096)
def rank_bounds(n: int, q: int) -> tuple[int | None, int | None]:
    """1-based ranks (l, u) of the 95% order-statistic interval of the q-th percentile of n
    samples; None where the samples cannot give that end."""
    if n <= 0:
        return None, None
    p = q / 100
    if n <= _EXACT_UP_TO:
        cdf = _binom_cdf_table(n, p)
        # P(B <= l - 1) <= tail, l as large as possible
        lows = [k + 1 for k in range(n) if cdf[k] <= _TAIL]
        low = max(lows) if lows else None
        # P(B <= u - 1) >= 1 - tail, u as small as possible
        highs = [k + 1 for k in range(n) if cdf[k] >= 1 - _TAIL]
        high = min(highs) if highs else None
        return low, high
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    low_rank = math.floor(mean - Z * sd)
    high_rank = math.ceil(mean + Z * sd) + 1
    return (low_rank if low_rank >= 1 else None), (high_rank if high_rank <= n else None)


@lru_cache(maxsize=64)
def samples_to_close(q: int) -> int:
    """The fewest samples whose q-th percentile has a point value (hist.MIN_SAMPLES) and a 95%
    interval with both ends: 6 for a median, 35 for p90, 72 for p95."""
    n = max(1, hist.MIN_SAMPLES.get(q, 1))
    while None in rank_bounds(n, q):
        n += 1
    return n


def all_below(
    lower: Mapping[int, int], upper: Mapping[int, int], scale: hist.Scale = hist.MS
) -> bool:
    """Every sample of `lower` is below every sample of `upper`, read conservatively from
    {bucket: count} histograms (the highest bucket of one below the lowest of the other: two
    samples in one bucket are never called apart), and that is no chance ordering: with m and
    n samples from one distribution, all m fall below all n with probability 1 / C(m + n, m),
    which must be under the one-sided 2.5% a 95% interval leaves on each side. Five below five
    is 1 in 252; two below five (1 in 21) is not enough."""
    m = sum(c for c in lower.values() if c)
    n = sum(c for c in upper.values() if c)
    if not m or not n:
        return False
    top = max(b for b, c in lower.items() if c)
    bottom = min(b for b, c in upper.items() if c)
    return scale.bounds(top)[1] <= scale.bounds(bottom)[0] and math.comb(m + n, m) * _TAIL > 1


def _value_at_rank(pairs: hist.Pairs, rank: int, scale: hist.Scale) -> float:
    seen = 0
    for i in range(0, len(pairs) - 1, 2):
        seen += pairs[i + 1]
        if seen >= rank:
            return scale.representative(pairs[i])
    return scale.representative(pairs[-2])


def percentile(counts: Mapping[int, int], q: int, scale: hist.Scale = hist.MS) -> Estimate:
    """The q-th percentile of a {bucket: count} histogram with its 95% interval."""
    pairs: hist.Pairs = []
    for bucket in sorted(counts):
        if counts[bucket]:
            pairs.extend((bucket, counts[bucket]))
    n = hist.total(pairs)
    if n == 0:
        return NO_ESTIMATE
    point = hist.percentile(pairs, q, scale)
    low_rank, high_rank = rank_bounds(n, q)
    return Estimate(
        point=point,
        low=_value_at_rank(pairs, low_rank, scale) if low_rank else None,
        high=_value_at_rank(pairs, high_rank, scale) if high_rank else None,
        n=n,
    )
