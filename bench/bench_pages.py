"""Page benchmark: server time of every dashboard page on the scale benchmark's data set.

    make bench-pages                          # the year: 15.8M raw rows (loads once, slowly)
    make bench-pages ARGS="--days 30"         # a month (1.3M rows), database routewatch_pages_30d
    make bench-pages ARGS="--days 30 --reload"

Loads with bench/bench_scale.py's loader (imported, not copied) into a database of its own per
size (routewatch_pages_365d for the year), loaded once and reused by later runs. Server
time is one request through the whole Django stack (middleware, session, view, template) with
Django's test client, repeated; p50 and p95 per page. Target: p95 <= 100 ms on the year.
The read API (/api/v1/, with an API token) is timed the same way; its route answer's target is
p95 <= 20 ms (issue 14).
Baseline, in the same run: the naive reads of the same figures from raw rows
(percentile_cont over probe results, an unbounded ORDER BY for the log); ratio = naive / page p50.
The overview is read from its snapshot (monitor.answer.board); "overview, snapshot rebuilt" is the
request that finds it expired and rebuilds it (beat down, or a configuration change).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bench_scale, history  # noqa: E402

TARGET_P95_MS = 100.0
TARGET_API_P95_MS = 20.0
BACKTEST = "alert backtest, latency rule, 30 d"
TARGET_BACKTEST_P95_MS = 2000.0  # issue 32: the admin shows a rule's backtest in under 2 s


def _naive(sql: str, params: list[object]) -> Callable[[], object]:
    def run() -> object:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    return run


NAIVE_BY_TASK_ROUTE_REGION = """
SELECT route_id, region_id,
  percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY ttft_ms),
  percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY e2e_ms),
  percentile_cont(0.5) WITHIN GROUP (ORDER BY tps), avg(quality_pass::int), max(started_at)
FROM monitor_proberesult
WHERE started_at >= %s AND outcome = 'ok' {task}
GROUP BY 1, 2
"""

NAIVE_ROUTE_SERIES = """
SELECT date_trunc(%s, started_at), region_id,
  percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY ttft_ms),
  percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY e2e_ms),
  percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY tps)
FROM monitor_proberesult
WHERE route_id = %s AND task_id = %s AND started_at >= %s AND outcome = 'ok'
GROUP BY 1, 2 ORDER BY 1
"""

NAIVE_LOG = """
SELECT r.* FROM monitor_proberesult AS r ORDER BY started_at DESC, id DESC LIMIT 50
"""


API_ROUTE = "API route answer"


class FullCollections:
    """The collector's full (generation 2) passes, timed by a gc.callbacks hook: each walks
    every tracked object the process holds, and one that lands in a read adds its whole pause
    to that read's server time (the p95 outliers of earlier runs)."""

    def __init__(self) -> None:
        self.pauses: list[float] = []  # ms, in order
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((time.perf_counter() - self._started) * 1000)

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def _timeit_cpu(
    fn: Callable[[], object], repeat: int
) -> tuple[list[float], list[float], list[float]]:
    """Server time and the reading thread's own CPU time (ms) of each of `repeat` reads, after
    one read that warms the caches (as bench_scale._timeit), and the full collections that
    ran during those reads (ms each). The CPU is what a read costs on a busy machine: the
    rest of its server time is its queries and its waits for a CPU."""
    fn()
    times, cpu = [], []
    with FullCollections() as full:
        for _ in range(repeat):
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.thread_time() - c0) * 1000)
    return times, cpu, full.pauses


Measured = tuple[str, list[float], list[float] | None, list[float], list[float]]


def measure(now: datetime, repeat: int) -> list[Measured]:
    """Each page's server time and CPU time over `repeat` reads, beside the naive query it
    replaced."""
    from django.contrib.auth.models import User
    from django.test import Client

    from monitor.api import tokens
    from monitor.models import ApiToken, Route, Task

    user, _ = User.objects.get_or_create(username="bench-pages")
    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    task = Task.objects.order_by("slug").first()
    assert task is not None, "no data set loaded"
    route = task.routes.order_by("pk")[3]
    other = Route.objects.order_by("pk")[17]

    issued = tokens.issue()
    ApiToken.objects.filter(name="bench-pages").delete()
    ApiToken.objects.create(name="bench-pages", prefix=issued.prefix, digest=issued.digest)
    # A fresh client per API request: no session, only the token.
    api_client = Client(SERVER_NAME="localhost")
    api_headers = {"Authorization": f"Bearer {issued.token}"}
    get = _page_reader(client)
    api = _api_reader(api_client, api_headers)
    out = []
    for name, page, naive in _pages(now, task, route, other, get, api):
        page_ms, cpu_ms, full_ms = _timeit_cpu(page, repeat)
        naive_ms = bench_scale._timeit(naive, max(2, repeat // 10)) if naive else None
        out.append((name, page_ms, naive_ms, cpu_ms, full_ms))
    return out


def _page_reader(client: Any) -> Callable[..., Callable[[], object]]:
    def get(url: str, htmx: bool = False) -> Callable[[], object]:
        headers = {"HX-Request": "true", "HX-Target": "overview-body"} if htmx else {}

        def run() -> object:
            response = client.get(url, headers=headers)
            assert response.status_code == 200, (url, response.status_code)
            if getattr(response, "streaming", False):
                return b"".join(response.streaming_content)
            return response.content

        return run

    return get


def _api_reader(
    api_client: Any, api_headers: dict[str, str]
) -> Callable[..., Callable[[], object]]:
    def api(url: str, revalidate: bool = False) -> Callable[[], object]:
        """One API request; `revalidate`: with the ETag of the last answer (a 304 unless the
        snapshot was rebuilt since, which the time of the rebuild then counts in)."""
        etag = ""

        def run() -> object:
            nonlocal etag
            headers = {**api_headers, "If-None-Match": etag} if revalidate else api_headers
            response = api_client.get(url, headers=headers)
            assert response.status_code in (200, 304), (url, response.status_code)
            etag = response["ETag"]
            return response.content

        return run

    return api


def _pages(
    now: datetime,
    task: Any,
    route: Any,
    other: Any,
    get: Callable[..., Callable[[], object]],
    api: Callable[..., Callable[[], object]],
) -> list[tuple[str, Callable[[], object], Callable[[], object] | None]]:
    """(name, read, the naive query it replaced) of every page and API answer measured."""
    from monitor.alerts import backtest
    from monitor.alerts.models import KIND_LATENCY, AlertRule
    from monitor.answer import board

    # A line every probe is past: every hour of every route and region computes its interval.
    # A 60-minute window, typed in: the rule the row has always measured (an empty window now
    # follows the task's probe interval, 100 minutes at this data set's 300 s).
    rule, _ = AlertRule.objects.update_or_create(
        task=task,
        name="bench-pages",
        defaults={"kind": KIND_LATENCY, "threshold_ms": 1.0, "window_minutes": 60},
    )
    day, week, month = (now - timedelta(days=d) for d in (1, 7, 30))
    task_sql = NAIVE_BY_TASK_ROUTE_REGION.replace("{task}", "AND task_id = %s")
    all_sql = (
        NAIVE_BY_TASK_ROUTE_REGION.replace("{task}", "")
        .replace("SELECT route_id", "SELECT task_id, route_id")
        .replace("GROUP BY 1, 2", "GROUP BY 1, 2, 3")
    )
    hour = now - timedelta(hours=1)

    def overview_rebuilt() -> object:
        board.forget()  # as if beat were down: this reader rebuilds the snapshot
        return get("/")()

    return [
        ("overview", get("/"), _naive(all_sql, [day])),
        ("overview (htmx refresh)", get("/", htmx=True), None),
        ("overview, snapshot rebuilt", overview_rebuilt, _naive(all_sql, [day])),
        (f"task {task.slug}, 24 h", get(f"/tasks/{task.slug}/"), _naive(task_sql, [day, task.pk])),
        (
            f"task {task.slug}, one region, 7 d",
            get(f"/tasks/{task.slug}/?region=r1&range=7d"),
            _naive(task_sql, [week, task.pk]),
        ),
        (
            "route, 24 h",
            get(f"/routes/{route.pk}/?task={task.slug}"),
            _naive(NAIVE_ROUTE_SERIES, ["hour", route.pk, task.pk, day]),
        ),
        (
            "route, 7 d",
            get(f"/routes/{route.pk}/?task={task.slug}&range=7d"),
            _naive(NAIVE_ROUTE_SERIES, ["hour", route.pk, task.pk, week]),
        ),
        (
            "route, 30 d, one region",
            get(f"/routes/{other.pk}/?region=r2&range=30d"),
            _naive(NAIVE_ROUTE_SERIES, ["day", other.pk, other.tasks.get().pk, month]),
        ),
        ("regions matrix", get(f"/regions/?task={task.slug}"), _naive(task_sql, [day, task.pk])),
        ("probe log", get("/log/"), _naive(NAIVE_LOG, [])),
        (
            "probe log, route + errors, 7 d",
            get(f"/log/?route={route.pk}&outcome=error&range=7d"),
            None,
        ),
        ("status", get("/status/"), None),
        ("races", get(f"/races/?task={task.slug}"), None),
        ("/metrics", get("/metrics"), _naive(all_sql, [hour])),
        (
            "export JSON, one route, 24 h",
            get(f"/export/results.json?route={route.pk}&range=24h"),
            None,
        ),
        (API_ROUTE, api(f"/api/v1/tasks/{task.slug}/route?region=r1"), None),
        (
            "API route answer, 304 revalidation",
            api(f"/api/v1/tasks/{task.slug}/route?region=r1", revalidate=True),
            None,
        ),
        ("API task list", api("/api/v1/tasks/"), None),
        ("API route list", api("/api/v1/routes/"), None),
        (BACKTEST, lambda: backtest.run(rule, now), None),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=bench_scale.DAYS, help="365 = the 15.8M target")
    parser.add_argument("--reload", action="store_true", help="drop and reload the data set")
    parser.add_argument("--repeat", type=int, default=40)
    ns = parser.parse_args()
    # A database of its own per size: never mistaken for another size, and never clobbering
    # (or clobbered by) a `make bench-scale` run in routewatch_bench.
    bench_scale.BENCH_DB = f"routewatch_pages_{ns.days}d"

    admin_url = os.environ["DATABASE_URL"]
    bench_scale._ensure_database(admin_url, drop=ns.reload)
    os.environ["DATABASE_URL"] = bench_scale._bench_url(admin_url)
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v0"], check=True
    )
    # Pages link their static files through the manifest, as in production.
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "collectstatic", "--noinput", "-v0"], check=True
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "monitor.settings")
    # The application loaded as a web worker loads it (gunicorn monitor.wsgi): its startup
    # heap frozen out of the collector's full passes. With django.setup() alone, every full
    # pass walked ~135,000 objects no worker's pass walks (140-250 ms in a read).
    importlib.import_module("monitor.wsgi")
    from django.db import connection

    from monitor.models import ProbeResult, Rollup

    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    history.check_buckets()
    # Loaded = recent raw rows and their rollups (a load cut short has rows but no rollups).
    loaded = (
        ProbeResult.objects.filter(started_at__gt=now - timedelta(days=2)).exists()
        and Rollup.objects.filter(grain="day", bucket_start__gt=now - timedelta(days=2)).exists()
    )
    if ns.reload or not loaded:
        t0 = time.perf_counter()
        bench_scale.load(now, ns.days)
        print(f"loaded in {time.perf_counter() - t0:.0f} s", flush=True)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE relname = 'monitor_proberesult'"
        )
        rows = cursor.fetchone()[0]
        cursor.execute("SELECT max(last_probe_at) FROM monitor_rollup WHERE grain = 'day'")
        latest = cursor.fetchone()[0]
    # Pages read "now": the data set ends at its load time, so reads look back from there.
    import time_machine

    with time_machine.travel(latest + timedelta(minutes=1), tick=True):
        from django.utils import timezone

        results = measure(timezone.now(), ns.repeat)
    print(f"\ndatabase {bench_scale.BENCH_DB}: {rows:,} raw rows (estimate), {ns.days} days")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average {load}; cpu = the reading thread's CPU time (time.thread_time)")
    print("full gc = the collector's full passes during the page's reads: how many, their total")
    print(
        f"{'page (server time)':36} {'p50':>8} {'p95':>8} {'cpu p50':>8} {'cpu p95':>8}"
        f" {'naive raw':>10} {'ratio':>7} {'full gc':>12}"
    )
    worst = 0.0
    for name, page_ms, naive_ms, cpu_ms, full_ms in results:
        p50, p95 = statistics.median(page_ms), bench_scale._p(page_ms, 0.95)
        if name != BACKTEST:
            worst = max(worst, p95)
        naive = statistics.median(naive_ms) if naive_ms else None
        naive_text = f"{naive:8.0f}ms" if naive is not None else f"{'—':>10}"
        ratio = f"{naive / p50:6.0f}x" if naive is not None else f"{'—':>7}"
        target = (
            TARGET_API_P95_MS
            if name.startswith(API_ROUTE)
            else TARGET_BACKTEST_P95_MS
            if name == BACKTEST
            else TARGET_P95_MS
        )
        flag = "ok" if p95 <= target else f"OVER {target:.0f} ms"
        cpu50, cpu95 = statistics.median(cpu_ms), bench_scale._p(cpu_ms, 0.95)
        full_text = f"{len(full_ms)} / {sum(full_ms):.0f}ms" if full_ms else "0"
        print(
            f"{name:36} {p50:6.1f}ms {p95:6.1f}ms {cpu50:6.1f}ms {cpu95:6.1f}ms"
            f" {naive_text} {ratio} {full_text:>12}  {flag}"
        )
    print(f"\nslowest page p95: {worst:.1f} ms (target {TARGET_P95_MS:.0f} ms)")
    pauses = [ms for *_, full_ms in results for ms in full_ms]
    print(
        f"full collections during the reads: {len(pauses)}, {sum(pauses):.0f} ms in all,"
        f" longest {max(pauses, default=0.0):.0f} ms; {len(gc.get_objects()):,} objects tracked"
        f" at the end ({gc.get_freeze_count():,} frozen)"
    )
    api_p95 = next(bench_scale._p(ms, 0.95) for name, ms, *_ in results if name == API_ROUTE)
    print(f"API route answer p95: {api_p95:.1f} ms (target {TARGET_API_P95_MS:.0f} ms)")


if __name__ == "__main__":
    main()
