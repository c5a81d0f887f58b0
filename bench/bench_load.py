"""The whole pipeline under load, on this machine, against the simulator (loopback only).

    make bench-load                          # 20 tasks x 30 routes x 6 regions, a probe a minute
    make bench-load ARGS="--mix fast"        # every probe well under a second (the old mix)
    make bench-load ARGS="--scale 3"         # 3x the routes (10,800 combinations)
    make bench-load ARGS="--ingest-workers 2 --region-concurrency 50 --measure 180"

The route mix (bench/mixes.py): `realistic` by default, probes as long as the real world's (a
third of the routes reasoning models with 20-75 s to first token and answers of several
hundred tokens at 30-60 tok/s, one task in twenty a 10-call agent scenario lasting up to
minutes); `--mix fast` is the old one, every probe well under a second.

Real processes, as deployed: the simulator, celery beat (ticks every TICK_SECONDS), one celery
worker per region (its own region key only, signed messages, started with
monitor.limits.region_worker_args() unless --region-concurrency says otherwise), the tick's own
scheduler worker, N ingest workers (results only, at the web's priority), a background worker
(the sweep, the overview rebuild and beat's other tasks: the `default` queue), and the pages read
through Django during the load. A database of its own (routewatch_bench_load), rebuilt each
run; the bench adds one column to the raw results there (rw_bench_written_at, the insert's
clock time) to measure ingest lag.

Before the load it writes a day of history for the same world (`--history-hours`, default 24:
5.2M raw rows at 1x, with their rollups and hour strips; bench/history.py), so pages, ingest's
indexes and the overview rebuild work at the sizes a running deployment has, not a few
minutes' worth. After a warm-up the bench measures a window, stops beat, and waits for the
window's slots to close (result or missed). It reports, each against its target:
- slots of the window missed (goal 0), split by cause: "started late" (a region worker did
  not start the probe, past its bound after the planned start) and others (no result by the
  deadline), and still open;
- start lag p50/p99: planned start to actual start (the results' start_lag_ms, where the
  region worker records it; target p99 <= 1 s);
- probes in flight (from the stored results, every 5 s of the window: mean and max), and the
  region workers' CPU and RSS per 1,000 in flight;
- ingest lag p50/p99: probe end (started_at + e2e) to the row's insert (target p99 < 5 s);
- tick duration p50/p99 (celery's own "succeeded in" of monitor.tasks.tick), and ingest
  task duration;
- rows per second written in the window;
- CPU (cores used) and memory (RSS) per component, PostgreSQL and Redis included;
- page server time p50/p95 per page (Django in this process, pages read one after another
  with a 0.5 s pause), idle (on the history, before the workers start: the same-run baseline)
  and during the load, with the ratio (target p95 < 100 ms). The celery workers run at the
  product's RW_WORKER_NICE (10, monitor.celery: their own and their session's autogroup
  priority) unless `--worker-nice` says otherwise;
- where a page read's time went: the reader's CPU, its wait for a CPU, its PostgreSQL
  backend's CPU and wait (Linux schedstat);
- the window's measured TTFT and e2e (p50/p99), to compare runs at another worker priority:
  waiting for a CPU must not move them (kernel receive timestamps). `--alternate-nice 0,10`
  compares two worker priorities in one run (switched every `--phase` seconds; root), pages
  and probe timings by phase: two separate runs differ by the host's drift (±30-50%).
Retention's cost (drop of a day's partition vs DELETE of a day) is `make bench-partitions`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PY = sys.executable
BENCH_DB = "routewatch_bench_load"
SUCCEEDED = re.compile(
    r"Task (monitor\.tasks\.\w+)\[[^\]]+\] succeeded in ([0-9.]+)s: (.*)$", re.MULTILINE
)
SERVER_ONLY_SECRETS = ("SECRET_KEY", "FIELD_ENCRYPTION_KEYS", "DATABASE_URL", "EMAIL_HOST_PASSWORD")


# The first table a query reads (its FROM), to name it in the report.
TABLE = re.compile(r'FROM\s+"?(\w+)"?', re.IGNORECASE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


@dataclass
class Proc:
    name: str
    component: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    out: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.out = self.log.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=ROOT,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.out:
            self.out.close()


def _recreate(admin_url: str, name: str = BENCH_DB) -> str:
    import psycopg

    parts = urlsplit(admin_url)
    with psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return urlunsplit(parts._replace(path=f"/{name}"))


def region_pool_args(concurrency: int | None) -> list[str]:
    """A region worker's execution pool: the product's (monitor.limits.region_worker_args),
    at `concurrency` when given; before that function existed, prefork at `concurrency` (2)."""
    from monitor import limits

    product: Callable[[int | None], list[str]] | None = getattr(limits, "region_worker_args", None)
    if product is None:
        return ["--concurrency", str(concurrency or 2)]
    return product(concurrency)


class Pages(threading.Thread):
    """Reads every page, one after the other, until stopped; server time per page (ms)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.times: dict[str, list[float]] = {}
        self.sql: dict[str, list[float]] = {}  # of each read, the time its queries took (ms)
        # Of each read, the CPU time of the reading thread (ms): the rest of its server time is
        # its queries and waiting for a CPU.
        self.cpu: dict[str, list[float]] = {}
        # Of each read, the time the reading thread waited for a CPU while runnable, and the CPU
        # time and CPU wait of the PostgreSQL backend serving it (ms; Linux schedstat).
        self.wait: dict[str, list[float]] = {}
        self.pg_cpu: dict[str, list[float]] = {}
        self.pg_wait: dict[str, list[float]] = {}
        self.queries: dict[str, int] = {}  # queries of the page's last read
        # Of each page, each query's times (ms), by its table and place in the page.
        self.per_query: dict[str, dict[str, list[float]]] = {}
        self.failed = 0
        # --alternate-nice: the workers' nice value when each read started, and each read's
        # time by it (page -> nice -> ms).
        self.phase: int | None = None
        self.by_phase: dict[str, dict[int, list[float]]] = {}

    def urls(self) -> list[tuple[str, str]]:
        from monitor.models import Route, Task

        task = Task.objects.order_by("pk").first()
        route = Route.objects.order_by("pk").first()
        assert task is not None
        assert route is not None
        return [
            ("overview", "/"),
            ("task, 24 h", f"/tasks/{task.slug}/"),
            ("route, 24 h", f"/routes/{route.pk}/?task={task.slug}"),
            ("regions", "/regions/"),
            ("probe log", "/log/"),
            ("status", "/status/"),
        ]

    def once(self, client: Any, urls: list[tuple[str, str]]) -> None:
        from django.db import connection

        spent: list[float] = []
        labels: list[str] = []

        def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            t = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                spent.append((time.perf_counter() - t) * 1000)
                table = TABLE.search(sql)
                labels.append(f"#{len(labels) + 1} {table.group(1) if table else sql[:30]}")

        for name, url in urls:
            spent.clear()
            labels.clear()
            phase = self.phase
            connection.ensure_connection()
            backend = f"/proc/{connection.connection.info.backend_pid}/schedstat"
            with connection.execute_wrapper(timed):
                _, w0 = _schedstat("/proc/thread-self/schedstat")
                b0 = _schedstat(backend)
                t0, c0 = time.perf_counter(), time.thread_time()
                response = client.get(url)
                if getattr(response, "streaming", False):
                    b"".join(response.streaming_content)
                ms = (time.perf_counter() - t0) * 1000
                cpu_ms = (time.thread_time() - c0) * 1000
                _, w1 = _schedstat("/proc/thread-self/schedstat")
                b1 = _schedstat(backend)
            self.wait.setdefault(name, []).append(w1 - w0)
            self.pg_cpu.setdefault(name, []).append(b1[0] - b0[0])
            self.pg_wait.setdefault(name, []).append(b1[1] - b0[1])
            if response.status_code != 200:
                self.failed += 1
            self.times.setdefault(name, []).append(ms)
            self.sql.setdefault(name, []).append(sum(spent))
            self.cpu.setdefault(name, []).append(cpu_ms)
            if phase is not None and phase == self.phase:  # not across a switch
                self.by_phase.setdefault(name, {}).setdefault(phase, []).append(ms)
            self.queries[name] = len(spent)
            page = self.per_query.setdefault(name, {})
            for label, ms in zip(labels, spent, strict=True):
                page.setdefault(label, []).append(ms)

    def run(self) -> None:
        from django.contrib.auth.models import User
        from django.db import connection
        from django.test import Client

        user, _ = User.objects.get_or_create(username="bench-load", is_staff=True)
        client = Client(SERVER_NAME="localhost")
        client.force_login(user)
        urls = self.urls()
        try:
            while not self.stop.is_set():
                self.once(client, urls)
                self.stop.wait(0.5)
        finally:
            connection.close()


def _schedstat(path: str) -> tuple[float, float]:
    """(CPU time, time runnable but waiting for a CPU) so far of a thread or process, in ms."""
    try:
        with open(path) as f:
            ran, waited, _ = f.read().split()
    except (OSError, ValueError):
        return (0.0, 0.0)
    return (int(ran) / 1e6, int(waited) / 1e6)


def _tree(pid: int) -> list[Any]:
    import psutil

    try:
        top = psutil.Process(pid)
        return [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _cpu(procs: list[Any]) -> dict[int, float]:
    """CPU seconds so far of each process (children that exited are counted in their parent's
    children_* times: PostgreSQL backends, celery's pool processes)."""
    seen = {}
    for p in procs:
        with contextlib.suppress(Exception):
            t = p.cpu_times()
            seen[p.pid] = t.user + t.system + t.children_user + t.children_system
    return seen


def _used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds between two `_cpu` readings: processes started meanwhile count from 0."""
    return sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())


def _rss(procs: list[Any]) -> float:
    total = 0
    for p in procs:
        with contextlib.suppress(Exception):
            total += p.memory_info().rss
    return total / 2**20


def _timings(cursor: Any, since: datetime, until: datetime) -> tuple[list[float], list[float]]:
    """TTFT and e2e (ms) of the probes that started in [since, until) and succeeded."""
    cursor.execute(
        "SELECT ttft_ms, e2e_ms FROM monitor_proberesult WHERE started_at >= %s "
        "AND started_at < %s AND outcome = 'ok' AND ttft_ms IS NOT NULL AND e2e_ms IS NOT NULL",
        [since, until],
    )
    rows = cursor.fetchall()
    return [r[0] for r in rows], [r[1] for r in rows]


def _renice(pids: list[int], nice: int) -> None:
    """Every thread of these processes to `nice` (Linux priorities are per thread; going back
    down needs root: the bench's --alternate-nice)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        # Each worker is a session of its own, so with autogroups (Linux's default on a
        # desktop kernel) its share against other sessions is its autogroup's nice.
        with contextlib.suppress(OSError), open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))


def _servers(env: dict[str, str]) -> dict[str, list[int]]:
    """PostgreSQL and Redis process ids (the embedded ones, or any on this machine)."""
    import psutil

    found: dict[str, list[int]] = {"postgres": [], "redis": []}
    var = Path(env.get("RW_VAR_DIR", ROOT / "var")).resolve()
    pidfile = var / "postgres" / "postmaster.pid"
    if pidfile.exists():
        found["postgres"].append(int(pidfile.read_text().split()[0]))
    for p in psutil.process_iter(["name", "cwd", "cmdline"]):
        with contextlib.suppress(Exception):
            if "redis-server" in (p.info["name"] or "") and str(var) in " ".join(
                [p.info["cwd"] or "", *(p.info["cmdline"] or [])]
            ):
                found["redis"].append(p.pid)
    return found


def run(ns: argparse.Namespace) -> int:
    from bench import mixes, probe_stats

    mix = mixes.MIXES[ns.mix]
    warmup_s = mix.warmup_s if ns.warmup is None else ns.warmup
    admin_url = os.environ["DATABASE_URL"]
    url = _recreate(admin_url)
    redis = urlsplit(os.environ["REDIS_URL"])
    redis_url = urlunsplit(redis._replace(path="/9"))  # the bench's own broker database
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-load-"))
    tick_s = ns.tick
    alternate: tuple[int, ...] = ()
    if ns.alternate_nice:
        alternate = tuple(int(n) for n in ns.alternate_nice.split(","))
        if len(alternate) != 2 or not all(0 <= n <= 19 for n in alternate):
            raise SystemExit("--alternate-nice takes two nice values, e.g. 0,10")
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "REDIS_URL": redis_url,
        "DJANGO_SETTINGS_MODULE": "monitor.settings",
        "PROVIDER_ALLOW_PRIVATE_NETWORKS": "true",
        "TICK_SECONDS": str(tick_s),
        "SLOT_GRACE_SECONDS": str(ns.grace),
        "RW_RESULT_FLUSH_SECONDS": str(ns.flush),
        "RW_SPOOL_DIR": str(tmp / "spool"),
        "PYTHONUNBUFFERED": "1",
    }
    if ns.worker_nice is not None:
        env["RW_WORKER_NICE"] = str(ns.worker_nice)
    os.environ.update(env)
    subprocess.run(
        [PY, str(ROOT / "manage.py"), "migrate", "--noinput", "-v0"], env=env, check=True
    )
    # Pages link their static files through the manifest, as in production.
    subprocess.run(
        [PY, str(ROOT / "manage.py"), "collectstatic", "--noinput", "-v0"], env=env, check=True
    )
    import django

    django.setup()
    import redis as redis_client
    from django.db import connection

    redis_client.Redis.from_url(redis_url).flushdb()
    sim_port = _free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    routes = ns.routes * ns.scale
    world = mixes.build_world(mix, sim_url, ns.tasks, routes, ns.regions, ns.interval)
    slugs = world.regions
    combos = world.combinations
    with connection.cursor() as cursor:
        # Bench only: when each row was inserted (ingest lag).
        cursor.execute(
            "ALTER TABLE monitor_proberesult ADD COLUMN rw_bench_written_at timestamptz "
            "DEFAULT clock_timestamp()"
        )
    region_args = region_pool_args(ns.region_concurrency)
    keys = {}
    for slug in slugs:
        out = subprocess.run(
            [PY, str(ROOT / "manage.py"), "region_key", "new", slug, "--replace"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        keys[slug] = out.stdout.strip()
    scenarios = (
        f" ({world.scenario_combinations} of them scenarios of {mixes.SCENARIO_STEPS} calls)"
        if world.scenario_combinations
        else ""
    )
    print(
        f"load ({mix.name} mix, simulator {mix.config.name}): {ns.tasks} tasks x {routes} "
        f"routes x {ns.regions} regions = {combos:,} combinations{scenarios}, a probe every "
        f"{ns.interval} s = {combos / ns.interval:.0f} slots/s; "
        f"tick every {tick_s} s; {ns.ingest_workers} ingest worker(s) x concurrency "
        f"{ns.ingest_concurrency}, region workers {' '.join(region_args)}, "
        f"results flushed every {ns.flush} s, workers at nice "
        f"{env.get('RW_WORKER_NICE', 'the product default')}, the tick on a scheduler worker "
        "of its own",
        flush=True,
    )
    with contextlib.suppress(Exception):
        print(f"machine load before start: {os.getloadavg()}", flush=True)

    if ns.history_hours:
        # Steady state: the pages and ingest's indexes at a day's size, not a few minutes'.
        from bench import history
        from monitor.models import Task

        now = datetime.now(UTC).replace(second=0, microsecond=0)
        pairs = [history.pair(t.pk, r.pk) for t in Task.objects.all() for r in t.routes.all()]
        print(f"history: {ns.history_hours} h of one probe every {ns.interval} s", flush=True)
        history.load(
            pairs,
            now - timedelta(hours=ns.history_hours),
            now,
            timedelta(seconds=ns.interval),
            timedelta(hours=1),
        )
    from monitor.answer import board

    board.refresh()  # as beat keeps it

    # Same-run baseline: the pages with no load (the same world and history).
    idle = Pages()
    urls = idle.urls()
    from django.contrib.auth.models import User
    from django.test import Client

    user, _ = User.objects.get_or_create(username="bench-load", is_staff=True)
    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    gc.freeze()  # as monitor.wsgi does once the application is loaded
    idle.once(client, urls)  # warm: templates compiled, caches filled, as on a running server
    idle.times.clear()
    for _ in range(10):
        idle.once(client, urls)

    celery = [PY, "-m", "celery", "-A", "monitor"]
    procs = [
        Proc(
            "simulator",
            "simulator",
            [PY, "-m", "simulator", "--config", str(mix.config), "--port", str(sim_port)],
            env,
            tmp / "simulator.log",
        )
    ]
    # The tick alone, as the product runs it (monitor.pipeline.queues.SCHEDULE_QUEUE).
    procs.append(
        Proc(
            "scheduler",
            "scheduler worker",
            [
                *celery,
                "worker",
                "--loglevel",
                "INFO",
                "--queues",
                "schedule",
                "--hostname",
                "scheduler@%h",
                "--concurrency",
                "1",
                "--without-gossip",
                "--without-mingle",
            ],
            {**env, "RW_WORKER_NICE": "0"},
            tmp / "scheduler.log",
        )
    )
    # As the product runs them (devstack, compose): ingest alone at the web's priority, beat's
    # other work (overview rebuilds, rollups, retention) on a background worker at RW_WORKER_NICE.
    procs.append(
        Proc(
            "background",
            "background worker",
            [
                *celery,
                "worker",
                "--loglevel",
                "INFO",
                "--queues",
                "default",
                "--hostname",
                "background@%h",
                "--concurrency",
                "2",
                "--without-gossip",
                "--without-mingle",
            ],
            env,
            tmp / "background.log",
        )
    )
    ingest_env = env if ns.worker_nice is not None else {**env, "RW_WORKER_NICE": "0"}
    for i in range(ns.ingest_workers):
        procs.append(
            Proc(
                f"ingest{i}",
                "ingest workers",
                [
                    *celery,
                    "worker",
                    "--loglevel",
                    "INFO",
                    "--queues",
                    "ingest",
                    "--hostname",
                    f"ingest{i}@%h",
                    "--concurrency",
                    str(ns.ingest_concurrency),
                    "--without-gossip",
                    "--without-mingle",
                ],
                ingest_env,
                tmp / f"ingest{i}.log",
            )
        )
    for slug in slugs:
        procs.append(
            Proc(
                f"region-{slug}",
                "region workers",
                [
                    *celery,
                    "worker",
                    "--loglevel",
                    "INFO",
                    "--queues",
                    f"probes.{slug}",
                    "--hostname",
                    f"{slug}@%h",
                    *region_args,
                    "--without-gossip",
                    "--without-mingle",
                ],
                {
                    **env,
                    **dict.fromkeys(SERVER_ONLY_SECRETS, ""),
                    "RW_WORKER_ONLY": "true",
                    "RW_REGION": slug,
                    "RW_REGION_KEYS": keys[slug],
                    "RW_SPOOL_DIR": str(tmp / f"spool-{slug}"),
                },
                tmp / f"region-{slug}.log",
            )
        )
    beat = Proc(
        "beat",
        "beat",
        [*celery, "beat", "--loglevel", "INFO", "--schedule", str(tmp / "beat"), "--pidfile", ""],
        env,
        tmp / "beat.log",
    )
    procs.append(beat)
    servers = _servers(env)
    pages = Pages()
    try:
        for p in procs:
            p.start()
        print(
            f"started {len(procs)} processes (logs in {tmp}); warming up {warmup_s} s", flush=True
        )
        time.sleep(warmup_s)
        for p in procs:
            if p.proc and p.proc.poll() is not None:
                print(f"{p.name} exited ({p.proc.returncode}); see {p.log}")
                return 1
        pages.start()
        roots: dict[str, list[int]] = {}
        for p in procs:
            assert p.proc is not None
            roots.setdefault(p.component, []).append(p.proc.pid)
        for name, pids in servers.items():
            roots.setdefault(name, []).extend(pids)

        def trees() -> dict[str, list[Any]]:
            found = {n: [x for pid in pids for x in _tree(pid)] for n, pids in roots.items()}
            return found | {"bench (pages)": _tree(os.getpid())[:1]}

        cpu0 = {name: _cpu(ps) for name, ps in trees().items()}
        start = datetime.now(UTC)
        t0 = time.monotonic()
        # (nice, start, end) of each phase, for the window's TTFT by phase.
        phases: list[tuple[int, datetime, datetime]] = []
        if alternate:
            workers = ("scheduler worker", "ingest workers", "region workers")
            i = 0
            while time.monotonic() - t0 < ns.measure:
                nice = alternate[i % 2]
                pids = [p.pid for c in workers for p in trees().get(c, [])]
                pages.phase = None
                _renice(pids, nice)
                pages.phase = nice
                begun = datetime.now(UTC)
                time.sleep(max(0.0, min(ns.phase, ns.measure - (time.monotonic() - t0))))
                phases.append((nice, begun, datetime.now(UTC)))
                i += 1
            pages.phase = None
        else:
            time.sleep(ns.measure)
        wall = time.monotonic() - t0
        end = datetime.now(UTC)
        comps = trees()
        cpu = {name: _used(cpu0[name], _cpu(ps)) / wall for name, ps in comps.items()}
        rss = {name: _rss(ps) for name, ps in comps.items()}
        pages.stop.set()
        pages.join()
        # One more tick after the window's end, so its last slots are created before beat
        # stops (else up to a tick's worth of them counts as never created).
        time.sleep(max(0.0, tick_s + 2 - (time.monotonic() - t0 - wall)))
        beat.stop()
        # Close the window: every slot of it done or recorded missed (the sweep runs with
        # the tick, which has stopped: run it here once its deadlines have passed).
        from monitor.models import ProbeSlot
        from monitor.pipeline.ingest import results as ingest

        # The window's last slots end by their deadline (the longest task's) and grace.
        wait_until = time.monotonic() + world.longest_timeout_s + ns.grace + 30
        window = ProbeSlot.objects.filter(slot_at__gte=start, slot_at__lt=end)
        while time.monotonic() < wait_until and window.filter(status="dispatched").exists():
            time.sleep(2)
        swept = 0
        if window.filter(status="dispatched").exists():
            while n := ingest.sweep_missed():
                swept += n
        counts = {s: window.filter(status=s).count() for s in ("done", "missed", "dispatched")}
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT extract(epoch FROM rw_bench_written_at - (started_at + "
                "coalesce(e2e_ms, 0) * interval '1 millisecond')) FROM monitor_proberesult "
                # A scenario's calls are sent together when the whole scenario ends.
                "WHERE started_at >= %s AND started_at < %s AND outcome <> 'missed' "
                "AND scenario_id IS NULL",
                [start, end],
            )
            lags = [float(r[0]) for r in cursor.fetchall()]
            cursor.execute(
                "SELECT count(*) FROM monitor_proberesult WHERE rw_bench_written_at >= %s "
                "AND rw_bench_written_at < %s",
                [start, end],
            )
            written = cursor.fetchone()[0]
            cursor.execute(
                "SELECT outcome, error_kind, count(*) FROM monitor_proberesult "
                "WHERE started_at >= %s AND started_at < %s GROUP BY 1, 2 ORDER BY 3 DESC",
                [start, end],
            )
            outcomes = cursor.fetchall()
            measured = _timings(cursor, start, end)
            lag_known = probe_stats.has_start_lag(cursor)
            start_lags = probe_stats.start_lags_ms(cursor, start, end) if lag_known else []
            late, unsent, other_missed = probe_stats.missed(cursor, start, end)
            flight = [n for _, n in probe_stats.in_flight(cursor, start, end)]
            # Of the probes that started in each phase (its first 2 s left out).
            by_nice: dict[int, tuple[list[float], list[float]]] = {}
            for nice, begun, ended in phases:
                ttfts, e2es = _timings(cursor, begun + timedelta(seconds=2), ended)
                kept = by_nice.setdefault(nice, ([], []))
                kept[0].extend(ttfts)
                kept[1].extend(e2es)
        durations: dict[str, list[float]] = {}
        skipped: dict[str, int] = {}  # runs that did nothing (the overview, not yet due)
        for p in procs:
            if p.component in ("ingest workers", "scheduler worker", "background worker"):
                for m in SUCCEEDED.finditer(p.log.read_text(errors="replace")):
                    if m.group(3).strip() == "None":
                        skipped[m.group(1)] = skipped.get(m.group(1), 0) + 1
                    else:
                        durations.setdefault(m.group(1), []).append(float(m.group(2)))
    finally:
        pages.stop.set()
        for p in reversed(procs):
            p.stop()

    expected = combos * ns.measure / ns.interval
    print(
        f"\nwindow {ns.measure} s ({start:%H:%M:%S}-{end:%H:%M:%S} UTC), ~{expected:,.0f} slots due"
    )
    # Slots the tick never created in the window (it fell behind) count as missed too.
    absent = max(0, round(expected) - sum(counts.values()))
    missed_ok = counts["missed"] == 0 and counts["dispatched"] == 0 and absent <= expected / 100
    print(
        f"  slots: {counts['done']:,} done, {counts['missed']:,} missed, {counts['dispatched']:,} "
        f"still open{f' (swept {swept})' if swept else ''}, ~{absent:,} never created  "
        f"{'ok' if missed_ok else 'MISSES TARGET'} (0 missed)"
    )
    print(
        f"  missed results: {late:,} started late (a worker did not run them), {unsent:,} not "
        f"sent (the tick created them too late), {other_missed:,} no result by the deadline"
    )
    if lag_known:
        start_p99_s = _p(start_lags, 0.99) / 1000
        print(
            f"  start lag: p50 {_p(start_lags, 0.5):.0f} ms, p99 {start_p99_s * 1000:.0f} ms, max "
            f"{max(start_lags, default=float('nan')):.0f} ms over {len(start_lags):,} probes  "
            f"{'ok' if start_p99_s <= 1 else 'MISSES TARGET'} (p99 <= 1 s)"
        )
    else:
        print("  start lag: not recorded by this version (no start_lag_ms column)")
    shown = ", ".join(f"{o}/{k or '-'} {n}" for o, k, n in outcomes)
    print(f"  outcomes of the window's rows: {shown}")
    mean_flight = probe_stats.mean(flight)
    per_k = mean_flight / 1000 or float("nan")  # none in flight: no per-1,000 figure
    print(
        f"  probes in flight (every 5 s): mean {mean_flight:,.0f}, max {max(flight, default=0):,}; "
        f"region workers per 1,000 in flight: {cpu['region workers'] / per_k:.2f} cores, "
        f"{rss['region workers'] / per_k:,.0f} MiB RSS ({len(slugs)} processes, "
        f"{rss['region workers'] / len(slugs):,.0f} MiB each)"
    )
    ttfts, e2es = measured
    print(
        f"  measured: TTFT p50 {_p(ttfts, 0.5):.0f} ms, p99 {_p(ttfts, 0.99):.0f} ms; e2e p50 "
        f"{_p(e2es, 0.5):.0f} ms, p99 {_p(e2es, 0.99):.0f} ms (compare runs at another "
        "--worker-nice)"
    )
    lag_p99 = _p(lags, 0.99)
    print(
        f"  ingest lag: p50 {_p(lags, 0.5):.2f} s, p99 {lag_p99:.2f} s, max "
        f"{max(lags) if lags else float('nan'):.2f} s over {len(lags):,} results (scenario "
        "calls left out)  "
        f"{'ok' if lag_p99 < 5 else 'MISSES TARGET'} (p99 < 5 s)"
    )
    for task_name in (
        "monitor.tasks.tick",
        "monitor.tasks.ingest_results",
        "monitor.tasks.refresh_overview",
    ):
        d = durations.get(task_name, [])
        print(
            f"  {task_name.split('.')[-1]:16} duration p50 {_p(d, 0.5) * 1000:7.0f} ms, "
            f"p99 {_p(d, 0.99) * 1000:7.0f} ms ({len(d)} runs"
            + (f"; {skipped[task_name]} skipped, not due" if task_name in skipped else "")
            + ")"
        )
    print(f"  rows written: {written / wall:,.1f} /s (due: {combos / ns.interval:,.1f} /s)")
    print(f"  {'component':18} {'CPU (cores)':>11} {'RSS (MiB)':>10}")
    for name in cpu:
        print(f"  {name:18} {cpu[name]:11.2f} {rss[name]:10.0f}")
    print(
        f"  {'page':14} {'idle p95':>9} {'load p50':>9} {'load p95':>9} {'load/idle':>9}"
        f"  {'queries':>7} {'SQL p50':>8} {'SQL p95':>8} {'CPU p50':>8} {'CPU p95':>8} {'idle CPU':>8}"
    )
    worst = 0.0
    for name, _url in urls:
        base = idle.times.get(name, [])
        during = pages.times.get(name, [])
        p95 = _p(during, 0.95)
        worst = max(worst, p95)
        sql = pages.sql.get(name, [])
        own = pages.cpu.get(name, [])
        print(
            f"  {name:14} {_p(base, 0.95):7.1f}ms {_p(during, 0.5):7.1f}ms {p95:7.1f}ms "
            f"{p95 / _p(base, 0.95):8.1f}x  {pages.queries.get(name, 0):7} "
            f"{_p(sql, 0.5):6.1f}ms {_p(sql, 0.95):6.1f}ms {_p(own, 0.5):6.1f}ms "
            f"{_p(own, 0.95):6.1f}ms {_p(idle.cpu.get(name, []), 0.5):6.1f}ms  ({len(during)} reads)"
        )
    print(
        f"  pages: worst p95 {worst:.1f} ms  {'ok' if worst < 100 else 'MISSES TARGET'} (< 100 ms); {pages.failed} failed reads"
    )
    if alternate:
        a, b = alternate
        print(
            f"  workers' nice alternated {a} and {b} every {ns.phase} s (same run): page p95 "
            f"at {a} / at {b}, then probes' TTFT and e2e p50/p99 by the phase they started in"
        )
        for name, _url in urls:
            got = pages.by_phase.get(name, {})
            at_a, at_b = got.get(a, []), got.get(b, [])
            print(
                f"  {name:14} {_p(at_a, 0.95):7.1f}ms / {_p(at_b, 0.95):7.1f}ms  "
                f"({len(at_a)} / {len(at_b)} reads)"
            )
        for nice in alternate:
            ttfts, e2es = by_nice.get(nice, ([], []))
            print(
                f"  probes at nice {nice:2}: TTFT {_p(ttfts, 0.5):.0f}/{_p(ttfts, 0.99):.0f} ms, "
                f"e2e {_p(e2es, 0.5):.0f}/{_p(e2es, 0.99):.0f} ms ({len(ttfts):,} probes)"
            )
    print(
        "  where a read's time went under load, p50 / p95 (ms): the reader's CPU, its wait for a"
        " CPU, its PostgreSQL backend's CPU and wait for a CPU"
    )
    for name, _url in urls:
        parts = (pages.cpu, pages.wait, pages.pg_cpu, pages.pg_wait)
        shown = "  ".join(
            f"{_p(part.get(name, []), 0.5):5.1f}/{_p(part.get(name, []), 0.95):5.1f}"
            for part in parts
        )
        print(f"  {name:14} {shown}")
    print("  each page's slowest queries under load, p50 / p95 (#n: its place in the page)")
    for name, _url in urls:
        found = pages.per_query.get(name, {})
        top = sorted(found.items(), key=lambda kv: -_p(kv[1], 0.95))[:3]
        shown = ", ".join(f"{label} {_p(v, 0.5):.1f}/{_p(v, 0.95):.1f}" for label, v in top)
        print(f"  {name:14} {shown}")
    with contextlib.suppress(Exception):
        print(f"  machine load after: {os.getloadavg()}")
    return 0


def main() -> None:
    from bench import mixes

    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--mix",
        choices=sorted(mixes.MIXES),
        default="realistic",
        help="the route mix (bench/mixes.py): realistic (slow reasoning routes and scenarios "
        "among fast ones) or fast (every probe well under a second)",
    )
    parser.add_argument("--scale", type=int, default=1, help="multiplies the routes")
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--routes", type=int, default=30)
    parser.add_argument("--regions", type=int, default=6)
    parser.add_argument("--interval", type=int, default=60, help="probe interval (s)")
    parser.add_argument("--tick", type=int, default=10, help="TICK_SECONDS")
    parser.add_argument("--grace", type=int, default=15, help="SLOT_GRACE_SECONDS")
    parser.add_argument(
        "--history-hours",
        type=int,
        default=24,
        help="hours of results written before the load (0: start from an empty database)",
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="seconds (default: the mix's, 300 or 60)"
    )
    parser.add_argument("--measure", type=int, default=120)
    parser.add_argument("--ingest-workers", type=int, default=2)
    parser.add_argument("--ingest-concurrency", type=int, default=2)
    parser.add_argument(
        "--region-concurrency",
        type=int,
        default=None,
        help="messages at once per region worker (default: monitor.limits.region_worker_args)",
    )
    parser.add_argument(
        "--worker-nice",
        type=int,
        default=None,
        help="RW_WORKER_NICE for every celery worker (default: the product's, 10)",
    )
    parser.add_argument(
        "--alternate-nice",
        default="",
        help="e.g. 0,10: switch every worker between two nice values every --phase seconds "
        "during the window (needs root to go back down) and report pages and probe timings "
        "by phase: an A/B in one run, immune to the host's drift",
    )
    parser.add_argument("--phase", type=int, default=15, help="seconds per --alternate-nice phase")
    parser.add_argument("--flush", type=int, default=2, help="RW_RESULT_FLUSH_SECONDS")
    sys.exit(run(parser.parse_args()))


if __name__ == "__main__":
    main()
