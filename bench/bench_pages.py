"""Page benchmark: server time of every dashboard page on the scale benchmark's data set.

    make bench-pages                          # the year: 15.8M raw rows (loads once, slowly)
    make bench-pages ARGS="--days 30"         # a month (1.3M rows), database routewatch_pages_30d
    make bench-pages ARGS="--days 30 --reload"
    make bench-pages ARGS="--days 30 --against /path/to/a/worktree/of/the/before/commit"

Loads with bench/bench_scale.py's loader (imported, not copied) into a database of its own per
size (routewatch_pages_365d for the year), loaded once and reused by later runs. Server
time is one request through the whole Django stack (middleware, session, view, template) with
Django's test client, in a reading process that loads the application as a web worker does
(monitor.wsgi). Target: p95 <= 100 ms on the year. The read API (/api/v1/, with an API token)
is timed the same way; its route answer's target is p95 <= 20 ms (issue 14).

How a page is read: --rounds rounds (10) over every page; in each, a page gets one untimed
read (caches warm, an ETag to revalidate) and then its timed reads: about --budget-ms (400 ms)
of them, at least --min-reads (2) and at most --max-reads (40), counted once from a first,
uncounted round, so a 10 ms read is timed 400 times a run and a 2 s one 20 times. p50 and
p95 are over all of a page's timed reads pooled; a p95 of 20 reads was its one or two slowest,
which moved by a third between runs of one commit on 10-30 ms reads.
--against WORKTREE: a second reading process runs that worktree's code (the before) on the
same database, and for each page the two read in turn, read by read (which one reads first
alternating), so a burst of other work on the machine lands on both sides alike.
The report is a table of both sides' p50 / p95, the changes, and the p95 change over each half
of the rounds alone: how far the figure moves within one run (its noise) beside the change.
--save FILE keeps every read; --show FILE prints that report again.
Beside each page: the reading thread's CPU (time.thread_time) and the collector's full passes
during its reads. The overview's snapshot does not expire during a run
(DASHBOARD_REFRESH_SECONDS=3600 in the reading processes), and every read builds its page's
body (PAGE_SHARE_SECONDS=0: the build is what is measured): "overview, snapshot rebuilt" is the
request that finds it gone and rebuilds it (beat down, or a configuration change), every read.
Baseline (one side only, after the rounds): the naive reads of the same figures from raw rows
(percentile_cont over probe results, an unbounded ORDER BY for the log); ratio = naive / page p50.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
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
# The code a reading process loads: this worktree, or the other commit's (--against) for the
# before side (its monitor/ and bench/ first on the path; PYTHONPATH says the same).
CODE = Path(os.environ.get("RW_BENCH_CODE", ROOT))
sys.path.insert(0, str(CODE))

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


def _timed_reads(fn: Callable[[], object], n: int, warm: bool = True) -> dict[str, list[float]]:
    """Server time and the reading thread's own CPU time (ms) of each of `n` reads, after one
    untimed read (caches warm; an ETag to revalidate; the overview's snapshot this process's
    own, whichever process wrote it last), and the full collections that ran during the reads
    (ms each). The CPU is what a read costs on a busy machine: the rest of its server time is
    its queries and its waits for a CPU. `warm` False: no untimed read first."""
    if warm:
        fn()
    times, cpu = [], []
    with FullCollections() as full:
        for _ in range(n):
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.thread_time() - c0) * 1000)
    return {"ms": times, "cpu": cpu, "gc": full.pauses}


def readers(now: datetime) -> list[tuple[str, Callable[[], object], Callable[[], object] | None]]:
    """(name, one read, the naive query it replaced) of every page and API answer measured,
    with a logged-in session and an API token."""
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
    # One token per reading process (a pair of them reads side by side).
    name = f"bench-pages-{os.getpid()}"
    ApiToken.objects.create(name=name, prefix=issued.prefix, digest=issued.digest)
    # A fresh client per API request: no session, only the token.
    api_client = Client(SERVER_NAME="localhost")
    api_headers = {"Authorization": f"Bearer {issued.token}"}
    get = _page_reader(client)
    api = _api_reader(api_client, api_headers)
    return _pages(now, task, route, other, get, api)


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


def serve(at: str) -> None:
    """A reading process (--serve): loads the application from RW_BENCH_CODE as a web worker
    does, then answers the driver's commands (one JSON line each on stdin) with one JSON line
    each on its own copy of stdout (anything the application prints goes to stderr)."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(message: object) -> None:
        out.write(json.dumps(message) + "\n")

    # Pages link their static files through the manifest, as in production; this process
    # keeps its own code's manifest in memory (loaded below) before the other side rewrites it.
    subprocess.run(
        [sys.executable, str(CODE / "manage.py"), "collectstatic", "--noinput", "-v0"], check=True
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "monitor.settings")
    # The application loaded as a web worker loads it (gunicorn monitor.wsgi): its startup
    # heap frozen out of the collector's full passes, if this code freezes it. With
    # django.setup() alone, every full pass walked ~135,000 objects no worker's pass walks.
    importlib.import_module("monitor.wsgi")
    from django.contrib.staticfiles.storage import staticfiles_storage

    hasattr(staticfiles_storage, "hashed_files")  # instantiates it: the manifest read now
    import time_machine

    # Pages read "now": the data set ends at its load time, so reads look back from there.
    with time_machine.travel(datetime.fromisoformat(at), tick=True):
        from django.utils import timezone

        pages = readers(timezone.now())
        send({"names": [name for name, *_ in pages], "code": str(CODE)})
        for line in sys.stdin:
            command = json.loads(line)
            if command["op"] == "read":
                fn = pages[command["page"]][1]
                send(_timed_reads(fn, command["n"], command.get("warm", True)))
            elif command["op"] == "naive":
                naive = pages[command["page"]][2]
                send({"ms": bench_scale._timeit(naive, command["n"]) if naive else []})
            else:
                send({"objects": len(gc.get_objects()), "frozen": gc.get_freeze_count()})
                return


class Side:
    """One reading process, running one commit's code (its worktree on PYTHONPATH)."""

    def __init__(self, label: str, code: Path, at: str) -> None:
        self.label, self.code = label, code
        env = {
            **os.environ,
            "PYTHONPATH": str(code),
            "RW_BENCH_CODE": str(code),
            # The overview's snapshot does not expire during a run (beat's rebuild is not
            # measured here): no rebuild lands at random in a read of the overview, /metrics
            # or the API. "overview, snapshot rebuilt" measures the rebuild, every read.
            "DASHBOARD_REFRESH_SECONDS": "3600",
            # Every read builds its page's body (monitor.pages.shared): what is measured here
            # is the build; bench-load measures pages read with sharing, as deployed.
            "PAGE_SHARE_SECONDS": "0",
        }
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve", at],
            cwd=code,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.names: list[str] = self.ask(None)["names"]
        self.ms: dict[int, list[list[float]]] = {}  # page -> one list per round
        self.cpu: dict[int, list[float]] = {}
        self.gc: dict[int, list[float]] = {}

    def ask(self, command: dict[str, object] | None) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        if command is not None:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.label}: the reading process ended ({self.proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def batch(self, page: int) -> None:
        """A round's reads of the page start: one untimed read (caches, ETag, snapshot)."""
        self.ask({"op": "read", "page": page, "n": 0})
        self.ms.setdefault(page, []).append([])

    def read(self, page: int, n: int, *, keep: bool = True) -> list[float]:
        """`n` timed reads of the page, counted in its current batch unless not `keep`."""
        got = self.ask({"op": "read", "page": page, "n": n, "warm": not keep})
        if keep:
            self.ms[page][-1].extend(got["ms"])
            self.cpu.setdefault(page, []).extend(got["cpu"])
            self.gc.setdefault(page, []).extend(got["gc"])
        ms: list[float] = got["ms"]
        return ms

    def pooled(self, page: int, rounds: slice = slice(None)) -> list[float]:
        return [ms for batch in self.ms[page][rounds] for ms in batch]


class Saved(Side):
    """A side read back from a --save file (page keys are strings in JSON)."""

    def __init__(
        self,
        label: str,
        code: str,
        names: list[str],
        ms: dict[str, list[list[float]]],
        cpu: dict[str, list[float]],
        gc: dict[str, list[float]],
    ) -> None:
        self.label, self.code, self.names = label, Path(code), names
        self.ms = {int(k): v for k, v in ms.items()}
        self.cpu = {int(k): v for k, v in cpu.items()}
        self.gc = {int(k): v for k, v in gc.items()}


def _change(after: float, before: float) -> str:
    return f"{(after / before - 1) * 100:+.0f}%"


def _fmt(ms: float) -> str:
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def report(
    sides: list[Side] | list[Saved], rounds: int, reads: list[int], naive: dict[int, list[float]]
) -> None:
    p = bench_scale._p
    print("load average (1, 5, 15 min) " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(
        "p50, p95 = of every timed read of the page, all rounds pooled (n = rounds x reads);"
        " cpu = the reading thread's CPU time (time.thread_time); full gc = the collector's"
        " full passes during the page's reads: how many, their total"
    )
    if len(sides) == 1:
        (side,) = sides
        print(
            f"\n{'page (server time)':36} {'n':>4} {'p50':>8} {'p95':>8} {'cpu p50':>8}"
            f" {'cpu p95':>8} {'naive raw':>10} {'ratio':>7} {'full gc':>12}"
        )
        worst = 0.0
        for i, name in enumerate(side.names):
            if i not in side.ms:  # not read (--pages)
                continue
            ms = side.pooled(i)
            p50, p95 = statistics.median(ms), p(ms, 0.95)
            if name != BACKTEST:
                worst = max(worst, p95)
            base = statistics.median(naive[i]) if naive.get(i) else None
            naive_text = f"{base:8.0f}ms" if base is not None else f"{'—':>10}"
            ratio = f"{base / p50:6.0f}x" if base is not None else f"{'—':>7}"
            target = (
                TARGET_API_P95_MS
                if name.startswith(API_ROUTE)
                else TARGET_BACKTEST_P95_MS
                if name == BACKTEST
                else TARGET_P95_MS
            )
            flag = "ok" if p95 <= target else f"OVER {target:.0f} ms"
            cpu = side.cpu[i]
            pauses = side.gc[i]
            full_text = f"{len(pauses)} / {sum(pauses):.0f}ms" if pauses else "0"
            print(
                f"{name:36} {len(ms):4} {p50:6.1f}ms {p95:6.1f}ms {statistics.median(cpu):6.1f}ms"
                f" {p(cpu, 0.95):6.1f}ms {naive_text} {ratio} {full_text:>12}  {flag}"
            )
        print(f"\nslowest page p95: {worst:.1f} ms (target {TARGET_P95_MS:.0f} ms)")
        if side.names.index(API_ROUTE) in side.ms:
            api = side.pooled(side.names.index(API_ROUTE))
            print(
                f"API route answer p95: {p(api, 0.95):.1f} ms (target {TARGET_API_P95_MS:.0f} ms)"
            )
        return
    before, after = sides
    half = slice(0, rounds // 2), slice(rounds // 2, rounds)
    print(
        f"before = {before.code}, after = {after.code}: {rounds} rounds, each reading every page"
        " on both sides in turn, read by read (which side reads first alternates)."
        "\nhalves = the p95 change over the first and over the second half of the rounds alone:"
        " how far the figure moves on this machine within one run."
    )
    print(
        "\n| page | reads | before p50 / p95 (ms) | after p50 / p95 (ms) | p50 change |"
        " p95 change (halves) | CPU p50 change | full gc before / after |"
        "\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    for i, name in enumerate(before.names):
        if i not in before.ms:  # not read (--pages)
            continue
        b, a = before.pooled(i), after.pooled(i)
        halves = ", ".join(
            _change(p(after.pooled(i, h), 0.95), p(before.pooled(i, h), 0.95)) for h in half
        )
        full = " / ".join(
            f"{len(s.gc[i])} ({sum(s.gc[i]):.0f} ms)" if s.gc[i] else "0" for s in sides
        )
        print(
            f"| {name} | {len(a)} ({rounds} x {reads[i]}) |"
            f" {_fmt(statistics.median(b))} / {_fmt(p(b, 0.95))} |"
            f" {_fmt(statistics.median(a))} / {_fmt(p(a, 0.95))} |"
            f" {_change(statistics.median(a), statistics.median(b))} |"
            f" {_change(p(a, 0.95), p(b, 0.95))} ({halves}) |"
            f" {_change(statistics.median(after.cpu[i]), statistics.median(before.cpu[i]))} |"
            f" {full} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=bench_scale.DAYS, help="365 = the 15.8M target")
    parser.add_argument("--reload", action="store_true", help="drop and reload the data set")
    parser.add_argument("--rounds", type=int, default=10, help="rounds over every page")
    parser.add_argument(
        "--min-reads", type=int, default=2, help="timed reads of a page per round, at least"
    )
    parser.add_argument(
        "--budget-ms",
        type=float,
        default=400.0,
        help="more reads a round for short pages: about this long a page, up to --max-reads",
    )
    parser.add_argument("--max-reads", type=int, default=40)
    parser.add_argument(
        "--against",
        type=Path,
        help="another commit's worktree (the before): read side by side with this one",
    )
    parser.add_argument(
        "--pages",
        action="append",
        metavar="NAME",
        help="read only this page (its name as the report gives it; repeat for more): a quick"
        " look at a few rows, never a run to report",
    )
    parser.add_argument("--save", type=Path, help="also write every read's times here (JSON)")
    parser.add_argument("--show", type=Path, help="report a --save file again, reading nothing")
    parser.add_argument("--serve", metavar="AT", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.serve:
        serve(ns.serve)
        return
    if ns.show:
        saved = json.loads(ns.show.read_text())
        report([Saved(**side) for side in saved["sides"]], saved["rounds"], saved["reads"], {})
        return
    # A database of its own per size: never mistaken for another size, and never clobbering
    # (or clobbered by) a `make bench-scale` run in routewatch_bench.
    bench_scale.BENCH_DB = f"routewatch_pages_{ns.days}d"

    admin_url = os.environ["DATABASE_URL"]
    bench_scale._ensure_database(admin_url, drop=ns.reload)
    os.environ["DATABASE_URL"] = bench_scale._bench_url(admin_url)
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v0"], check=True
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "monitor.settings")
    import django

    django.setup()
    from django.db import connection

    from monitor.models import ApiToken, ProbeResult, Rollup

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
    ApiToken.objects.filter(name__startswith="bench-pages").delete()  # earlier runs' tokens
    connection.close()
    at = (latest + timedelta(minutes=1)).isoformat()
    print(f"database {bench_scale.BENCH_DB}: {rows:,} raw rows (estimate), {ns.days} days")
    print("load average at the start " + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)

    # One process per side, started one after the other (each reads its own static manifest).
    sides = [Side("before", ns.against.resolve(), at)] if ns.against else []
    sides.append(Side("after" if ns.against else "this", ROOT, at))
    names = sides[0].names
    assert all(side.names == names for side in sides), "the sides read different pages"
    unknown = set(ns.pages or ()) - set(names)
    if unknown:
        raise SystemExit(f"no such page: {', '.join(sorted(unknown))} (pages: {names})")
    pages = [i for i, name in enumerate(names) if not ns.pages or name in ns.pages]
    # A first round not counted: caches warm, and each page's reads a round from its time.
    reads = [0] * len(names)
    for i in pages:
        slowest = max(statistics.median(side.read(i, 1, keep=False)) for side in sides)
        reads[i] = min(ns.max_reads, max(ns.min_reads, math.ceil(ns.budget_ms / slowest)))
    # Read by read in turn: a burst of other work on the machine lands on both sides alike.
    for r in range(ns.rounds):
        for i in pages:
            for side in sides:
                side.batch(i)
            for k in range(reads[i]):
                for side in sides if (r + i + k) % 2 == 0 else sides[::-1]:
                    side.read(i, 1)
        print(
            f"round {r + 1}/{ns.rounds} done; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    naive = {i: sides[-1].ask({"op": "naive", "page": i, "n": 2})["ms"] for i in pages}
    heaps = [side.ask({"op": "end"}) for side in sides]
    for side in sides:
        side.proc.wait()
    if ns.save:
        ns.save.write_text(
            json.dumps(
                {
                    "rounds": ns.rounds,
                    "reads": reads,
                    "sides": [
                        {k: getattr(s, k) for k in ("label", "names", "ms", "cpu", "gc")}
                        | {"code": str(s.code)}
                        for s in sides
                    ],
                }
            )
        )
    print()
    report(sides, ns.rounds, reads, naive)
    pauses = [ms for side in sides for page in side.gc.values() for ms in page]
    print(
        f"\nfull collections during the reads: {len(pauses)}, {sum(pauses):.0f} ms in all,"
        f" longest {max(pauses, default=0.0):.0f} ms; objects tracked at the end: "
        + ", ".join(
            f"{side.label} {h['objects']:,} ({h['frozen']:,} frozen)"
            for side, h in zip(sides, heaps, strict=True)
        )
    )


if __name__ == "__main__":
    main()
