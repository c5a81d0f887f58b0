"""Celery for real: one beat process and a worker; the periodic tick really runs."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
from pathlib import Path

import pytest
from django.db import connection

from monitor.models import Heartbeat
from tests import support


@pytest.mark.django_db(transaction=True)
def test_beat_ticks_and_a_worker_runs_the_tick(tmp_path: Path) -> None:
    env = support.child_env(connection.settings_dict, TICK_SECONDS="1")
    worker = support.start(
        support.celery(
            "worker", "--queues", "schedule,ingest,default", "--pool", "solo", "--loglevel", "INFO"
        ),
        env,
        tmp_path / "worker.log",
    )
    beat = support.start(
        support.celery("beat", "--schedule", str(tmp_path / "beat-schedule"), "--loglevel", "INFO"),
        env,
        tmp_path / "beat.log",
    )
    try:

        def ticked_twice() -> bool:
            row = Heartbeat.objects.filter(name="tick").first()
            return row is not None and row.count >= 2

        assert support.wait_until(ticked_twice, timeout_s=60), (
            tmp_path / "worker.log"
        ).read_text()[-3000:] + (tmp_path / "beat.log").read_text()[-2000:]
    finally:
        support.stop(beat)
        support.stop(worker)


def _nice(pid: int) -> int:
    # /proc/<pid>/stat: nice is the 19th field, the 17th after the command name's ")".
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])


def _group_nice(pid: int) -> int | None:
    """The nice of the process's autogroup (its session's share against other sessions), or
    None where there is none to read: a kernel without autogroups has no such file, and some
    (sandboxed kernels, CI's among them) show it empty."""
    try:
        text = Path(f"/proc/{pid}/autogroup").read_text()
    except OSError:
        return None
    found = re.search(r"\bnice\s+(-?\d+)", text)
    return int(found.group(1)) if found else None


def _pool_children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(c) for c in text.split()]


def _ready(*logs: Path) -> None:
    for log in logs:

        def ready(log: Path = log) -> bool:
            return "ready" in log.read_text()

        assert support.wait_until(ready, 60), log.read_text()[-3000:]


@pytest.mark.django_db(transaction=True)
def test_workers_run_at_the_configured_cpu_priority_and_their_pools_inherit_it(
    tmp_path: Path,
) -> None:
    """RW_WORKER_NICE lowers a worker's CPU priority at start, its prefork pool processes (which
    run the probes and ingest) have it too, and so does its session's autogroup when it leads
    its session (as under `make run`, a supervisor or systemd); 0 leaves it at the web's."""
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert ours < 7, "the test process must start below the nice value it checks"
    env = support.child_env(connection.settings_dict)
    argv = support.celery(
        "worker", "--queues", "default", "--concurrency", "1", "--loglevel", "INFO"
    )
    niced = support.start(argv, {**env, "RW_WORKER_NICE": "7"}, tmp_path / "niced.log")
    plain = support.start(argv, {**env, "RW_WORKER_NICE": "0"}, tmp_path / "plain.log")
    try:
        _ready(tmp_path / "niced.log", tmp_path / "plain.log")
        assert _nice(niced.pid) == 7
        pool = _pool_children(niced.pid)
        assert pool, "a prefork worker has a pool process"
        assert {_nice(pid) for pid in pool} == {7}
        assert _nice(plain.pid) == ours
        assert {_nice(pid) for pid in _pool_children(plain.pid)} == {ours}
        assert os.getsid(niced.pid) == niced.pid
        if _group_nice(plain.pid) is not None:
            assert _group_nice(niced.pid) == 7
            assert _group_nice(plain.pid) == 0
    finally:
        support.stop(niced)
        support.stop(plain)


@pytest.mark.django_db(transaction=True)
def test_a_worker_sharing_a_session_leaves_the_sessions_share_alone(tmp_path: Path) -> None:
    """A worker started in another program's session (a shell script running the web and a
    worker) lowers its own priority only: the session's autogroup is the web's too. The session
    here is a wrapper's of its own, so a failure never touches the test run's own priority."""
    env = support.child_env(connection.settings_dict, RW_WORKER_NICE="9")
    argv = support.celery(
        "worker", "--queues", "default", "--concurrency", "1", "--loglevel", "INFO"
    )
    # The wrapper leads a new session and runs the worker as its child, in that session.
    wrapper = support.start(
        [sys.executable, "-c", "import subprocess, sys; subprocess.call(sys.argv[1:])", *argv],
        env,
        tmp_path / "worker.log",
    )
    before = _group_nice(wrapper.pid)
    try:
        _ready(tmp_path / "worker.log")
        (worker,) = _pool_children(wrapper.pid)
        assert os.getsid(worker) == wrapper.pid != worker
        assert _nice(worker) == 9
        assert _nice(wrapper.pid) == os.getpriority(os.PRIO_PROCESS, 0)
        assert _group_nice(worker) == _group_nice(wrapper.pid) == before
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(wrapper.pid, signal.SIGTERM)
        support.stop(wrapper)


def _other_backends() -> set[tuple[int, object]]:
    """Every other session of the test database: (backend pid, when it started)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, backend_start FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'"
        )
        return {(pid, started) for pid, started in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_a_worker_keeps_its_database_session_from_one_task_to_the_next(tmp_path: Path) -> None:
    """A worker's tasks share one PostgreSQL session while it is young and usable
    (CONN_MAX_AGE), as web requests do: Celery's default, a new session for every task, cost
    7 sessions a second at bench-load's 1x (each a backend process started, its caches cold,
    ingest's temporary table made again)."""
    from monitor import tasks

    before = _other_backends()
    env = support.child_env(connection.settings_dict)
    log = tmp_path / "worker.log"
    argv = support.celery(
        "worker", "--queues", "schedule", "--concurrency", "1", "--loglevel", "INFO"
    )
    worker = support.start(argv, env, log)
    try:
        _ready(log)
        sessions = []
        for n in (1, 2, 3):
            tasks.tick.apply_async(queue="schedule")

            def ran(n: int = n) -> bool:
                return log.read_text().count("] succeeded in ") >= n

            assert support.wait_until(ran, 60), log.read_text()[-3000:]
            sessions.append(_other_backends() - before)
        assert sessions[0], "the worker's session closed after its task"
        assert sessions[0] == sessions[1] == sessions[2], sessions
    finally:
        support.stop(worker)
