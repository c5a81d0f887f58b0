"""Hourly and daily rollups of probe results, kept up to date at ingest time.

`apply(results)` (monitor.stats.rollup_writes) folds newly inserted results into four rows each: (hour, region),
(hour, all regions), (day, region), (day, all regions). One UPSERT per batch adds counts and
histograms to whatever is there, so concurrent ingest workers never lose an update.
`stats(...)` reads them back merged over a window, with percentiles from the histograms.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.postgres.aggregates import JSONBAgg
from django.contrib.postgres.fields import ArrayField
from django.db.models import Aggregate, IntegerField, Max, Q, QuerySet, Sum

from monitor import limits
from monitor.models import (
    GRAIN_DAY,
    GRAIN_HOUR,
    Heartbeat,
    Rollup,
)
from monitor.stats import hist
from probes.errors import counts_against_provider

Key = tuple[str, datetime, int, int, int | None]


def bucket_start(when: datetime, grain: str) -> datetime:
    start = when.replace(minute=0, second=0, microsecond=0)
    return start.replace(hour=0) if grain == GRAIN_DAY else start


@dataclass
class Counters:
    """The rollup columns that add up: over probes at ingest (the UPSERT adds them to a row's),
    over rows when reading. Declared here once: the UPSERT's columns and sums, the reads' sums,
    the ingest delta and Stats all derive from it (COUNTERS). The Rollup model's fields of the
    same names are the table's schema (tests/monitor/models/test_domain_rules.py pins the two)."""

    count_ok: int = 0
    count_error: int = 0
    count_missed: int = 0
    graded: int = 0
    passed: int = 0
    cache_reported: int = 0
    cache_hits: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: Decimal = Decimal("0")

    @property
    def count(self) -> int:
        return self.count_ok + self.count_error + self.count_missed


COUNTERS = tuple(f.name for f in fields(Counters))


# Scales of the histogram columns (the rest are milliseconds).
HISTOGRAMS = (
    "ttft_hist",
    "e2e_hist",
    "tps_hist",
    "ttfat_hist",
    "ref_ttft_hist",
    "ref_ttfat_hist",
    "ref_e2e_hist",
    "app_e2e_hist",
)


# Writes into hours or days already settled (a result spooled through a broker outage, a late
# sweep): each adds one to this Heartbeat counter, and stats_over drops the settled stats it
# keeps when the count has moved. LATE_LEAD: a write this close to settling counts as late too
# (a reader may settle the hour while the writer's transaction is still open).
LATE_WRITES = "rollups-late-writes"


LATE_LEAD = timedelta(minutes=1)


def late_writes() -> int:
    """How many writes went into settled hours or days so far (LATE_WRITES)."""
    found = Heartbeat.objects.filter(name=LATE_WRITES).values_list("count", flat=True).first()
    return found or 0


@dataclass
class Stats(Counters):
    """Merged rollups over a window, for one (task, route, region or all regions)."""

    error_kinds: dict[str, int] = field(default_factory=dict)
    last_probe_at: datetime | None = None
    last_ok_at: datetime | None = None
    # Histograms, {bucket: count} per column (monitor.stats.hist), merged from the rows' pairs
    # arrays when first read: a page reads two or three of the eight, and merging all of them
    # for 180 (route, region) keys was a third of the regions page's time.
    _merged: dict[str, dict[int, int]] = field(default_factory=dict, repr=False)
    _pending: dict[str, list[Sequence[int]]] = field(default_factory=dict, repr=False)

    @property
    def ttft_counts(self) -> dict[int, int]:
        return self._counts("ttft_hist")

    @property
    def e2e_counts(self) -> dict[int, int]:
        return self._counts("e2e_hist")

    @property
    def tps_counts(self) -> dict[int, int]:
        return self._counts("tps_hist")

    @property
    def ttfat_counts(self) -> dict[int, int]:
        return self._counts("ttfat_hist")

    @property
    def ref_ttft_counts(self) -> dict[int, int]:
        return self._counts("ref_ttft_hist")

    @property
    def ref_ttfat_counts(self) -> dict[int, int]:
        return self._counts("ref_ttfat_hist")

    @property
    def ref_e2e_counts(self) -> dict[int, int]:
        return self._counts("ref_e2e_hist")

    @property
    def app_e2e_counts(self) -> dict[int, int]:
        return self._counts("app_e2e_hist")

    @property
    def error_rate(self) -> float | None:
        """Every failure, ours included (missed slots, configuration): the probe log's view.
        Availability (what the bar judges) is `provider_error_rate`."""
        return (self.count_error + self.count_missed) / self.count if self.count else None

    @property
    def provider_errors(self) -> int:
        """Failures that count against the provider (probes.errors.Kind.counts_against_provider);
        a kind we no longer know counts against it."""
        return sum(n for kind, n in self.error_kinds.items() if counts_against_provider(kind))

    @property
    def attempts(self) -> int:
        """Probes that tell about the provider's availability: successes and its failures."""
        return self.count_ok + self.provider_errors

    @property
    def provider_error_rate(self) -> float | None:
        return self.provider_errors / self.attempts if self.attempts else None

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.graded if self.graded else None

    @property
    def cache_hit_rate(self) -> float | None:
        """None when the provider never reported cached tokens (which differs from 0%)."""
        return self.cache_hits / self.cache_reported if self.cache_reported else None

    def _percentile(self, counts: dict[int, int], q: int, scale: hist.Scale) -> float | None:
        return hist.percentile(_pairs(counts), q, scale)

    def ttft_ms(self, q: int) -> float | None:
        return self._percentile(self.ttft_counts, q, hist.MS)

    def e2e_ms(self, q: int) -> float | None:
        return self._percentile(self.e2e_counts, q, hist.MS)

    def tps(self, q: int) -> float | None:
        return self._percentile(self.tps_counts, q, hist.TPS)

    def ttfat_ms(self, q: int) -> float | None:
        return self._percentile(self.ttfat_counts, q, hist.MS)

    def app_e2e_ms(self, q: int) -> float | None:
        return self._percentile(self.app_e2e_counts, q, hist.MS)

    def counts_for(self, name: str, *, reference: bool = False) -> dict[int, int]:
        """The histogram behind a latency metric (e2e_p50, ttft_p95, ttfat_p50, ...): all
        probes, or the reference option set's only (what ranks routes). Scenarios always
        run the reference options: app_e2e has one histogram."""
        kind, _, _ = name.rpartition("_p")
        if kind == "app_e2e":
            return self.app_e2e_counts
        if kind not in ("e2e", "ttft", "ttfat"):
            raise ValueError(f"unknown latency metric {name!r}")
        return getattr(self, f"{'ref_' if reference else ''}{kind}_counts")  # type: ignore[no-any-return]

    def metric(self, name: str, *, reference: bool = False) -> float | None:
        """A latency metric by name: e2e_p50, ttft_p95, ttfat_p95, ..."""
        q = int(name.rpartition("_p")[2])
        return self._percentile(self.counts_for(name, reference=reference), q, hist.MS)

    def add_row(self, row: Rollup) -> None:
        """Fold one rollup row in (reads of many rows go through stats_by, in SQL)."""
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(row, name))
        for kind, n in row.error_kinds.items():
            self.error_kinds[kind] = self.error_kinds.get(kind, 0) + int(n)
        for column in HISTOGRAMS:
            hist.add_into(self._counts(column), getattr(row, column))
        self._seen(row.last_probe_at, row.last_ok_at)

    def add(self, other: Stats) -> None:
        """Fold another window's or key's stats in (e.g. a task's routes into its total).
        `other` is left as it is (it may be shared: stats_over's settled hours)."""
        mine, theirs = self.__dict__, other.__dict__  # the overview folds 8,400 of them
        for name in COUNTERS:
            mine[name] += theirs[name]
        for kind, n in other.error_kinds.items():
            self.error_kinds[kind] = self.error_kinds.get(kind, 0) + n
        # Histograms are deferred like stats_by's arrays, merged when first read.
        for column, counts in other._merged.items():
            if counts:
                self._defer(column, _pairs(counts))
        for column, arrays in other._pending.items():
            self._pending.setdefault(column, []).extend(arrays)
        self._seen(other.last_probe_at, other.last_ok_at)

    @classmethod
    def of_values(cls, row: Mapping[str, Any]) -> Stats:
        """One rollup row as read with .values() (its counters, error kinds, latest times and
        whichever histogram columns were read): for callers that fold hours themselves (the
        alerts' backtest reads a month of rows once and slides its window in memory)."""
        stats = cls(error_kinds={k: int(n) for k, n in (row.get("error_kinds") or {}).items()})
        for name in COUNTERS:
            setattr(stats, name, row.get(name) or 0)
        for column in HISTOGRAMS:
            stats._defer(column, row.get(column) or [])
        stats._seen(row.get("last_probe_at"), row.get("last_ok_at"))
        return stats

    def _counts(self, column: str) -> dict[int, int]:
        """The merged counts of a histogram column (ttft_hist -> ttft_counts)."""
        counts = self._merged.get(column)
        if counts is None:
            counts = self._merged[column] = {}
        for pairs in self._pending.pop(column, ()):
            hist.add_into(counts, pairs)
        return counts

    def _defer(self, column: str, pairs: Sequence[int]) -> None:
        """A pairs array to merge into a column's counts when it is first read."""
        if pairs:
            self._pending.setdefault(column, []).append(pairs)

    def compact(self) -> Stats:
        """A copy holding each histogram as one merged array of 32-bit integers: a fifth of
        the memory of dicts, for stats kept between reads (stats_over's settled hours)."""
        copy = Stats(error_kinds=dict(self.error_kinds))
        for name in COUNTERS:
            setattr(copy, name, getattr(self, name))
        copy._seen(self.last_probe_at, self.last_ok_at)
        for column in HISTOGRAMS:
            counts = self._counts(column)
            if counts:
                copy._pending[column] = [array("i", _pairs(counts))]
        return copy

    def _seen(self, last_probe_at: datetime | None, last_ok_at: datetime | None) -> None:
        if last_probe_at and (self.last_probe_at is None or last_probe_at > self.last_probe_at):
            self.last_probe_at = last_probe_at
        if last_ok_at and (self.last_ok_at is None or last_ok_at > self.last_ok_at):
            self.last_ok_at = last_ok_at


def _pairs(counts: dict[int, int]) -> hist.Pairs:
    pairs: hist.Pairs = []
    for b in sorted(counts):
        pairs.extend((b, counts[b]))
    return pairs


def grain_for(window: timedelta) -> str:
    """Windows of up to three days read hourly rows; longer ones read daily rows."""
    return GRAIN_HOUR if window <= timedelta(days=3) else GRAIN_DAY


def rows(
    *, since: datetime, until: datetime, grain: str, all_regions: bool | None = False
) -> QuerySet[Rollup]:
    """The rows of [since, until): each region's (all_regions=False), the all-regions rows
    (region NULL: True), or both (None: keyed by region_id, the merged figures come back
    under region None, in the same read)."""
    qs = Rollup.objects.filter(grain=grain, bucket_start__gte=bucket_start(since, grain))
    qs = qs.filter(bucket_start__lt=until)
    if all_regions is None:
        return qs
    return qs.filter(region__isnull=True) if all_regions else qs.filter(region__isnull=False)


class _Cat(Aggregate):
    """Concatenate pairs arrays across rows (SQL aggregate rw_cat, migration 0002)."""

    function = "rw_cat"
    output_field = ArrayField(IntegerField())


def stats_by(
    qs: QuerySet[Rollup], key_fields: Sequence[str], *, histograms: bool = True
) -> dict[tuple[int | None, ...], Stats]:
    """Merge rollup rows into one Stats per key (e.g. ("task_id", "route_id", "region_id")).

    PostgreSQL sums the counts and concatenates the histograms per key, so Python handles one
    row per key, not one per hour: this is the hot path of every page. Without
    `histograms`, only counts are read (enough for pass rates and error rates)."""
    aggregates: dict[str, Aggregate] = {
        **{f"s_{name}": Sum(name) for name in COUNTERS},
        "s_error_kinds": JSONBAgg("error_kinds", filter=~Q(error_kinds={})),
        "s_last_probe_at": Max("last_probe_at"),
        "s_last_ok_at": Max("last_ok_at"),
    }
    if histograms:
        aggregates.update({f"s_{column}": _Cat(column) for column in HISTOGRAMS})
    merged: dict[tuple[int | None, ...], Stats] = {}
    for row in qs.order_by().values(*key_fields).annotate(**aggregates):
        stats = Stats()
        for name in COUNTERS:
            setattr(stats, name, row[f"s_{name}"] or 0)
        for kinds in row["s_error_kinds"] or []:
            for kind, n in kinds.items():
                stats.error_kinds[kind] = stats.error_kinds.get(kind, 0) + int(n)
        if histograms:
            for column in HISTOGRAMS:
                stats._defer(column, row[f"s_{column}"])
        stats.last_probe_at = row["s_last_probe_at"]
        stats.last_ok_at = row["s_last_ok_at"]
        merged[tuple(row[f] for f in key_fields)] = stats
    return merged


# An hour's rows stop changing once every slot of it is past its deadline: a probe's deadline
# (at most PROBE_TIMEOUT_MAX_S, monitor.limits) plus the slot's grace, and the tick's sweep
# records a slot missed within a tick of it. Then ingest and the sweep are done with the hour:
# its rows are settled. The rare exception, a result spooled through a broker outage, counts
# as a late write (LATE_WRITES): kept stats are read again at once. Callers that keep settled
# hours pass `until` = now + 1 h (the current hour whole), so until - 1 h is their present:
# at 11:25 the hours before 11:00 are settled and only the current hour is read; until 11:20
# or so, the one before it too.
SETTLE_MARGIN = timedelta(minutes=2)


def settled_after() -> timedelta:
    """How long after its end an hour's (or a day's) rows no longer change."""
    deadline = limits.PROBE_TIMEOUT_MAX_S + settings.SLOT_GRACE_SECONDS + settings.TICK_SECONDS
    return timedelta(seconds=deadline) + SETTLE_MARGIN


SETTLED_TTL = 600.0  # seconds a process keeps settled stats before reading them again


SETTLED_KEPT = 256  # windows a process keeps at most (the least recently read go first)


# Per window: when it was read, late_writes() before it was, and its stats.
_Kept = tuple[float, int, dict[tuple[int | None, ...], Stats]]


_settled: OrderedDict[tuple[Any, ...], _Kept] = OrderedDict()


_settled_lock = threading.Lock()


def forget_settled() -> None:
    """Drop the settled stats this process keeps (a new database: tests)."""
    with _settled_lock:
        _settled.clear()


def stats_over(
    *,
    since: datetime,
    until: datetime,
    grain: str = GRAIN_HOUR,
    key_fields: Sequence[str],
    all_regions: bool | None,
    histograms: bool = True,
    task_ids: Sequence[int] | None = None,
    where: Mapping[str, int] | None = None,
    keep_settled: bool = False,
) -> dict[tuple[int | None, ...], Stats]:
    """`stats_by` over the rows of [since, until) (of `task_ids`, and matching `where`, e.g.
    {"route_id": 3}). With `keep_settled` (and `until` = now + 1 h), the hours (or days) that
    ended settled_after() before now are read once and kept in this process (compacted; read
    again after a write into them, LATE_WRITES, or after SETTLED_TTL), so a window read again
    as it slides reads only its recent rows: the overview's rebuild every few seconds (25
    hours of 3,600 combinations: 1.6 s), a page refreshed in an open tab, a page's 30-day
    window read by day, /metrics' all-time sums. `all_regions=None` reads each region's rows
    and the all-regions rows together (rows()): keyed by region_id, which must be among
    `key_fields`."""
    if all_regions is None and "region_id" not in key_fields:
        # Both kinds of row summed under one key would count every probe twice.
        raise ValueError("all_regions=None needs region_id among the key fields")
    filters: dict[str, Any] = dict(where or {})
    if task_ids is not None:
        filters["task_id__in"] = list(task_ids)

    def read(start: datetime, end: datetime) -> dict[tuple[int | None, ...], Stats]:
        qs = rows(since=start, until=end, grain=grain, all_regions=all_regions)
        return stats_by(qs.filter(**filters), key_fields, histograms=histograms)

    start = bucket_start(since, grain)
    # Hours, or days, that ended settled_after() before the present (until - 1 h).
    split = bucket_start(until - timedelta(hours=1) - settled_after(), grain)
    if not keep_settled or split <= start:
        return read(since, until)
    query = (
        tuple(key_fields),
        all_regions,
        histograms,
        tuple(task_ids) if task_ids is not None else None,
        tuple(sorted((where or {}).items())),
    )
    key = (*query, start, split)
    clock = time.monotonic()
    # Read before the settled rows are: a late write after it shows at the next read.
    late = late_writes()
    with _settled_lock:
        kept = _settled.get(key)
        if kept is not None:
            _settled.move_to_end(key)
    if kept is None or clock - kept[0] > SETTLED_TTL or kept[1] != late:
        kept = (clock, late, {k: s.compact() for k, s in read(start, split).items()})
        with _settled_lock:
            # Only the newest window of a query is worth keeping (the hours slide).
            for old in [k for k in _settled if k[: len(query)] == query]:
                del _settled[old]
            _settled[key] = kept
            while len(_settled) > SETTLED_KEPT:
                _settled.popitem(last=False)
    settled, merged = kept[2], read(split, until)
    # The kept stats are shared (with other threads too): each read adds to copies.
    for k, old_hours in settled.items():
        stats = Stats()
        stats.add(old_hours)
        new_hours = merged.get(k)
        if new_hours is not None:
            stats.add(new_hours)
        merged[k] = stats
    return merged
