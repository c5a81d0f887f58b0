"""Synthetic history written straight into PostgreSQL, for the benchmarks that need a table of
realistic size before they measure (bench_scale, bench_load).

Raw rows are generated inside PostgreSQL (generate_series) in time order, every pair and region
interleaved, as ingest writes them: one route's day is spread over the heap, not packed in a few
pages. Their rollups and hour strips are built with SQL that buckets exactly like
monitor.stats.hist (`check_buckets`), then the tables are vacuumed and analyzed, as autovacuum
leaves them soon after a load like this one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

# Rows of (task, route) pairs x every region, one every `step`, in time order. Each pair has its
# own speed; ~1% errors; quality passes 90% of graded probes.
RAW_SQL = """
INSERT INTO monitor_proberesult (
  task_id, route_id, region_id, slot_at, started_at, http2, body_encoding,
  cold, prefix_mode, ttft_ms, ttfb_ms, e2e_ms, tps, output_tokens,
  input_tokens, token_source, outcome, error_kind, error_detail, text,
  http_version, quality_pass, cost_usd, reference, ttfat_ms)
SELECT task, route, region, ts, ts, false, 'json', false, 'stable',
  CASE WHEN r < 0.99 THEN ttft * exp(0.3 * (r2 - 0.5)) END,
  CASE WHEN r < 0.99 THEN ttft * 0.3 END,
  CASE WHEN r < 0.99 THEN ttft + 200000.0 / (tps * exp(0.2 * (r3 - 0.5))) END,
  CASE WHEN r < 0.99 THEN tps * exp(0.2 * (r3 - 0.5)) END,
  200, 1000, 'usage',
  CASE WHEN r < 0.99 THEN 'ok' ELSE 'error' END,
  CASE WHEN r < 0.99 THEN '' ELSE 'http_5xx' END, '', '', 'HTTP/1.1',
  r2 < 0.9, 0.0014, true,
  CASE WHEN r < 0.99 THEN ttft * exp(0.3 * (r2 - 0.5)) END
FROM (
  SELECT s.task, s.route, g.id AS region, ts, s.ttft, s.tps,
    random() AS r, random() AS r2, random() AS r3
  FROM generate_series(%(start)s::timestamptz, %(end)s::timestamptz - interval '1 microsecond',
                       %(step)s::interval) AS ts
  CROSS JOIN unnest(%(tasks)s::int[], %(routes)s::int[], %(ttft)s::float8[], %(tps)s::float8[])
    AS s(task, route, ttft, tps)
  CROSS JOIN monitor_region AS g
) AS rows
ORDER BY ts, route, region
"""

HIST_SQL = """
CREATE OR REPLACE FUNCTION rw_bench_hist(vals float8[], low float8, size int) RETURNS int[]
LANGUAGE sql IMMUTABLE AS $$
  SELECT coalesce(array_agg(CASE WHEN half = 0 THEN b ELSE c END ORDER BY b, half), '{}')
  FROM (
    SELECT b, count(*)::int AS c FROM (
      SELECT least(size - 1, CASE WHEN v <= low THEN 0
                                  ELSE floor(ln(v / low) / ln(1.05))::int + 1 END) AS b
      FROM unnest(vals) AS v WHERE v IS NOT NULL
    ) AS x GROUP BY b
  ) AS y CROSS JOIN (VALUES (0), (1)) AS h(half)
$$;
"""


@dataclass(frozen=True)
class Pair:
    """A task probing a route (from every region), at the route's own typical speed."""

    task: int
    route: int
    ttft_ms: float
    tps: float


def pair(task: int, route: int) -> Pair:
    return Pair(task, route, float(200 + 40 * (route % 25)), float(40 + 30 * (route % 30)))


def check_buckets() -> None:
    """The SQL bucketing used to build the rollups matches monitor.stats.hist exactly."""
    from django.db import connection

    from monitor.stats import hist

    values = [0.5, 1.0, 1.01, 37.3, 999.9, 1620.0, 75100.0, 3e6]
    with connection.cursor() as cursor:
        cursor.execute(HIST_SQL)
        cursor.execute(
            "SELECT rw_bench_hist(%s::float8[], %s, %s)", [values, hist.MS.low, hist.MS.size]
        )
        sql_hist = cursor.fetchone()[0]
    assert sql_hist == hist.build(values, hist.MS), "SQL and Python bucketing differ"


def load_raw(
    pairs: list[Pair], start: datetime, end: datetime, step: timedelta, chunk: timedelta
) -> int:
    """Raw rows of every pair x region every `step` in [start, end), a transaction a chunk;
    returns how many."""
    from django.db import connection

    arrays: dict[str, Any] = {
        "tasks": [p.task for p in pairs],
        "routes": [p.route for p in pairs],
        "ttft": [p.ttft_ms for p in pairs],
        "tps": [p.tps for p in pairs],
    }
    written = 0
    with connection.cursor() as cursor:
        chunk_start = start
        while chunk_start < end:
            chunk_end = min(chunk_start + chunk, end)
            params: dict[str, Any] = {**arrays, "start": chunk_start, "end": chunk_end}
            params["step"] = step
            cursor.execute(RAW_SQL, params)
            written += cursor.rowcount
            chunk_start = chunk_end
    return written


def build_rollups(start: datetime, end: datetime) -> None:
    """Hourly and daily rollups of the raw rows in [start, end) (the hours and days they touch
    must hold no rollup yet), then every hour strip, then VACUUM (ANALYZE)."""
    from django.db import connection

    from monitor.stats import hist

    with connection.cursor() as cursor:
        cursor.execute(HIST_SQL)
        # The hour strips in one statement at the end, not row by row through their trigger.
        cursor.execute("ALTER TABLE monitor_rollup DISABLE TRIGGER rw_hour_strip_write")
        for grain in ("hour", "day"):
            cursor.execute(
                f"""
                INSERT INTO monitor_rollup (grain, bucket_start, task_id, route_id, region_id,
                  count_ok, count_error, count_missed, error_kinds, graded, passed,
                  cache_reported, cache_hits, input_tokens, output_tokens, cached_tokens,
                  cost_usd, ttft_hist, e2e_hist, tps_hist, ttfat_hist, ref_ttft_hist,
                  ref_ttfat_hist, ref_e2e_hist, last_probe_at, last_ok_at)
                SELECT '{grain}', date_trunc('{grain}', started_at), task_id, route_id,
                  region_id,
                  count(*) FILTER (WHERE outcome = 'ok'),
                  count(*) FILTER (WHERE outcome = 'error'),
                  count(*) FILTER (WHERE outcome = 'missed'),
                  CASE WHEN count(*) FILTER (WHERE error_kind = 'http_5xx') > 0
                       THEN jsonb_build_object(
                         'http_5xx', count(*) FILTER (WHERE error_kind = 'http_5xx'))
                       ELSE '{{}}'::jsonb END,
                  count(quality_pass), count(*) FILTER (WHERE quality_pass),
                  0, 0, sum(input_tokens), sum(output_tokens), 0, sum(cost_usd),
                  rw_bench_hist(array_agg(ttft_ms), {hist.MS.low}, {hist.MS.size}),
                  rw_bench_hist(array_agg(e2e_ms), {hist.MS.low}, {hist.MS.size}),
                  rw_bench_hist(array_agg(tps), {hist.TPS.low}, {hist.TPS.size}),
                  rw_bench_hist(array_agg(ttfat_ms), {hist.MS.low}, {hist.MS.size}),
                  rw_bench_hist(array_agg(ttft_ms) FILTER (WHERE reference),
                                {hist.MS.low}, {hist.MS.size}),
                  rw_bench_hist(array_agg(ttfat_ms) FILTER (WHERE reference),
                                {hist.MS.low}, {hist.MS.size}),
                  rw_bench_hist(array_agg(e2e_ms) FILTER (WHERE reference),
                                {hist.MS.low}, {hist.MS.size}),
                  max(started_at), max(started_at) FILTER (WHERE outcome = 'ok')
                FROM monitor_proberesult
                WHERE started_at >= %s AND started_at < %s
                GROUP BY GROUPING SETS (
                  (date_trunc('{grain}', started_at), task_id, route_id, region_id),
                  (date_trunc('{grain}', started_at), task_id, route_id))
                """,
                [start, end],
            )
        cursor.execute("ALTER TABLE monitor_rollup ENABLE TRIGGER rw_hour_strip_write")
        cursor.execute("SELECT rw_hour_strips_rebuild()")
        cursor.execute("VACUUM (ANALYZE)")


def load(
    pairs: list[Pair], start: datetime, end: datetime, step: timedelta, chunk: timedelta
) -> None:
    """Partitions for the days, the raw rows, their rollups; prints what it did."""
    from monitor import partitions

    # The days' partitions first (rows of days without one would land in the default one).
    day = start
    while day < end + timedelta(days=2):
        partitions.create_day(day)
        day += timedelta(days=1)
    t0 = time.perf_counter()
    rows = load_raw(pairs, start, end, step, chunk)
    print(f"history: {rows:,} raw rows in {time.perf_counter() - t0:.0f} s", flush=True)
    t0 = time.perf_counter()
    build_rollups(start, end)
    print(f"history: rollups, hour strips, vacuum in {time.perf_counter() - t0:.0f} s", flush=True)
