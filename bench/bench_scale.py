"""Scale benchmark: a year of probes (50 routes x 3 regions every 5 minutes = 15.8M rows).

    make bench-scale                 # loads once into database routewatch_bench, then measures
    make bench-scale ARGS=--reload   # drops and reloads the data set

Measures, in the same run, the reads the pages need, through the page functions themselves
(monitor.pages.route.series for a route's chart, monitor.answer.board.current for the overview),
against naive percentile_cont over raw rows (ratio = naive / rollup), and ingest throughput
through the real ingest path (rows + slots + rollups) against Django's bulk_create of the same
rows (no slots, no rollups). Targets: each read <= 50 ms and >= 30x faster than naive; ingest
>= 5,000 results/s. Also printed: the overview rebuild beat does in the background.

The year of raw rows is generated inside PostgreSQL (generate_series) in time order, as ingest
writes them, and its rollups are built with SQL that buckets exactly like monitor.stats.hist (checked
on a sample before measuring). The tables are then vacuumed, and each read runs once before
it is timed: the naive reads' best case, a route's rows found through the (route, started_at)
index on all-visible pages already in memory. (Up to migration 0009 that index carried the
measurement columns, so the naive read never visited the table: 16 ms instead of ~28 ms, with
the rollup read then at 2.3 ms. No page computes percentiles from raw rows, so they went.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import history  # noqa: E402

BENCH_DB = "routewatch_bench"
ROUTES = 50
REGIONS = 3
TASKS = 5  # 10 routes each
INTERVAL = timedelta(minutes=5)
DAYS = 365
LOAD_CHUNK = timedelta(days=10)


def _bench_url(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{BENCH_DB}"))


def _ensure_database(admin_url: str, *, drop: bool) -> None:
    import psycopg

    parts = urlsplit(admin_url)
    maintenance = urlunsplit(parts._replace(path="/postgres"))
    import dj_database_url

    cfg = dj_database_url.parse(maintenance)
    with psycopg.connect(
        dbname="postgres",
        user=cfg["USER"] or None,
        password=cfg["PASSWORD"] or None,
        host=cfg["HOST"] or None,
        port=cfg["PORT"] or None,
        autocommit=True,
    ) as conn:
        if drop:
            conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone()
        if not exists:
            conn.execute(f"CREATE DATABASE {BENCH_DB}")


def _timeit(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()  # warm the cache once: pages are read repeatedly
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def load_config() -> list[history.Pair]:
    """The configuration (tasks, routes, regions) in an emptied database; its pairs."""
    from django.db import transaction

    from monitor.models import ProbeResult, Provider, Region, Rollup, Route, Task

    print("loading: configuration", flush=True)
    with transaction.atomic():
        ProbeResult.objects.all().delete()
        Rollup.objects.all().delete()
        Task.objects.all().delete()
        Route.objects.all().delete()
        Provider.objects.all().delete()
        Region.objects.all().delete()
        regions = [Region.objects.create(name=f"R{i}", slug=f"r{i}") for i in range(REGIONS)]
        routes = []
        for p in range(ROUTES // 5):
            provider = Provider.objects.create(
                name=f"P{p}", slug=f"p{p}", base_url=f"https://p{p}.example/v1"
            )
            for m in range(5):
                routes.append(Route.objects.create(provider=provider, model_id=f"m{m}"))
        tasks = []
        for t in range(TASKS):
            task = Task.objects.create(
                name=f"T{t}",
                slug=f"t{t}",
                user_template="x",
                probe_interval_s=300,
                min_pass_rate=0.5,
                ttft_p95_budget_ms=2000,
                e2e_p95_budget_ms=8000,
            )
            task.routes.set(routes[t * 10 : (t + 1) * 10])
            task.regions.set(regions)
            tasks.append(task)
    return [history.pair(task.pk, route.pk) for task in tasks for route in task.routes.all()]


def load_raw(now: datetime, days: int) -> None:
    """The configuration and `days` of raw rows up to `now` (no rollups; bench_partitions)."""
    pairs = load_config()
    history.load_raw(pairs, now - timedelta(days=days), now, INTERVAL, LOAD_CHUNK)


def load(now: datetime, days: int) -> None:
    pairs = load_config()
    print(f"loading: {ROUTES * REGIONS * days * 288:,} raw rows and their rollups", flush=True)
    history.load(pairs, now - timedelta(days=days), now, INTERVAL, LOAD_CHUNK)


def measure(now: datetime, repeat: int) -> list[tuple[str, float, float, float]]:
    """The page functions themselves (monitor.pages.route.series, monitor.answer.board.current)
    against naive percentile_cont over raw rows."""
    from django.db import connection

    from monitor.answer import board
    from monitor.models import GRAIN_DAY, GRAIN_HOUR, Route, Task
    from monitor.pages import route as pages_route
    from monitor.pages.common import Range

    route = Route.objects.order_by("pk")[7]
    task = Task.objects.get(routes=route)
    month = now - timedelta(days=30)
    year = now - timedelta(days=DAYS)
    month_hourly = Range("30dh", "30 d", timedelta(days=30), GRAIN_HOUR)
    year_daily = Range("365d", "1 year", timedelta(days=DAYS), GRAIN_DAY)

    def naive_series(trunc: str, since: datetime) -> list[tuple[object, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                SELECT date_trunc('{trunc}', started_at),
                  percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY ttft_ms),
                  percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY e2e_ms),
                  percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY tps)
                FROM monitor_proberesult
                WHERE route_id = %s AND started_at >= %s AND started_at < %s AND outcome = 'ok'
                GROUP BY 1 ORDER BY 1
                """,
                [route.pk, since, now],
            )
            return list(cursor.fetchall())

    def naive_overview() -> list[tuple[object, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                SELECT task_id, route_id, region_id,
                  percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY ttft_ms),
                  percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY e2e_ms),
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY tps),
                  avg(quality_pass::int), max(started_at)
                FROM monitor_proberesult
                WHERE started_at >= %s AND outcome = 'ok'
                GROUP BY 1, 2, 3
                """,
                [now - board.WINDOW],
            )
            return list(cursor.fetchall())

    reads: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        (
            "route 30 d hourly p50/p95/p99",
            lambda: pages_route.series(route, task, None, month_hourly, now),
            lambda: naive_series("hour", month),
        ),
        ("overview, all tasks x regions", lambda: board.current(now), naive_overview),
        (
            "route 1 year daily",
            lambda: pages_route.series(route, task, None, year_daily, now),
            lambda: naive_series("day", year),
        ),
    ]
    board.refresh(now)  # as beat does, twice per refresh interval
    results = []
    for name, fast, naive in reads:
        fast_ms = _timeit(fast, repeat)
        naive_ms = _timeit(naive, max(2, repeat // 10))
        results.append((name, _p(fast_ms, 0.5), _p(fast_ms, 0.95), statistics.median(naive_ms)))
    # Not a page read: the work beat does in the background to keep the snapshot fresh.
    rebuild_ms = _timeit(lambda: board.refresh(now), max(3, repeat // 3))
    results.append(("(overview rebuild, by beat)", _p(rebuild_ms, 0.5), _p(rebuild_ms, 0.95), 0.0))
    return results


def measure_ingest(now: datetime, count: int, batch: int) -> tuple[float, float]:
    from django.db import connection, transaction

    from monitor.models import ProbeResult, Region, Route, Task
    from monitor.pipeline.ingest import results as ingest
    from monitor.pipeline.ingest import rows as ingest_rows

    task = Task.objects.get(slug="t0")
    routes = list(task.routes.order_by("pk"))
    regions = list(Region.objects.order_by("pk"))
    base = now + timedelta(days=1)  # future slots: no clash with the loaded year

    def payloads(offset: int) -> list[dict[str, object]]:
        out = []
        for i in range(count):
            at = base + timedelta(seconds=offset + i)
            out.append(
                {
                    "task_id": task.pk,
                    "route_id": routes[i % len(routes)].pk,
                    "region_id": regions[i % len(regions)].pk,
                    "slot_at": at.isoformat(),
                    "started_at": at.isoformat(),
                    "ttft_ms": 300.0 + i % 500,
                    "e2e_ms": 2000.0 + i % 900,
                    "tps": 100.0 + i % 50,
                    "outcome": "ok",
                    "input_tokens": 1000,
                    "output_tokens": 200,
                    "quality_pass": i % 10 != 0,
                    "http_version": "HTTP/1.1",
                    "text": "42",
                }
            )
        return out

    real = payloads(0)
    t0 = time.perf_counter()
    for i in range(0, count, batch):
        ingest.ingest(real[i : i + batch])
    real_s = time.perf_counter() - t0

    # Baseline: the same rows through a plain INSERT, no slot update, no rollups.
    plain = payloads(10 * count)
    prices = {r.pk: r for r in Route.objects.all()}
    names = [f.attname for f in ProbeResult._meta.concrete_fields if f.name != "id"]
    t0 = time.perf_counter()
    for i in range(0, count, batch):
        stamp = datetime.now(UTC)
        rows = [
            ProbeResult(
                **dict(zip(names, ingest_rows.row_from_payload(p, prices, stamp), strict=True))
            )
            for p in plain[i : i + batch]
        ]
        with transaction.atomic():
            ProbeResult.objects.bulk_create(rows)
    plain_s = time.perf_counter() - t0
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM monitor_proberesult WHERE started_at > %s", [now])
        cursor.execute("DELETE FROM monitor_rollup WHERE bucket_start > %s", [now])
        cursor.execute("DELETE FROM monitor_hourstrip WHERE day > %s", [now])
    return count / real_s, count / plain_s


def _rebuild_every() -> str:
    from django.conf import settings

    return f"{settings.CELERY_BEAT_SCHEDULE['overview']['schedule']:g} s"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reload", action="store_true", help="drop and reload the data set")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--days", type=int, default=DAYS, help="days of data (365 = the target)")
    parser.add_argument("--ingest", type=int, default=50_000, help="results for the ingest test")
    ns = parser.parse_args()

    admin_url = os.environ["DATABASE_URL"]
    _ensure_database(admin_url, drop=ns.reload)
    os.environ["DATABASE_URL"] = _bench_url(admin_url)
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v0"], check=True
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "monitor.settings")
    import django

    django.setup()
    from monitor.models import ProbeResult

    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    history.check_buckets()
    loaded = ProbeResult.objects.filter(started_at__gt=now - timedelta(days=2)).exists()
    if ns.reload or not loaded:
        load(now, ns.days)
    else:
        latest = ProbeResult.objects.order_by("-started_at").values_list("started_at", flat=True)[0]
        now = latest.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        print(
            f"using the data set already loaded (up to {latest:%Y-%m-%d %H:%M}); --reload to redo"
        )

    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(greatest(c.reltuples, 0))::bigint FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'monitor_proberesult'::regclass"
        )
        rows = cursor.fetchone()[0]
        cursor.execute(
            "SELECT sum(c.relallvisible)::float / greatest(sum(c.relpages), 1) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'monitor_proberesult'::regclass"
        )
        visible = cursor.fetchone()[0]
    print(f"\nraw rows (estimate): {rows:,}; heap pages all-visible: {visible:.0%}")
    print(f"{'read':34} {'rollup p50':>11} {'p95':>9} {'naive':>10} {'naive/rollup':>13}")
    for name, p50, p95, naive in measure(now, ns.repeat):
        if not naive:
            print(f"{name:34} {p50:9.1f}ms {p95:7.1f}ms  (every {_rebuild_every()})")
            continue
        flag = "ok" if p95 <= 50 and naive / p50 >= 30 else "MISSES TARGET"
        print(f"{name:34} {p50:9.2f}ms {p95:7.2f}ms {naive:8.0f}ms {naive / p50:12.0f}x  {flag}")
    real, plain = measure_ingest(now, ns.ingest, 500)
    flag = "ok" if real >= 5000 else "MISSES TARGET"
    print(
        f"\ningest through monitor.pipeline.ingest: {real:,.0f} results/s "
        f"(bulk_create baseline {plain:,.0f}/s, ratio {real / plain:.2f})  {flag}"
    )


if __name__ == "__main__":
    main()
