"""What the stored results say about the region workers during a window (bench_load,
bench_region): probes in flight, start lag, missed slots by cause."""

from __future__ import annotations

import bisect
from datetime import datetime, timedelta
from typing import Any

# No probe lasts longer than this (the longest deadline allowed, monitor.limits): a probe in
# flight at a window's start started at most this long before it.
LONGEST_PROBE = timedelta(seconds=900)
LATE = "started late"
UNSENT = "not sent"


def has_start_lag(cursor: Any) -> bool:
    """Does this database record start lags (the region worker's monitor_proberesult column)?"""
    cursor.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_name = 'monitor_proberesult' "
        "AND column_name = 'start_lag_ms'"
    )
    return cursor.fetchone() is not None


def start_lags_ms(cursor: Any, since: datetime, until: datetime) -> list[float]:
    """Start lag (ms) of the probes planned in [since, until): every probe a worker started or
    refused as too late (a scenario's calls have none)."""
    cursor.execute(
        "SELECT start_lag_ms FROM monitor_proberesult WHERE slot_at >= %s AND slot_at < %s "
        "AND start_lag_ms IS NOT NULL",
        [since, until],
    )
    return [float(r[0]) for r in cursor.fetchall()]


def missed(cursor: Any, since: datetime, until: datetime) -> tuple[int, int, int]:
    """Missed results of the slots in [since, until), by cause: (started late: a worker did
    not run it, past its start bound; not sent: the tick created the slot too late to send
    it; the rest: no result by the deadline)."""
    cursor.execute(
        "SELECT count(*) FILTER (WHERE error_detail LIKE %s), "
        "count(*) FILTER (WHERE error_detail LIKE %s), count(*) FROM monitor_proberesult "
        "WHERE outcome = 'missed' AND slot_at >= %s AND slot_at < %s",
        [LATE + "%", UNSENT + "%", since, until],
    )
    late, unsent, total = cursor.fetchone()
    return int(late), int(unsent), int(total) - int(late) - int(unsent)


def in_flight(
    cursor: Any, since: datetime, until: datetime, every_s: float = 5.0
) -> list[tuple[datetime, int]]:
    """Probes in flight (started, not yet ended: started_at to started_at + e2e) at each
    `every_s` in [since, until), scenario calls included, from the stored results."""
    cursor.execute(
        "SELECT extract(epoch FROM started_at), e2e_ms FROM monitor_proberesult "
        "WHERE started_at >= %s AND started_at < %s AND outcome <> 'missed' "
        "AND e2e_ms IS NOT NULL",
        [since - LONGEST_PROBE, until],
    )
    rows = cursor.fetchall()
    starts = sorted(float(s) for s, _ in rows)
    ends = sorted(float(s) + float(e) / 1000 for s, e in rows)
    out = []
    t = since
    while t < until:
        at = t.timestamp()
        out.append((t, bisect.bisect_right(starts, at) - bisect.bisect_right(ends, at)))
        t += timedelta(seconds=every_s)
    return out


def mean(values: list[int] | list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
