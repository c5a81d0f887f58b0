"""Daily partitions of the raw results (monitor_proberesult, partitioned by started_at).

- `ensure_ahead`: creates the partitions of the coming days (beat, hourly), each built apart
  and ATTACHed (SHARE UPDATE EXCLUSIVE on the parent: reads and writes go on), taking over
  rows for its day that fell into the default partition meanwhile.
- `drop_expired`: retention. A daily partition whose whole range is older than the cutoff is
  dropped (a catalog change, not a rewrite); one that still may hold rows at or past the cutoff
  never is (its upper bound is checked, and its rows). Rows of the other partitions (the
  pre-partitioning table `monitor_proberesult_legacy` until it ages out whole, and the default
  partition) are deleted in batches, as before.

Plain PostgreSQL declarative partitioning: no extension needed (the embedded database has none).
A raw row may outlive the window by up to a day (its day's partition goes once all of it has).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction

log = logging.getLogger(__name__)

TABLE = "monitor_proberesult"
DEFAULT_PART = f"{TABLE}_default"
LEGACY = f"{TABLE}_legacy"
# How long a retention or creation step waits for a lock before it gives up until the next run
# (so it never queues every reader and writer behind itself).
LOCK_TIMEOUT = "2s"

_BOUND = re.compile(r"FROM \((MINVALUE|'[^']*')\) TO \((MAXVALUE|'[^']*')\)")


@dataclass(frozen=True)
class Partition:
    name: str
    low: datetime | None  # None: MINVALUE (or the default partition)
    high: datetime | None  # None: MAXVALUE (or the default partition)
    default: bool = False

    @property
    def daily(self) -> bool:
        return (
            self.low is not None
            and self.high is not None
            and self.high - self.low == timedelta(days=1)
            and self.name == partition_name(self.low)
        )


def partition_name(day: datetime) -> str:
    return f"{TABLE}_p{day:%Y%m%d}"


def day_start(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _bound(text: str) -> datetime | None:
    if text in ("MINVALUE", "MAXVALUE"):
        return None
    return datetime.fromisoformat(text.strip("'")).astimezone(UTC)


def partitions() -> list[Partition]:
    """The partitions of the results table, oldest first (the default last)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
            [TABLE],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound in rows:
        if bound == "DEFAULT":
            found.append(Partition(name, None, None, default=True))
            continue
        match = _BOUND.search(bound)
        if match is None:
            continue
        found.append(Partition(name, _bound(match.group(1)), _bound(match.group(2))))
    epoch = datetime.min.replace(tzinfo=UTC)
    return sorted(found, key=lambda p: (p.default, p.low or epoch))


def create_day(day: datetime) -> bool:
    """Create the partition of one UTC day unless it exists or overlaps one; returns whether it
    was created. Rows of that day already in the default partition move into it."""
    low = day_start(day)
    high = low + timedelta(days=1)
    name = partition_name(low)
    for p in partitions():
        if p.name == name:
            return False
        if not p.default and (p.high is None or p.high > low) and (p.low is None or p.low < high):
            return False  # covered by another partition (the legacy one)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cursor.execute(f"CREATE TABLE {name} (LIKE {TABLE} INCLUDING DEFAULTS)")
        cursor.execute(
            f"ALTER TABLE {name} ADD CONSTRAINT {name}_range "
            "CHECK (started_at IS NOT NULL AND started_at >= %s AND started_at < %s)",
            [low, high],
        )
        cursor.execute(
            f"WITH moved AS (DELETE FROM {DEFAULT_PART} WHERE started_at >= %s "
            f"AND started_at < %s RETURNING *) INSERT INTO {name} SELECT * FROM moved",
            [low, high],
        )
        cursor.execute(
            f"ALTER TABLE {TABLE} ATTACH PARTITION {name} FOR VALUES FROM (%s) TO (%s)",
            [low, high],
        )
        # The CHECK spared the attach its scan; the partition bound says the same from now on.
        cursor.execute(f"ALTER TABLE {name} DROP CONSTRAINT {name}_range")
    return True


def analyze(low: datetime, high: datetime) -> list[str]:
    """ANALYZE the daily partitions holding [low, high) after a bulk load:
    ingest's exactly-once check looks each row's slot up in them, and on a partition filled
    faster than autovacuum analyzes it the planner has no statistics and may pick an index
    that scans a route's whole day per row (3.4 s against 0.5 s for 6,000 rows). Steady
    probing leaves this to autovacuum. Returns the partitions analyzed."""
    names = [
        p.name
        for p in partitions()
        if not p.default and (p.low is None or p.low < high) and (p.high is None or p.high > low)
    ]
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f"ANALYZE {name}")
    return names


def ensure_ahead(days: int = 3, now: datetime | None = None) -> int:
    """Partitions for today and the `days` after it; returns how many were created."""
    today = day_start(now or datetime.now(UTC))
    return sum(create_day(today + timedelta(days=n)) for n in range(days + 1))


@dataclass(frozen=True)
class Retention:
    dropped: list[str]
    deleted: int


def drop_expired(cutoff: datetime, batch: int = 20_000) -> Retention:
    """Drop every partition whose whole range is older than `cutoff`; delete older rows from
    the partitions that are not daily (legacy, default) in batches."""
    dropped: list[str] = []
    deleted = 0
    for p in partitions():
        if p.default or p.high is None or p.high > cutoff:
            continue
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            # Belt and braces: the bound already says so, the rows must agree.
            cursor.execute(
                f"SELECT EXISTS (SELECT 1 FROM {p.name} WHERE started_at >= %s)", [cutoff]
            )
            ((newer,),) = cursor.fetchall()
            if newer:
                log.error("kept partition %s: it holds rows newer than the cutoff", p.name)
                continue
            cursor.execute(f"DROP TABLE {p.name}")
        dropped.append(p.name)
    for p in partitions():
        if p.daily:
            continue
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"DELETE FROM {p.name} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {p.name} "
                    "WHERE started_at < %s LIMIT %s))",
                    [cutoff, batch],
                )
                n = cursor.rowcount
            deleted += n
            if n < batch:
                break
    return Retention(dropped, deleted)
