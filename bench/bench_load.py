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
- ingest lag p50/p99: a successful probe's end (started_at + e2e) to its row's insert (target p99 < 5 s;
  a failed probe stores no end);
- tick duration p50/p99 (celery's own "succeeded in" of monitor.tasks.tick), and ingest
  task duration;
- rows per second written in the window;
- CPU (cores used) and memory (RSS) per component, PostgreSQL and Redis included;
- the simulator's listen queue overflows during the run (the kernel's TcpExt ListenOverflows,
  every listener's): 0 when the stand-in for the providers accepted every connection in time;
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
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import load_statements  # noqa: E402
from bench.load_pages import Pages  # noqa: E402
from bench.load_procs import Proc, _cpu, _free_port, _renice, _rss, _servers, _tree, _used  # noqa: E402
from bench.load_report import Setup, Window, report  # noqa: E402
from devstack.stack import WEB_NICE  # noqa: E402
from devstack.supervision import raise_priority  # noqa: E402

PY = sys.executable
BENCH_DB = "routewatch_bench_load"
SUCCEEDED = re.compile(
    r"Task (monitor\.tasks\.\w+)\[[^\]]+\] succeeded in ([0-9.]+)s: (.*)$", re.MULTILINE
)
SERVER_ONLY_SECRETS = ("SECRET_KEY", "FIELD_ENCRYPTION_KEYS", "DATABASE_URL", "EMAIL_HOST_PASSWORD")


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


def _timings(cursor: Any, since: datetime, until: datetime) -> tuple[list[float], list[float]]:
    """TTFT and e2e (ms) of the probes that started in [since, until) and succeeded."""
    cursor.execute(
        "SELECT ttft_ms, e2e_ms FROM monitor_proberesult WHERE started_at >= %s "
        "AND started_at < %s AND outcome = 'ok' AND ttft_ms IS NOT NULL AND e2e_ms IS NOT NULL",
        [since, until],
    )
    rows = cursor.fetchall()
    return [r[0] for r in rows], [r[1] for r in rows]


def run(ns: argparse.Namespace) -> int:
    """The bench in the order it runs: prepare the world and its history, read the pages idle,
    start the processes, measure the window and close it, stop them, then report."""
    setup = _prepare(ns)
    _announce(ns, setup)
    _load_history(ns)
    idle, urls, _client = _idle_pages()  # the idle reader's client lives as long as the run
    procs, beat = _processes(ns, setup)
    servers = _servers(setup.env)
    pages = Pages()
    overflows_before = listen_overflows()
    try:
        window = _measure(ns, setup, procs, beat, pages, servers)
        if window is None:
            return 1
    finally:
        pages.stop.set()
        for p in reversed(procs):
            p.stop()
    report(ns, setup, window, idle, pages, urls)
    _report_simulator(ns, overflows_before, listen_overflows())
    return 0


def listen_overflows() -> dict[str, int]:
    """The kernel's TcpExt ListenOverflows (a connection found its listener's accept queue
    full) and ListenDrops (SYNs dropped at a listener, overflows included), from
    /proc/net/netstat (what `nstat -az TcpExtListenOverflows` reads). Counted for every
    listener of this network namespace, the simulator's and any other's."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return {}
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return {k: int(row[k]) for k in ("ListenOverflows", "ListenDrops") if k in row}
    return {}


class SimWatch(threading.Thread):
    """The simulator's own counters during the window (GET /_sim/stats every 5 s): requests
    read but not yet answered with headers (most at once, per process), and at the end the
    time from a request's read to its headers. A probe that times out waiting for headers
    while these stay low waited before the simulator read its request (connect, accept)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.awaiting_max = 0
        self.per_process_max: dict[int, int] = {}
        self.last: dict[str, Any] = {}

    def fetch(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/_sim/stats", timeout=10) as answer:  # noqa: S310
            data: dict[str, Any] = json.load(answer)
        return data

    def run(self) -> None:
        while not self.stop.wait(5.0):
            with contextlib.suppress(OSError, ValueError):
                self.last = stats = self.fetch()
                self.awaiting_max = max(self.awaiting_max, stats.get("awaiting_headers", 0))
                for proc in stats.get("per_process", []):
                    pid = proc["pid"]
                    self.per_process_max[pid] = max(
                        self.per_process_max.get(pid, 0), proc["awaiting_headers"]
                    )

    def report(self) -> None:
        waits = self.last.get("headers_wait_ms") or {}
        print(
            f"  requests awaiting headers at once, most: {self.awaiting_max:,} "
            f"(per process: {sorted(self.per_process_max.values())}); a request's read to its "
            f"headers: p50 {waits.get('p50')}, p99 {waits.get('p99')}, max {waits.get('max')} ms "
            f"over {waits.get('count')} (the last {waits.get('count')} read)"
        )
        for proc in self.last.get("per_process", []):
            print(
                f"    process {proc['pid']}: {proc['requests']:,} requests, "
                f"{proc['active_streams']:,} streams open at the end"
            )


SIM_WATCH: SimWatch | None = None


def _report_simulator(
    ns: argparse.Namespace, before: dict[str, int], after: dict[str, int]
) -> None:
    """Whether the stand-in for the providers kept up: a connection its listeners could not
    take in time is a probe failing to connect (SYN retransmits) or waiting for headers."""
    print(f"simulator: {ns.sim_processes} process(es), listen backlog {ns.sim_backlog} each")
    if not before or not after:
        print("  listen queue overflows: not readable here (/proc/net/netstat)")
        return
    overflows = after["ListenOverflows"] - before["ListenOverflows"]
    drops = after["ListenDrops"] - before["ListenDrops"]
    verdict = (
        "the simulator kept up"
        if overflows == 0 and drops == 0
        else "a listener did not keep up (the simulator's unless another server overflowed): "
        "probes failed connecting, the load was lighter than asked"
    )
    print(
        f"  listen queue overflows during the run: {overflows:,} (SYNs dropped {drops:,}; "
        f"the machine's, every listener's) -> {verdict}"
    )
    if SIM_WATCH is not None:
        SIM_WATCH.report()


def _prepare(ns: argparse.Namespace) -> Setup:
    """A fresh database (migrated, static files collected), the bench's own broker database,
    the simulated world of the mix and a key for each region."""
    from bench import mixes

    mix = mixes.MIXES[ns.mix]
    admin_url = os.environ["DATABASE_URL"]
    url = _recreate(admin_url)
    redis = urlsplit(os.environ["REDIS_URL"])
    redis_url = urlunsplit(redis._replace(path="/9"))  # the bench's own broker database
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-load-"))
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
        "TICK_SECONDS": str(ns.tick),
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
    with connection.cursor() as cursor:
        # Bench only: when each row was inserted (ingest lag).
        cursor.execute(
            "ALTER TABLE monitor_proberesult ADD COLUMN rw_bench_written_at timestamptz "
            "DEFAULT clock_timestamp()"
        )
    region_args = region_pool_args(ns.region_concurrency)
    keys = {}
    for slug in world.regions:
        out = subprocess.run(
            [PY, str(ROOT / "manage.py"), "region_key", "new", slug, "--replace"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        keys[slug] = out.stdout.strip()
    return Setup(mix, env, tmp, sim_port, world, routes, keys, region_args, alternate)


def _announce(ns: argparse.Namespace, setup: Setup) -> None:
    from bench import mixes

    mix, world, combos = setup.mix, setup.world, setup.world.combinations
    scenarios = (
        f" ({world.scenario_combinations} of them scenarios of {mixes.SCENARIO_STEPS} calls)"
        if world.scenario_combinations
        else ""
    )
    print(
        f"load ({mix.name} mix, simulator {mix.config.name}): {ns.tasks} tasks x {setup.routes} "
        f"routes x {ns.regions} regions = {combos:,} combinations{scenarios}, a probe every "
        f"{ns.interval} s = {combos / ns.interval:.0f} slots/s; "
        f"tick every {ns.tick} s; {ns.ingest_workers} ingest worker(s) x concurrency "
        f"{ns.ingest_concurrency}, region workers {' '.join(setup.region_args)}, "
        f"results flushed every {ns.flush} s, workers at nice "
        f"{setup.env.get('RW_WORKER_NICE', 'the product default')}, the tick on a scheduler worker "
        f"of its own; pages read at the web's nice ({WEB_NICE}, as `make run` starts the web), "
        f"the simulator at nice {ns.sim_nice}",
        flush=True,
    )
    with contextlib.suppress(Exception):
        print(f"machine load before start: {os.getloadavg()}", flush=True)


def _load_history(ns: argparse.Namespace) -> None:
    """Steady state: the pages and ingest's indexes at a day's size, not a few minutes'; then
    the overview as beat keeps it."""
    if ns.history_hours:
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


def _idle_pages() -> tuple[Pages, list[tuple[str, str]], Any]:
    """Same-run baseline: the pages with no load (the same world and history)."""
    idle = Pages()
    urls = idle.urls()
    from django.contrib.auth.models import User
    from django.test import Client

    from monitor import db_priority, heap

    user, _ = User.objects.get_or_create(username="bench-load", is_staff=True)
    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    heap.settle()  # as monitor.wsgi does once the application is loaded
    db_priority.install()  # likewise: the reader's backends at its nice, once it is raised
    idle.once(client, urls)  # warm: templates compiled, caches filled, as on a running server
    idle.times.clear()
    for _ in range(10):
        idle.once(client, urls)
    return idle, urls, client


def _processes(ns: argparse.Namespace, setup: Setup) -> tuple[list[Proc], Proc]:
    """Every process of the deployment, not started yet; beat is last (and returned apart: it
    stops first, when the window ends)."""
    env, tmp = setup.env, setup.tmp

    def worker(
        name: str, component: str, queue: str, pool: list[str], env: dict[str, str], host: str
    ) -> Proc:
        """A celery worker of one queue, as the product starts them."""
        argv = [PY, "-m", "celery", "-A", "monitor", "worker", "--loglevel", "INFO"]
        argv += ["--queues", queue, "--hostname", f"{host}@%h", *pool]
        argv += ["--without-gossip", "--without-mingle"]
        return Proc(name, component, argv, env, tmp / f"{name}.log")

    simulator = [PY, "-m", "simulator", "--config", str(setup.mix.config)]
    simulator += ["--port", str(setup.sim_port), "--processes", str(ns.sim_processes)]
    simulator += ["--backlog", str(ns.sim_backlog)]
    procs = [Proc("simulator", "simulator", simulator, env, tmp / "simulator.log")]
    # The tick alone, as the product runs it (monitor.pipeline.queues.SCHEDULE_QUEUE).
    one = ["--concurrency", "1"]
    procs.append(
        worker(
            "scheduler",
            "scheduler worker",
            "schedule",
            one,
            {**env, "RW_WORKER_NICE": "0"},
            "scheduler",
        )
    )
    # As the product runs them (devstack, compose): ingest alone at the web's priority, beat's
    # other work (overview rebuilds, rollups, retention) on a background worker at RW_WORKER_NICE.
    two = ["--concurrency", "2"]
    procs.append(worker("background", "background worker", "default", two, env, "background"))
    ingest_env = env if ns.worker_nice is not None else {**env, "RW_WORKER_NICE": "0"}
    ingest_pool = ["--concurrency", str(ns.ingest_concurrency)]
    for i in range(ns.ingest_workers):
        name = f"ingest{i}"
        procs.append(worker(name, "ingest workers", "ingest", ingest_pool, ingest_env, name))
    for slug in setup.world.regions:
        region_env = {
            **env,
            **dict.fromkeys(SERVER_ONLY_SECRETS, ""),
            "RW_WORKER_ONLY": "true",
            "RW_REGION": slug,
            "RW_REGION_KEYS": setup.keys[slug],
            "RW_SPOOL_DIR": str(tmp / f"spool-{slug}"),
        }
        queue = f"probes.{slug}"
        procs.append(
            worker(f"region-{slug}", "region workers", queue, setup.region_args, region_env, slug)
        )
    beat_argv = [PY, "-m", "celery", "-A", "monitor", "beat", "--loglevel", "INFO"]
    beat_argv += ["--schedule", str(tmp / "beat"), "--pidfile", ""]
    beat = Proc("beat", "beat", beat_argv, env, tmp / "beat.log")
    procs.append(beat)
    return procs, beat


def _prioritize_simulator(ns: argparse.Namespace, simulator: Proc) -> None:
    """The simulator's processes (its workers lead sessions of their own) at --sim-nice, once
    its workers have started."""
    assert simulator.proc is not None
    deadline = time.monotonic() + 30
    tree = _tree(simulator.proc.pid)
    while len(tree) < ns.sim_processes + (ns.sim_processes > 1) and time.monotonic() < deadline:
        time.sleep(0.2)
        tree = _tree(simulator.proc.pid)
    _renice([p.pid for p in tree], ns.sim_nice)
    got = set()
    for p in tree:
        with contextlib.suppress(OSError):
            got.add(os.getpriority(os.PRIO_PROCESS, p.pid))
    print(f"simulator: {len(tree)} processes at nice {sorted(got)}", flush=True)


def _measure(
    ns: argparse.Namespace,
    setup: Setup,
    procs: list[Proc],
    beat: Proc,
    pages: Pages,
    servers: dict[str, list[int]],
) -> Window | None:
    """Start the processes, warm up, measure the window (pages read meanwhile), then close it
    and read what it stored. None when a process exited during the warm-up."""
    warmup_s = setup.mix.warmup_s if ns.warmup is None else ns.warmup
    for p in procs:
        p.start()
    _prioritize_simulator(ns, procs[0])
    print(
        f"started {len(procs)} processes (logs in {setup.tmp}); warming up {warmup_s} s", flush=True
    )
    time.sleep(warmup_s)
    for p in procs:
        if p.proc and p.proc.poll() is not None:
            print(f"{p.name} exited ({p.proc.returncode}); see {p.log}")
            return None
    # The pages are read here, standing for the web: at the web's CPU priority, as `make run`
    # starts it (devstack.stack.WEB_NICE; the reading thread inherits it from this one).
    if not raise_priority(os.getpid(), WEB_NICE, session=False):
        print(f"pages read at nice 0: nice {WEB_NICE} needs root or CAP_SYS_NICE", flush=True)
    else:  # threads started before, as the pages' background builder, at it too (a web
        # worker runs at it from its start, every thread of it)
        for tid in os.listdir("/proc/self/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), WEB_NICE)
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

    global SIM_WATCH
    SIM_WATCH = SimWatch(f"http://127.0.0.1:{setup.sim_port}")
    with contextlib.suppress(OSError):
        reset = urllib.request.Request(f"{SIM_WATCH.url}/_sim/stats/reset", method="POST")  # noqa: S310
        urllib.request.urlopen(  # noqa: S310
            reset,
            timeout=10,
        ).close()
    SIM_WATCH.start()
    statements = ns.pg_statements > 0 and load_statements.start(setup.env["DATABASE_URL"])
    cpu0 = {name: _cpu(ps) for name, ps in trees().items()}
    start = datetime.now(UTC)
    t0 = time.monotonic()
    phases = _hold_window(ns, setup.alternate, pages, trees, t0)
    wall = time.monotonic() - t0
    end = datetime.now(UTC)
    comps = trees()
    cpu = {name: _used(cpu0[name], _cpu(ps)) / wall for name, ps in comps.items()}
    rss = {name: _rss(ps) for name, ps in comps.items()}
    statement_rows = load_statements.read(setup.env["DATABASE_URL"]) if statements else []
    pages.stop.set()
    pages.join()
    SIM_WATCH.stop.set()
    SIM_WATCH.join()
    with contextlib.suppress(OSError, ValueError):
        SIM_WATCH.last = SIM_WATCH.fetch()
    # One more tick after the window's end, so its last slots are created before beat
    # stops (else up to a tick's worth of them counts as never created).
    time.sleep(max(0.0, ns.tick + 2 - (time.monotonic() - t0 - wall)))
    beat.stop()
    counts, swept = _close_window(ns, setup, start, end)
    window = _read_window(start, end, wall, cpu, rss, counts, swept, phases)
    window.durations, window.skipped = _task_durations(procs)
    if statements:
        load_statements.report(statement_rows, ns.pg_statements, wall, window.written)
    return window


def _hold_window(
    ns: argparse.Namespace,
    alternate: tuple[int, ...],
    pages: Pages,
    trees: Callable[[], dict[str, list[Any]]],
    t0: float,
) -> list[tuple[int, datetime, datetime]]:
    """Let the window run (the workers' nice switched every phase with --alternate-nice);
    returns (nice, start, end) of each phase, for the window's TTFT by phase."""
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
    return phases


def _close_window(
    ns: argparse.Namespace, setup: Setup, start: datetime, end: datetime
) -> tuple[dict[str, int], int]:
    """Close the window: every slot of it done or recorded missed (the sweep runs with the
    tick, which has stopped: run it here once its deadlines have passed)."""
    from monitor.models import ProbeSlot
    from monitor.pipeline.ingest import results as ingest

    # The window's last slots end by their deadline (the longest task's) and grace.
    wait_until = time.monotonic() + setup.world.longest_timeout_s + ns.grace + 30
    window = ProbeSlot.objects.filter(slot_at__gte=start, slot_at__lt=end)
    while time.monotonic() < wait_until and window.filter(status="dispatched").exists():
        time.sleep(2)
    swept = 0
    if window.filter(status="dispatched").exists():
        while n := ingest.sweep_missed():
            swept += n
    counts = {s: window.filter(status=s).count() for s in ("done", "missed", "dispatched")}
    return counts, swept


def _read_window(
    start: datetime,
    end: datetime,
    wall: float,
    cpu: dict[str, float],
    rss: dict[str, float],
    counts: dict[str, int],
    swept: int,
    phases: list[tuple[int, datetime, datetime]],
) -> Window:
    """What the window stored: ingest lags, rows written, outcomes, timings, start lags."""
    from django.db import connection

    from bench import probe_stats

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM rw_bench_written_at - (started_at + "
            "e2e_ms * interval '1 millisecond')) FROM monitor_proberesult "
            # A scenario's calls are sent together when the whole scenario ends. A failed
            # probe stores no end (no e2e): counted from its start, a 135 s header timeout
            # would read as 135 s of ingest lag. Successful probes only.
            "WHERE started_at >= %s AND started_at < %s AND outcome = 'ok' "
            "AND e2e_ms IS NOT NULL AND scenario_id IS NULL",
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
        # Failures by the route's model and whether the connection was made (connect_ms): a
        # header timeout on a connection never made waited in a listen queue, not the server.
        cursor.execute(
            "SELECT r.model_id, p.error_kind, p.connect_ms IS NOT NULL, count(*), "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY p.connect_ms) "
            "FROM monitor_proberesult p JOIN monitor_route r ON r.id = p.route_id "
            "WHERE p.started_at >= %s AND p.started_at < %s AND p.outcome <> 'ok' "
            "GROUP BY 1, 2, 3 ORDER BY 4 DESC",
            [start, end],
        )
        failures = cursor.fetchall()
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
    return Window(
        start,
        end,
        wall,
        cpu,
        rss,
        counts,
        swept,
        lags,
        written,
        outcomes,
        failures,
        measured,
        lag_known,
        start_lags,
        late,
        unsent,
        other_missed,
        flight,
        by_nice,
        {},
        {},
    )


def _task_durations(procs: list[Proc]) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Celery's own "succeeded in" of each task, from the workers' logs, and the runs that
    did nothing (the overview, not yet due)."""
    durations: dict[str, list[float]] = {}
    skipped: dict[str, int] = {}
    for p in procs:
        if p.component in ("ingest workers", "scheduler worker", "background worker"):
            for m in SUCCEEDED.finditer(p.log.read_text(errors="replace")):
                if m.group(3).strip() == "None":
                    skipped[m.group(1)] = skipped.get(m.group(1), 0) + 1
                else:
                    durations.setdefault(m.group(1), []).append(float(m.group(2)))
    return durations, skipped


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
    parser.add_argument(
        "--sim-processes",
        type=int,
        default=3,
        help="the simulator's worker processes (python -m simulator --processes): one could not "
        "accept 1,500 streams' connections in time on this machine",
    )
    parser.add_argument(
        "--sim-backlog", type=int, default=4096, help="the simulator's listen queue per process"
    )
    parser.add_argument(
        "--sim-nice",
        type=int,
        default=-5,
        help="the simulator's CPU priority (each worker's session; root): it stands for "
        "providers on other machines, so it takes the CPU before the deployment's processes; "
        "at 0 on a busy 2-core machine its workers fell minutes behind accepting connections",
    )
    parser.add_argument(
        "--pg-statements",
        type=int,
        default=0,
        help="print PostgreSQL's N costliest statements of the window (pg_stat_statements: a "
        "server given with DATABASE_URL that preloads it; the embedded one does not)",
    )
    sys.exit(run(parser.parse_args()))


if __name__ == "__main__":
    main()
