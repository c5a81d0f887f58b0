"""`make run` keeps its processes running the way compose's `restart: unless-stopped` does.

Real child processes: one that exits is started again, a crash loop stops everything.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from devstack import supervision
from devstack.stack import _regions_live


def _counting_child(tmp: Path, name: str, *, exit_after_s: float) -> supervision.Child:
    """A child that appends a line to its file each time it starts, then exits with status 3
    after `exit_after_s` (or runs until stopped when that is long)."""
    marker = tmp / f"{name}.starts"
    code = (
        "import pathlib, sys, time\n"
        f"p = pathlib.Path({str(marker)!r})\n"
        "p.open('a').write('start\\n')\n"
        f"time.sleep({exit_after_s})\n"
        "sys.exit(3)\n"
    )
    return supervision.Child(name, [sys.executable, "-c", code])


def _starts(tmp: Path, name: str) -> int:
    path = tmp / f"{name}.starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_child_that_exits_is_started_again_and_the_others_keep_running(tmp_path: Path) -> None:
    flaky = _counting_child(tmp_path, "flaky", exit_after_s=0.2)
    steady = _counting_child(tmp_path, "steady", exit_after_s=60)
    children = [flaky, steady]
    for child in children:
        supervision._start_child(child, {})
    stopping = threading.Event()
    result: list[int] = []
    runner = threading.Thread(
        target=lambda: result.append(supervision.supervise(children, {}, stopping))
    )
    runner.start()
    try:
        # Two restarts of the flaky child: below the crash-loop limit of five exits.
        for _ in range(100):
            if _starts(tmp_path, "flaky") >= 3:
                break
            time.sleep(0.1)
        stopping.set()
        runner.join(10)
    finally:
        supervision._stop_children(children)
    assert _starts(tmp_path, "flaky") >= 3
    assert _starts(tmp_path, "steady") == 1  # never restarted: it never exited
    assert result == [0]  # stopped on request, not by a crash loop


def test_a_crash_loop_stops_everything(tmp_path: Path) -> None:
    crashing = _counting_child(tmp_path, "crashing", exit_after_s=0)
    steady = _counting_child(tmp_path, "steady", exit_after_s=60)
    children = [crashing, steady]
    for child in children:
        supervision._start_child(child, {})
    stopping = threading.Event()
    try:
        code = supervision.supervise(children, {}, stopping)
    finally:
        supervision._stop_children(children)
    assert code == 1
    assert stopping.is_set()
    assert _starts(tmp_path, "crashing") == supervision.CRASH_LOOP_EXITS
    assert steady.proc is not None
    assert steady.proc.returncode is not None  # stopped with the rest


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_stopping_lets_workers_finish_first_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """As a Celery worker's warm shutdown: SIGTERM reaches the child itself, not the pool
    processes of its group (which would die mid-task), and the children stopped first finish
    while the others (the simulator, the delay proxies) still run; whatever a child leaves in
    its group is killed."""
    report = tmp_path / "report"
    pool_pid = tmp_path / "pool.pid"
    # A "pool process": notes a SIGTERM it gets, else sleeps until killed.
    pool = (
        "import pathlib, signal, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: pathlib.Path({str(report)!r}).open('a')"
        ".write('pool got SIGTERM\\n'))\n"
        "time.sleep(120)\n"
    )
    proxy = supervision.Child("proxy", [sys.executable, "-c", "import time; time.sleep(120)"])
    supervision._start_child(proxy, {})
    assert proxy.proc is not None
    # A "worker": starts a pool process in its group; on SIGTERM takes 1 s to finish its task,
    # notes whether the proxy still runs then, and exits without stopping its pool process.
    worker_code = (
        "import os, pathlib, signal, subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {pool!r}])\n"
        f"pathlib.Path({str(pool_pid)!r}).write_text(str(p.pid))\n"
        "stop = []\n"
        "signal.signal(signal.SIGTERM, lambda *a: stop.append(1))\n"
        "while not stop:\n"
        "    time.sleep(0.05)\n"
        "time.sleep(1)\n"
        f"alive = os.path.exists('/proc/{proxy.proc.pid}')\n"
        f"pathlib.Path({str(report)!r}).open('a').write(f'proxy alive: {{alive}}\\n')\n"
    )
    worker = supervision.Child("worker", [sys.executable, "-c", worker_code], stop_first=True)
    supervision._start_child(worker, {})
    for _ in range(100):
        if pool_pid.exists() and pool_pid.read_text():
            break
        time.sleep(0.05)
    pid = int(pool_pid.read_text())
    time.sleep(0.3)  # the pool process has set its handler
    supervision._stop_children([proxy, worker])
    assert report.read_text().splitlines() == ["proxy alive: True"]
    assert worker.proc is not None
    assert worker.proc.returncode == 0
    assert proxy.proc.returncode is not None
    for _ in range(50):
        if not _alive(pid):
            break
        time.sleep(0.1)
    assert not _alive(pid), "the child's pool process was left running"


def test_a_child_that_ignores_the_stop_is_named_and_killed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stubborn = supervision.Child(
        "stubborn",
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)",
        ],
        stop_first=True,
    )
    polite = supervision.Child("polite", [sys.executable, "-c", "import time; time.sleep(120)"])
    for child in (stubborn, polite):
        supervision._start_child(child, {})
    time.sleep(0.5)  # the handler is set
    supervision._stop_children([stubborn, polite], wait_s=1)
    out = capsys.readouterr()
    said = out.out + out.err
    assert "stubborn did not stop within 1 s" in said
    assert "killing it" in said
    assert "polite did not stop" not in said
    assert stubborn.proc is not None
    assert stubborn.proc.returncode == -9
    assert polite.proc is not None
    assert polite.proc.returncode == -15


def _nice_of_autogroup(pid: int) -> int | None:
    path = Path(f"/proc/{pid}/autogroup")
    return int(path.read_text().split()[-1]) if path.exists() else None


@pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice needs root or CAP_SYS_NICE")
def test_a_child_with_a_priority_runs_above_the_others_with_its_whole_session(
    tmp_path: Path,
) -> None:
    """The web's priority (devstack.stack.WEB_NICE): the child, what it forks (gunicorn's
    workers), and its session's autogroup, which is what counts against other sessions."""
    code = (
        "import os, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        f"open({str(tmp_path / 'forked.tmp')!r}, 'w').write(str(pid))\n"
        f"os.replace({str(tmp_path / 'forked.tmp')!r}, {str(tmp_path / 'forked')!r})\n"
        "time.sleep(60)\n"
    )
    web = supervision.Child("web", [sys.executable, "-c", code], priority=-5)
    plain = supervision.Child("plain", [sys.executable, "-c", "import time; time.sleep(60)"])
    for child in (web, plain):
        supervision._start_child(child, {})
    try:
        assert web.proc is not None
        assert plain.proc is not None
        deadline = time.monotonic() + 10
        while not (tmp_path / "forked").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        forked = int((tmp_path / "forked").read_text())
        assert os.getpriority(os.PRIO_PROCESS, web.proc.pid) == -5
        assert os.getpriority(os.PRIO_PROCESS, forked) == -5
        assert os.getpriority(os.PRIO_PROCESS, plain.proc.pid) == 0
        if _nice_of_autogroup(web.proc.pid) is not None:
            assert _nice_of_autogroup(web.proc.pid) == -5
            assert _nice_of_autogroup(forked) == -5  # the same session, the same group
            assert _nice_of_autogroup(plain.proc.pid) == 0
    finally:
        supervision._stop_children([web, plain])


def test_a_child_that_waits_starts_once_ready_and_not_before(tmp_path: Path) -> None:
    """beat waits for every region worker's beacon (devstack.stack._regions_live): a child with
    `ready_to_start` starts only once it says so, after the others. (Called from this thread:
    a child dies with the thread that started it.)"""
    steady = _counting_child(tmp_path, "steady", exit_after_s=60)
    waiting = _counting_child(tmp_path, "waiting", exit_after_s=60)
    started_when_asked: list[bool] = []

    def is_ready() -> bool:  # ready from the fourth time it is asked
        started_when_asked.append(waiting.proc is not None)
        return len(started_when_asked) >= 4

    waiting.ready_to_start = is_ready
    children = [steady, waiting]
    supervision._start_child(steady, {})
    try:
        supervision.start_when_ready(children, {}, threading.Event(), timeout_s=60.0)
        assert started_when_asked == [False] * 4  # not started while it said no
        for _ in range(100):
            if _starts(tmp_path, "waiting"):
                break
            time.sleep(0.1)
        assert _starts(tmp_path, "waiting") == 1
        assert _starts(tmp_path, "steady") == 1
    finally:
        supervision._stop_children(children)


def test_a_child_never_ready_starts_after_the_bound_and_not_when_stopping(tmp_path: Path) -> None:
    late = _counting_child(tmp_path, "late", exit_after_s=60)
    late.ready_to_start = lambda: False
    stopping = threading.Event()
    try:
        supervision.start_when_ready([late], {}, stopping, timeout_s=0.6)
        assert late.proc is not None  # started anyway, once the bound passed
        supervision._stop_children([late])
        never = _counting_child(tmp_path, "never", exit_after_s=60)
        never.ready_to_start = lambda: False
        stopping.set()
        supervision.start_when_ready([never], {}, stopping, timeout_s=0.6)
        assert never.proc is None  # a stop asked meanwhile: nothing more is started
    finally:
        supervision._stop_children([late])


def test_beat_waits_for_a_live_worker_in_every_region() -> None:
    """`make run` starts beat once each region has a worker's beacon in the broker."""
    env = {"REDIS_URL": os.environ["REDIS_URL"]}
    client = redis.Redis.from_url(env["REDIS_URL"])
    regions = ["zz-supervise-a", "zz-supervise-b"]
    try:
        assert not _regions_live(env, regions)
        client.set("rw:worker:zz-supervise-a:host:1", "{}", ex=30)
        assert not _regions_live(env, regions)  # one region still has none
        client.set("rw:worker:zz-supervise-b:host:2", "{}", ex=30)
        assert _regions_live(env, regions)
        assert not _regions_live({"REDIS_URL": "redis://127.0.0.1:9/0"}, regions)  # no broker
    finally:
        client.delete("rw:worker:zz-supervise-a:host:1", "rw:worker:zz-supervise-b:host:2")
