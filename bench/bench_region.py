"""One region worker process at rising numbers of slow streaming probes in flight: where its
start lag passes 1 s (the knee), and what it costs in CPU and memory until then.

    make bench-region                                # steps of 250 in flight up to 3,000
    make bench-region ARGS="--steps 500,1000,2000 --hold 60"

Real processes, loopback only: the simulator (simulator/configs/bench-realistic.toml), ONE
region worker (the real celery worker, started with monitor.limits.region_worker_args(), its
region key only, signed messages), one ingest worker; this process is the scheduler: it runs
monitor.tasks.tick every TICK_SECONDS, which claims the due slots and sends them signed, as
beat's tick does. A database of its own (routewatch_bench_region), rebuilt each run.

Every probe is a slow streaming one: reasoning routes that think in silence for ~21 or ~41 s,
then stream 400-500 tokens at 45-60 tok/s (e2e ~28 and ~52 s). Each step activates tasks (of
10 routes, one probe per route every --interval s) until about the step's number of probes are
in flight, waits until those have overlapped (--interval plus the longest probe), then holds
for --hold seconds. Per step it reports, from the stored results: probes in flight (every 5 s
of the hold, mean), start lag p50/p99 and missed slots (started late) of the probes planned in
the hold, and the worker's CPU (cores) and RSS; the simulator's and ingest's CPU alongside (on
a 2-core machine they share the worker's CPUs). The worker's own bound on probes in flight
(RW_PROBES_IN_FLIGHT) is raised out of the way, so what bounds it is its process. Steps stop
after the first whose start lag p99 passes 1 s (known once its probes have ended: a step
later). Figures as measured; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import mixes, probe_stats  # noqa: E402
from bench.bench_load import PY, SERVER_ONLY_SECRETS, _recreate, region_pool_args  # noqa: E402
from bench.load_pages import _schedstat  # noqa: E402
from bench.load_procs import Proc, _cpu, _free_port, _rss, _tree, _used  # noqa: E402
from bench.load_report import _p  # noqa: E402

BENCH_DB = "routewatch_bench_region"
REGION = "k0"
ROUTES_PER_TASK = 10
# Slow streaming routes only: the realistic mix's two shortest thinkers (so a step settles in
# about a minute and a half).
KNEE = replace(
    mixes.MIXES["realistic"],
    name="knee",
    models=(("think-20", "think-40"),),
    scenario_models=frozenset(),
    scenario_timeout_s=0,
)
# Their mean e2e (s), to size each step; the in-flight figures reported are measured.
KNEE_E2E_S = (27.6 + 52.1) / 2
LONGEST_E2E_S = 65.0


@dataclass
class Step:
    target: int
    tasks: int
    hold_start: datetime
    hold_end: datetime
    worker_cpu: float  # cores over the hold
    worker_rss_mib: float  # at the hold's end
    worker_wait: float  # seconds its threads waited for a CPU while runnable, per second
    sim_cpu: float
    ingest_cpu: float
    beacon_in_flight: int | None  # what the worker said it carried at the hold's end


def _waited_s(pid: int) -> float:
    """Seconds the process's threads have spent runnable but waiting for a CPU (Linux
    schedstat): a worker starved by other processes shows here, not in its CPU time."""
    total = 0.0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            total += _schedstat(f"/proc/{pid}/task/{tid}/schedstat")[1] / 1000
    return total


def _drain(redis_url: str, ticker: Ticker, most_s: float) -> None:
    """Wait until the worker carries nothing and the ingest queue is empty (at most most_s)."""
    import redis as redis_client

    from monitor.pipeline.messages import INGEST_QUEUE

    broker = redis_client.Redis.from_url(redis_url)
    until = time.monotonic() + most_s
    while time.monotonic() < until:
        if not _beacon_in_flight() and not broker.llen(INGEST_QUEUE):
            ticker.sleep(5)  # the last chunk of results, taken but not yet stored
            return
        ticker.sleep(5)
    print(f"results still coming after {most_s:.0f} s: the last steps may lack rows")


def _beacon_in_flight() -> int | None:
    from monitor.pipeline.region import liveness

    found = liveness.live_workers() or {}
    beacons = found.get(REGION, [])
    return sum(b["in_flight"] for b in beacons) if beacons else None


class Ticker:
    """monitor.tasks.tick every `every_s`, in this process (the bench is the scheduler)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.next_at = time.monotonic()
        self.durations_s: list[float] = []

    def sleep(self, seconds: float) -> None:
        """Wait `seconds`, ticking on time meanwhile."""
        from monitor import tasks

        until = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            if now >= self.next_at:
                t0 = time.perf_counter()
                tasks.tick()
                self.durations_s.append(time.perf_counter() - t0)
                self.next_at += self.every_s
                continue
            if now >= until:
                return
            time.sleep(min(self.next_at, until) - now)


@dataclass
class World:
    """What preparing the run made: the bench's database, broker and world, the region's key."""

    admin_url: str
    redis_url: str
    env: dict[str, str]
    tmp: Path
    sim_port: int
    per_task: float  # probes in flight a task adds
    task_count: int
    key: str
    region_args: list[str]


def run(ns: argparse.Namespace) -> int:
    """The bench in the order it runs: prepare, start the simulator, ingest and the region
    worker, then raise the load step by step until start lag passes the knee, drain, report."""
    steps = [int(s) for s in ns.steps.split(",")]
    world = _prepare(ns, steps)
    from django.db import connection

    from monitor.models import Task

    sim, ingest, worker = _processes(world)
    procs = [sim, ingest, worker]
    _announce(ns, world, steps)
    ticker = Ticker(ns.tick)
    done: list[Step] = []
    try:
        for p in procs:
            p.start()
        time.sleep(8)
        for p in procs:
            if p.proc and p.proc.poll() is not None:
                print(f"{p.name} exited ({p.proc.returncode}); see {p.log}")
                return 1
        assert worker.proc is not None
        idle_rss = _rss(_tree(worker.proc.pid))
        print(f"worker RSS idle: {idle_rss:.0f} MiB", flush=True)
        ticker.next_at = time.monotonic()
        active = 0
        for target in steps:
            wanted = min(world.task_count, math.ceil(target / world.per_task))
            if wanted > active:
                ids = list(Task.objects.order_by("pk").values_list("pk", flat=True))
                Task.objects.filter(pk__in=ids[active:wanted]).update(is_active=True)
                active = wanted
            done.append(_hold_step(ns, ticker, target, active, sim, ingest, worker))
            # The step before has ended by now: stop once its start lag passed the knee.
            if len(done) >= 2 and _lag_p99_ms(done[-2]) > ns.knee_ms:
                print(f"start lag p99 of step {done[-2].target} passed {ns.knee_ms} ms: stop")
                break
        Task.objects.update(is_active=False)
        # The last probes end, and their results reach the database (a saturated worker or
        # ingest can be minutes behind: the figures would lack the last steps' rows).
        ticker.sleep(LONGEST_E2E_S)
        _drain(world.redis_url, ticker, ns.drain)
    finally:
        for p in reversed(procs):
            p.stop()
        connection.close()
    _report(done, idle_rss, ticker)
    with contextlib.suppress(Exception):
        print(f"  machine load after: {os.getloadavg()}")
    if not ns.keep_db:
        _recreate(world.admin_url, BENCH_DB)  # empty again: nothing large left under ./var
    return 0


def _prepare(ns: argparse.Namespace, steps: list[int]) -> World:
    """A fresh database, the bench's own broker database, the knee world's tasks (inactive:
    the steps switch them on) and a key for the region."""
    admin_url = os.environ["DATABASE_URL"]
    url = _recreate(admin_url, BENCH_DB)
    redis = urlsplit(os.environ["REDIS_URL"])
    redis_url = urlunsplit(redis._replace(path="/10"))  # the bench's own broker database
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-region-"))
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "REDIS_URL": redis_url,
        "DJANGO_SETTINGS_MODULE": "monitor.settings",
        "PROVIDER_ALLOW_PRIVATE_NETWORKS": "true",
        "TICK_SECONDS": str(ns.tick),
        "SLOT_GRACE_SECONDS": "15",
        "RW_SPOOL_DIR": str(tmp / "spool"),
        "PYTHONUNBUFFERED": "1",
    }
    if ns.worker_nice is not None:
        env["RW_WORKER_NICE"] = str(ns.worker_nice)
    os.environ.update(env)
    subprocess.run(
        [PY, str(ROOT / "manage.py"), "migrate", "--noinput", "-v0"], env=env, check=True
    )
    import django

    django.setup()
    import redis as redis_client

    from monitor.models import Task

    redis_client.Redis.from_url(redis_url).flushdb()
    sim_port = _free_port()
    per_task = ROUTES_PER_TASK * KNEE_E2E_S / ns.interval  # probes in flight a task adds
    task_count = math.ceil(max(steps) / per_task)
    mixes.build_world(
        KNEE,
        f"http://127.0.0.1:{sim_port}",
        task_count,
        ROUTES_PER_TASK,
        1,
        ns.interval,
        region_prefix="k",
    )
    Task.objects.update(is_active=False)
    key = subprocess.run(
        [PY, str(ROOT / "manage.py"), "region_key", "new", REGION, "--replace"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    region_args = region_pool_args(ns.region_concurrency)
    return World(admin_url, redis_url, env, tmp, sim_port, per_task, task_count, key, region_args)


def _processes(world: World) -> tuple[Proc, Proc, Proc]:
    """The simulator, an ingest worker and the region worker, not started yet."""
    env, tmp = world.env, world.tmp
    celery = [PY, "-m", "celery", "-A", "monitor"]
    common = ["--loglevel", "INFO", "--without-gossip", "--without-mingle"]
    sim = Proc(
        "simulator",
        "simulator",
        [PY, "-m", "simulator", "--config", str(KNEE.config), "--port", str(world.sim_port)],
        env,
        tmp / "simulator.log",
    )
    ingest = Proc(
        "ingest",
        "ingest worker",
        [*celery, "worker", *common, "--queues", "ingest", "--hostname", "ingest@%h"],
        env,
        tmp / "ingest.log",
    )
    queue = ["--queues", f"probes.{REGION}", "--hostname", f"{REGION}@%h"]
    worker = Proc(
        "region",
        "region worker",
        [*celery, "worker", *common, *queue, *world.region_args],
        {
            **env,
            **dict.fromkeys(SERVER_ONLY_SECRETS, ""),
            "RW_WORKER_ONLY": "true",
            "RW_REGION": REGION,
            "RW_REGION_KEYS": world.key,
            "RW_SPOOL_DIR": str(tmp / "spool-region"),
            # Out of the way: the process, not its configured bound, is what is measured.
            "RW_PROBES_IN_FLIGHT": "100000",
        },
        tmp / "region.log",
    )
    return sim, ingest, worker


def _announce(ns: argparse.Namespace, world: World, steps: list[int]) -> None:
    print(
        f"region worker: {' '.join(world.region_args)}, RW_PROBES_IN_FLIGHT=100000; routes "
        f"{', '.join(KNEE.models[0])} (e2e ~28 and ~52 s); tasks of {ROUTES_PER_TASK} routes, "
        f"a probe a route every {ns.interval} s (~{world.per_task:.0f} in flight a task); tick every "
        f"{ns.tick} s (in this process); steps {steps}, each settling "
        f"{ns.interval + LONGEST_E2E_S:.0f} s then held {ns.hold} s; logs in {world.tmp}",
        flush=True,
    )


def _hold_step(
    ns: argparse.Namespace,
    ticker: Ticker,
    target: int,
    active: int,
    sim: Proc,
    ingest: Proc,
    worker: Proc,
) -> Step:
    """One step: let it settle, then hold it and measure the processes over the hold."""
    assert worker.proc is not None
    assert sim.proc is not None
    assert ingest.proc is not None
    ticker.sleep(ns.interval + LONGEST_E2E_S)
    trees = {
        "worker": _tree(worker.proc.pid),
        "sim": _tree(sim.proc.pid),
        "ingest": _tree(ingest.proc.pid),
    }
    cpu0 = {name: _cpu(ps) for name, ps in trees.items()}
    waited0 = _waited_s(worker.proc.pid)
    hold_start = datetime.now(UTC)
    t0 = time.monotonic()
    ticker.sleep(ns.hold)
    wall = time.monotonic() - t0
    cores = {name: _used(cpu0[name], _cpu(ps)) / wall for name, ps in trees.items()}
    step = Step(
        target,
        active,
        hold_start,
        datetime.now(UTC),
        cores["worker"],
        _rss(trees["worker"]),
        (_waited_s(worker.proc.pid) - waited0) / wall,
        cores["sim"],
        cores["ingest"],
        _beacon_in_flight(),
    )
    print(
        f"step {target}: {active} tasks, worker {step.worker_cpu:.2f} cores (waited "
        f"{step.worker_wait:.2f} s/s for a CPU), {step.worker_rss_mib:.0f} MiB; beacon: "
        f"{step.beacon_in_flight} in flight; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    return step


def _lag_p99_ms(step: Step) -> float:
    from django.db import connection

    with connection.cursor() as cursor:
        if not probe_stats.has_start_lag(cursor):
            return 0.0
        return _p(probe_stats.start_lags_ms(cursor, step.hold_start, step.hold_end), 0.99)


def _report(done: list[Step], idle_rss: float, ticker: Ticker) -> None:
    from django.db import connection

    print(
        f"\nticks: {len(ticker.durations_s)}, duration p50 {_p(ticker.durations_s, 0.5):.2f} s, "
        f"max {max(ticker.durations_s, default=0):.2f} s"
    )
    print(
        f"  {'target':>6} {'in flight':>9} {'lag p50':>8} {'lag p99':>8} {'late':>5} "
        f"{'probes':>6} {'worker CPU':>10} {'CPU wait':>8} {'RSS':>7} {'RSS-idle/1k':>11} "
        f"{'sim CPU':>7} {'ingest':>6}"
    )
    with connection.cursor() as cursor:
        lag_known = probe_stats.has_start_lag(cursor)
        for s in done:
            flight = [n for _, n in probe_stats.in_flight(cursor, s.hold_start, s.hold_end)]
            lags = probe_stats.start_lags_ms(cursor, s.hold_start, s.hold_end) if lag_known else []
            late, unsent, other = probe_stats.missed(cursor, s.hold_start, s.hold_end)
            mean = probe_stats.mean(flight)
            per_k = (s.worker_rss_mib - idle_rss) / (mean / 1000) if mean else float("nan")
            print(
                f"  {s.target:6} {mean:9.0f} {_p(lags, 0.5):6.0f}ms {_p(lags, 0.99):6.0f}ms "
                f"{late:5} {len(lags):6} {s.worker_cpu:6.2f} cores {s.worker_wait:6.2f}/s "
                f"{s.worker_rss_mib:5.0f}MiB "
                f"{per_k:7.0f} MiB {s.sim_cpu:7.2f} {s.ingest_cpu:6.2f}"
                + (f"  ({unsent + other} missed otherwise)" if unsent + other else "")
            )
    if not lag_known:
        print("  start lag: not recorded by this version (no start_lag_ms column)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--steps",
        default=",".join(str(n) for n in range(250, 3001, 250)),
        help="probes in flight to reach, one step after the other",
    )
    parser.add_argument("--hold", type=int, default=45, help="seconds measured per step")
    parser.add_argument("--interval", type=int, default=20, help="probe interval (s)")
    parser.add_argument("--tick", type=int, default=10, help="TICK_SECONDS")
    parser.add_argument("--knee-ms", type=float, default=1000.0, help="start lag p99 bound")
    parser.add_argument(
        "--region-concurrency",
        type=int,
        default=None,
        help="messages at once (default: monitor.limits.region_worker_args)",
    )
    parser.add_argument(
        "--worker-nice",
        type=int,
        default=None,
        help="RW_WORKER_NICE of the workers (default: the product's, 10)",
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=600,
        help="at most this long (s) for the last results to reach the database",
    )
    parser.add_argument(
        "--keep-db", action="store_true", help="leave the bench database filled afterwards"
    )
    sys.exit(run(parser.parse_args()))


if __name__ == "__main__":
    main()
