"""Partitioned raw results: how long the online migration takes on a populated table, how long
writes stall meanwhile, and what retention costs (dropping a day's partition vs the former
batched DELETE of a day, same data), at 90 days of data by default.

    make bench-partitions                  # 90 days of 50 routes x 3 regions every 5 minutes
    make bench-partitions ARGS="--days 30"

Two databases of their own (dropped and rebuilt each run): routewatch_bench_migrate (loaded at
migration 0016, then migrated to 0017 while a writer inserts a row every 20 ms and a reader
reads a route's last hour) and routewatch_bench_retention (loaded at 0017, into daily
partitions).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bench_scale  # noqa: E402

WRITE_SQL = """
INSERT INTO monitor_proberesult (route_id, region_id, started_at, http2, body_encoding, cold,
  prefix_mode, http_version, token_source, outcome, error_kind, error_detail, text)
VALUES (%s, %s, now(), false, 'json', false, 'stable', '', '', 'ok', '', '', '')
"""
CHECKSUM_SQL = (
    "SELECT count(*), sum(hashtext(r::text)::bigint) FROM monitor_proberesult r WHERE id <= %s"
)


def _url(admin_url: str, name: str) -> str:
    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))


def _recreate(admin_url: str, name: str) -> str:
    import psycopg

    with psycopg.connect(_url(admin_url, "postgres"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return _url(admin_url, name)


def _manage(url: str, *args: str) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args, "--noinput", "-v0"],
        check=True,
        env={**os.environ, "DATABASE_URL": url},
    )


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


class Load(threading.Thread):
    """A writer (or a reader) hitting the table every `every` seconds until stopped; keeps
    each statement's latency."""

    def __init__(self, url: str, sql: str, params: list[object], every: float) -> None:
        super().__init__(daemon=True)
        self.url, self.sql, self.params, self.every = url, sql, params, every
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.errors = 0

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    conn.execute(self.sql, self.params).fetchall() if "SELECT" in self.sql[
                        :10
                    ] else conn.execute(self.sql, self.params)
                except psycopg.Error:
                    self.errors += 1
                self.latencies.append(time.perf_counter() - t0)
                self.stop.wait(self.every)


def migrate_populated(admin_url: str, days: int) -> None:
    import django
    from django.db import connection

    url = _recreate(admin_url, "routewatch_bench_migrate")
    _manage(url, "migrate")
    _manage(url, "migrate", "monitor", "0016")
    os.environ["DATABASE_URL"] = url
    django.setup()
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    bench_scale.load_raw(now, days)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) monitor_proberesult")
        cursor.execute("SELECT max(id), min(route_id), min(region_id) FROM monitor_proberesult")
        top, route, region = cursor.fetchone()
        t0 = time.perf_counter()
        cursor.execute(CHECKSUM_SQL, [top])
        before = cursor.fetchone()
        checksum_s = time.perf_counter() - t0
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('monitor_proberesult'))")
        size = cursor.fetchone()[0]
    connection.close()
    writer = Load(url, WRITE_SQL, [route, region], 0.02)
    reader = Load(
        url,
        "SELECT count(*) FROM monitor_proberesult WHERE route_id = %s "
        "AND started_at > now() - interval '1 hour'",
        [route],
        0.02,
    )
    writer.start()
    reader.start()
    time.sleep(1)
    t0 = time.perf_counter()
    _manage(url, "migrate", "monitor", "0017")
    took = time.perf_counter() - t0
    time.sleep(1)
    writer.stop.set()
    reader.stop.set()
    writer.join()
    reader.join()
    with connection.cursor() as cursor:
        cursor.execute(CHECKSUM_SQL, [top])
        after = cursor.fetchone()
        cursor.execute("SELECT relkind FROM pg_class WHERE relname = 'monitor_proberesult'")
        kind = cursor.fetchone()[0]
    connection.close()
    print(
        f"\nmigration 0017 on {before[0]:,} rows ({size}, {days} days), writes and reads going on"
    )
    print(
        f"  migration wall time                {took:8.1f} s   (checksum scan alone {checksum_s:.1f} s)"
    )
    print(
        f"  rows and checksum kept             {'yes' if after == before else 'NO'}"
        f"   partitioned: {'yes' if kind == 'p' else 'NO'}"
    )
    for name, load in (("writes", writer), ("reads", reader)):
        ms = [x * 1000 for x in load.latencies]
        print(
            f"  {name} during it: {len(ms):5} done, {load.errors} failed, "
            f"p50 {_p(ms, 0.5):6.1f} ms, p99 {_p(ms, 0.99):7.1f} ms, longest {max(ms):7.1f} ms"
        )


def retention_cost(admin_url: str, days: int) -> None:
    from django.db import connection

    from monitor import partitions
    from monitor.models import ProbeResult

    url = _recreate(admin_url, "routewatch_bench_retention")
    _manage(url, "migrate")
    connection.close()
    connection.settings_dict["NAME"] = "routewatch_bench_retention"
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = now - timedelta(days=days)
    for n in range(days + 2):
        partitions.create_day(start + timedelta(days=n))
    bench_scale.load_raw(now, days)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE)")
    d0 = partitions.day_start(start)  # partial first day
    d1, d2 = d0 + timedelta(days=1), d0 + timedelta(days=2)
    partitions.drop_expired(d1)  # the partial day, untimed
    rows_d1 = ProbeResult.objects.filter(started_at__gte=d1, started_at__lt=d2).count()
    rows_d2 = ProbeResult.objects.filter(
        started_at__gte=d2, started_at__lt=d2 + timedelta(days=1)
    ).count()
    total = ProbeResult.objects.count()
    # The former retention: ids in batches of 20,000, deleted through the ORM (a day: d2).
    t0 = time.perf_counter()
    while True:
        ids = list(
            ProbeResult.objects.filter(
                started_at__gte=d2, started_at__lt=d2 + timedelta(days=1)
            ).values_list("id", flat=True)[:20_000]
        )
        if not ids:
            break
        ProbeResult.objects.filter(id__in=ids).delete()
    delete_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    done = partitions.drop_expired(d2)  # d1's partition, whole
    drop_s = time.perf_counter() - t0
    assert done.dropped == [partitions.partition_name(d1)], done
    print(f"\nretention at {days} days of data ({total:,} rows, {rows_d1:,} rows a day)")
    print(f"  DELETE of a day (former way)       {delete_s * 1000:9.1f} ms  ({rows_d2:,} rows)")
    print(
        f"  drop of a day's partition          {drop_s * 1000:9.1f} ms  ({rows_d1:,} rows)"
        f"  {'ok' if drop_s < 1 else 'MISSES TARGET'} (< 1 s)"
    )
    print(f"  DELETE / drop                      {delete_s / drop_s:9.0f}x")
    print(
        f"  former DELETE per row              {delete_s / max(rows_d2, 1) * 1e6:9.1f} us "
        f"-> {delete_s / max(rows_d2, 1) * 5_184_000 / 60:.0f} min for a day at 3,600 "
        "combinations a minute (5.2M rows)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--skip-migration", action="store_true")
    ns = parser.parse_args()
    admin_url = os.environ["DATABASE_URL"]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "monitor.settings")
    if not ns.skip_migration:
        migrate_populated(admin_url, ns.days)
    else:
        import django

        os.environ["DATABASE_URL"] = _recreate(admin_url, "routewatch_bench_retention")
        django.setup()
    retention_cost(admin_url, ns.days)


if __name__ == "__main__":
    main()
