"""The processes bench-load and bench-region start and watch: each started in a session of its
own and stopped with it, their process trees' CPU and RSS, and the servers' (PostgreSQL,
Redis) process ids.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def _postmaster(url: str) -> int | None:
    """The process id of the PostgreSQL server at `url` when it runs on this machine: the
    parent of the backend serving a connection to it."""
    import psutil
    import psycopg

    if not url:
        return None
    with contextlib.suppress(psycopg.Error, psutil.Error), psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        if row is not None:
            parent = psutil.Process(int(row[0])).parent()
            return parent.pid if parent is not None else None
    return None


def _servers(env: dict[str, str]) -> dict[str, list[int]]:
    """PostgreSQL and Redis process ids (the embedded ones, or any on this machine)."""
    import psutil

    found: dict[str, list[int]] = {"postgres": [], "redis": []}
    var = Path(env.get("RW_VAR_DIR", ROOT / "var")).resolve()
    pidfile = var / "postgres" / "postmaster.pid"
    if pidfile.exists():
        found["postgres"].append(int(pidfile.read_text().split()[0]))
    elif postmaster := _postmaster(env.get("DATABASE_URL", "")):
        found["postgres"].append(postmaster)  # a server given with DATABASE_URL, on this machine
    for p in psutil.process_iter(["name", "cwd", "cmdline"]):
        with contextlib.suppress(Exception):
            if "redis-server" in (p.info["name"] or "") and str(var) in " ".join(
                [p.info["cwd"] or "", *(p.info["cmdline"] or [])]
            ):
                found["redis"].append(p.pid)
    return found
