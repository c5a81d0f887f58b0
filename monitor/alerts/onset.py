"""When a breach began in data time: the onset of its evidence, from which a rule's minimum
duration is counted.

A rule on probes in a window (latency, availability, rate limit) becomes confident only once
the window holds enough bad probes for its 95% interval to clear the line: 9 slow of 10 for a
median, 4 of 20 for a p95. Counting the minimum duration from that first confident evaluation
adds that wait to every alert (6 min 18 s for a 5-minute rule on `make run`). Here it counts
from when the evidence began instead:

    onset (per route and region) = the start of the probe in the window from which on the
    probes are past the line the most beyond the share that makes the figure past it: the t
    maximising sum over the probes started since t of (past - share), where past is 1 for a
    probe past the line and share is 1 - q for a percentile q (a median: 0.5; a p95: 0.05),
    the ceiling for an error rate.

That is the classic change-point estimate (CUSUM) for a rise in the share of bad probes; it
starts at a probe past the line. A sustained slowdown's onset is its first slow probe, as
"the earliest slow probe in the window" would give, but a stray slow probe earlier in the
window, followed by fast ones, does not pull it back (for a median: one fast probe in between
is enough). The alert's onset is the
moment K of its N regions were past: the K-th earliest of the agreeing regions' onsets (for a
"region path down", every route's onset in that region: the latest). Never earlier than the
window's start, nor than the subject's last resolution (`floor`).

Firing still needs the confident condition at every evaluation from the first to the firing
one (monitor.alerts.lifecycle); it fires once now - onset >= the minimum duration. So a
sustained slowdown fires at onset + duration + at most one tick, and noise that never becomes
confident never fires.

The same definition runs on two kinds of pieces: single probes (live, from the raw results),
and hourly rollup rows (the backtest, monitor.alerts.backtest: each hour's count past the line
from its histogram).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from monitor.models import OUTCOME_MISSED, OUTCOME_OK
from monitor.stats import hist, window
from monitor.stats.rollup_writes import ResultRow
from monitor.stats.rollups import Stats
from probes.errors import counts_against_provider

LATENCY = "latency"
ERRORS = "errors"
RATE_LIMITED = "rate_limited"

Unit = tuple[int, int]  # (route id, region id)


@dataclass(frozen=True)
class Piece:
    """Probes that started at `at` (one probe live; an hour's in the backtest), `past` of
    the `total` that count past the line."""

    at: datetime
    past: int
    total: int


@dataclass(frozen=True)
class Evidence:
    """What makes a probe count as past the line for a finding, and whose onsets make the
    alert's (set by monitor.alerts.evaluation on each finding of a windowed rule)."""

    kind: str  # LATENCY, ERRORS or RATE_LIMITED
    share: float  # the figure is past the line when more than this share of probes are
    units: tuple[Unit, ...]  # the (route, region) pairs that agree
    needed: int  # how many units must be past at once (K of N; every route for a region)
    metric: str = ""  # latency: e2e_p50, tps_p50, ...
    lines: dict[Unit, float] = field(default_factory=dict)  # latency: each unit's line

    @property
    def falls(self) -> bool:
        """Speed: past the line means below it."""
        return self.metric.startswith("tps")

    def judge(self, row: ResultRow, line: float | None) -> bool | None:
        """Is this probe past the line? None: it is not part of the figure."""
        if self.kind == LATENCY:
            if row.outcome != OUTCOME_OK or line is None:
                return None
            value = _value(row, self.metric)
            if value is None:
                return None
            return value < line if self.falls else value > line
        if self.kind == ERRORS:
            if row.error_kind and counts_against_provider(row.error_kind):
                return True
            return False if row.outcome == OUTCOME_OK else None
        if row.outcome == OUTCOME_MISSED:
            return None
        return row.error_kind == "http_429"

    def count(self, stats: Stats, line: float | None) -> tuple[int, int]:
        """(past the line, counted) of an hour's figures (the backtest's pieces)."""
        if self.kind == LATENCY:
            if line is None:
                return 0, 0
            if self.falls:
                counts, scale = stats.tps_counts, hist.TPS
            else:
                counts, scale = stats.counts_for(self.metric, reference=True), hist.MS
            past = 0
            for index, n in counts.items():
                low, high = scale.bounds(index)
                # Only buckets wholly past the line: a bucket it cuts is not surely past.
                if (high < line) if self.falls else (low >= line):
                    past += n
            return past, sum(counts.values())
        if self.kind == ERRORS:
            return stats.provider_errors, stats.attempts
        return stats.error_kinds.get("http_429", 0), stats.count_ok + stats.count_error


def _value(row: ResultRow, metric: str) -> float | None:
    """A probe's value in the histogram behind `metric` (Stats.counts_for(..., reference=True),
    tps_counts): the reference option set's latencies, a scenario's app e2e, any speed."""
    kind = metric.rpartition("_p")[0]
    if kind == "tps":
        return row.tps
    if kind == "app_e2e":
        return row.app_e2e_ms
    if not row.reference:
        return None
    value: float | None = getattr(row, f"{kind}_ms", None)
    return value


def onset_of(pieces: Sequence[Piece], share: float) -> datetime | None:
    """The start of the trailing stretch with the most probes past the line beyond `share`
    of them: the t that maximises sum(past - share * total) over the pieces from t on (the
    latest such t on a tie), or None when no stretch has any excess. `pieces` in time order.

    A sustained breach's onset is its first bad probe. A stray bad probe before it stays out
    unless fewer good ones than (1 - share) / share lie between them: one for a median, 19 for
    a p95 (one in 20 past the line is what a p95 past it means), none for an error ceiling
    of 5%."""
    excess = best = 0.0
    found = None
    for piece in reversed(pieces):
        excess += piece.past - share * piece.total
        if piece.past and excess > best + 1e-9:
            best, found = excess, piece.at
    return found


def combine(onsets: Iterable[datetime | None], needed: int) -> datetime | None:
    """When `needed` units were past at once: the needed-th earliest onset (None when fewer
    than `needed` units have one)."""
    known = sorted(o for o in onsets if o is not None)
    return known[needed - 1] if needed >= 1 and len(known) >= needed else None


def of_pieces(evidence: Evidence, pieces: Mapping[Unit, Sequence[Piece]]) -> datetime | None:
    """The alert's onset from each unit's pieces in time order (probes or hours): the
    needed-th earliest of the units' onsets."""
    return combine(
        (onset_of(pieces.get(u, ()), evidence.share) for u in evidence.units), evidence.needed
    )


def of_rows(evidence: Evidence, rows: Iterable[ResultRow]) -> datetime | None:
    """The alert's onset from raw results (any order)."""
    wanted = set(evidence.units)
    pieces: dict[Unit, list[Piece]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r.started_at):
        unit = (row.route_id, row.region_id)
        if unit not in wanted:
            continue
        verdict = evidence.judge(row, evidence.lines.get(unit))
        if verdict is not None:
            pieces[unit].append(Piece(row.started_at, int(verdict), 1))
    return of_pieces(evidence, pieces)


def live(evidence: Evidence, task_id: int, since: datetime, until: datetime) -> datetime | None:
    """The onset from the task's raw results started in [since, until) (the rule's window,
    cut at the subject's last resolution). None when there are none (older than the raw
    retention): the caller counts from the first confident evaluation, as before."""
    route_ids = sorted({route for route, _ in evidence.units})
    return of_rows(evidence, window.raw_results(task_id, route_ids, since, until))
