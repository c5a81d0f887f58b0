"""Monitoring health: is each region keeping its schedule?

Ingest folds every live slot's outcome into one row per (region, minute of slot time)
(monitor.models.RegionMinute): probes that ran, those of them that got past the region's
network (`reached`), slots recorded missed, and of those the probes a worker did not start
because they were too late, with a histogram of start lags. The Status
page, `/metrics` and the overview's banner read these rows: the figures agree with the raw
results by construction (every row in or out of monitor_proberesult passes through here), and
generated demo history is never counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Sum

from monitor.models import OUTCOME_ERROR, OUTCOME_MISSED, RegionMinute
from monitor.stats import hist
from monitor.stats.rollup_writes import ResultRow

# Start lags (ms): 1 ms to 15 minutes at the histograms' relative resolution.
LAG_SCALE = hist.Scale(low=1.0, high=900_000.0)
# A region whose share of missed slots passes this, over the last hour, is flagged.
MISSED_SHARE_MAX = 0.01
# Minutes are kept this long (the pages show a day).
KEPT_DAYS = 8
# Failures that say the path to a provider failed, before any answer came: a probe that ended
# otherwise `reached` its provider (monitor.pages.monitoring judges a region's path on them).
PATH_KINDS = frozenset({"dns", "connect", "tls", "timeout_headers"})

SlotKey = tuple[int | None, int, int, datetime | None]

_UPSERT = """
INSERT INTO monitor_regionminute AS m (region_id, minute, probed, reached, missed, late, lag_hist)
SELECT d.region_id, d.minute, d.probed, d.reached, d.missed, d.late, d.h::integer[]
FROM unnest(%s::bigint[], %s::timestamptz[], %s::integer[], %s::integer[], %s::integer[],
            %s::integer[], %s::text[]) AS d(region_id, minute, probed, reached, missed, late, h)
ON CONFLICT (region_id, minute) DO UPDATE SET
  probed = m.probed + EXCLUDED.probed,
  reached = m.reached + EXCLUDED.reached,
  missed = m.missed + EXCLUDED.missed,
  late = m.late + EXCLUDED.late,
  lag_hist = rw_pairs_add(m.lag_hist, EXCLUDED.lag_hist)
"""


def minute_of(when: datetime) -> datetime:
    return when.replace(second=0, microsecond=0)


@dataclass
class _Delta:
    probed: int = 0
    reached: int = 0
    missed: int = 0
    late: int = 0
    lags: list[float] = field(default_factory=list)


def count(
    rows: Iterable[ResultRow],
    lags: Mapping[SlotKey, float | None] | None = None,
    sign: int = 1,
) -> int:
    """Fold live slots' results (rows just inserted, or with sign -1 missed rows just taken
    back) into their region's minutes; `lags` gives each slot's start lag (ms) where the
    worker measured one. Returns how many minute rows were written. Must run in the
    transaction that wrote the rows."""
    lags = lags or {}
    deltas: dict[tuple[int, datetime], _Delta] = {}
    for r in rows:
        if r.slot_at is None or r.task_id is None:
            continue  # ad-hoc probes keep no schedule
        d = deltas.setdefault((r.region_id, minute_of(r.slot_at)), _Delta())
        lag = lags.get((r.task_id, r.route_id, r.region_id, r.slot_at))
        if r.outcome == OUTCOME_MISSED:
            d.missed += sign
            d.late += sign if lag is not None else 0
        else:
            d.probed += sign
            if not (r.outcome == OUTCOME_ERROR and r.error_kind in PATH_KINDS):
                d.reached += sign
            if lag is not None and sign > 0:
                d.lags.append(lag)
    if not deltas:
        return 0
    keys = sorted(deltas)  # one lock order for concurrent ingest workers
    histograms = []
    for k in keys:
        pairs = hist.build(deltas[k].lags, LAG_SCALE)
        histograms.append("{" + ",".join(map(str, pairs)) + "}")
    with connection.cursor() as cursor:
        cursor.execute(
            _UPSERT,
            [
                [k[0] for k in keys],
                [k[1] for k in keys],
                [deltas[k].probed for k in keys],
                [deltas[k].reached for k in keys],
                [deltas[k].missed for k in keys],
                [deltas[k].late for k in keys],
                histograms,
            ],
        )
    return len(keys)


@dataclass
class Schedule:
    """One region's schedule over a window (since `since`, a whole minute)."""

    since: datetime
    probed: int = 0
    missed: int = 0
    late: int = 0
    lag_pairs: list[int] = field(default_factory=list)

    @property
    def due(self) -> int:
        """Slots whose time came in the window and that have ended (a result or missed)."""
        return self.probed + self.missed

    @property
    def missed_share(self) -> float | None:
        return self.missed / self.due if self.due else None

    def lag_ms(self, q: int) -> float | None:
        return hist.percentile(self.lag_pairs, q, LAG_SCALE)

    @property
    def lag_p50(self) -> float | None:
        return self.lag_ms(50)

    @property
    def lag_p99(self) -> float | None:
        return self.lag_ms(99)

    @property
    def lag_samples(self) -> int:
        return hist.total(self.lag_pairs)


def schedules(now: datetime, window: timedelta, *, with_lags: bool = True) -> dict[int, Schedule]:
    """Each region's schedule over the last `window` (from the minute `window` ago), by
    region id; regions with nothing in the window are left out."""
    since = minute_of(now - window)
    rows = RegionMinute.objects.filter(minute__gte=since)
    found: dict[int, Schedule] = {}
    if with_lags:
        pairs_of: dict[int, list[list[int]]] = {}
        for region_id, probed, missed, late, pairs in rows.values_list(
            "region_id", "probed", "missed", "late", "lag_hist"
        ).iterator():
            s = found.setdefault(region_id, Schedule(since))
            s.probed += probed
            s.missed += missed
            s.late += late
            if pairs:
                pairs_of.setdefault(region_id, []).append(pairs)
        for region_id, histograms in pairs_of.items():
            found[region_id].lag_pairs = hist.merge(histograms)
        return found
    totals = rows.values("region_id").annotate(p=Sum("probed"), m=Sum("missed"), la=Sum("late"))
    for row in totals:
        found[row["region_id"]] = Schedule(
            since, probed=row["p"] or 0, missed=row["m"] or 0, late=row["la"] or 0
        )
    return found


def drop_before(cutoff: datetime) -> int:
    """Retention: minutes older than `cutoff` go (the figures cover a day at most)."""
    deleted, _ = RegionMinute.objects.filter(minute__lt=minute_of(cutoff)).delete()
    return deleted
