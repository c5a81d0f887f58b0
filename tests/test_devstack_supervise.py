"""`make run` keeps its processes running the way compose's `restart: unless-stopped` does.

Real child processes: one that exits is started again, a crash loop stops everything.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from devstack import stack


def _counting_child(tmp: Path, name: str, *, exit_after_s: float) -> stack.Child:
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
    return stack.Child(name, [sys.executable, "-c", code])


def _starts(tmp: Path, name: str) -> int:
    path = tmp / f"{name}.starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_child_that_exits_is_started_again_and_the_others_keep_running(tmp_path: Path) -> None:
    flaky = _counting_child(tmp_path, "flaky", exit_after_s=0.2)
    steady = _counting_child(tmp_path, "steady", exit_after_s=60)
    children = [flaky, steady]
    for child in children:
        stack._start_child(child, {})
    stopping = threading.Event()
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(stack.supervise(children, {}, stopping)))
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
        stack._stop_children(children)
    assert _starts(tmp_path, "flaky") >= 3
    assert _starts(tmp_path, "steady") == 1  # never restarted: it never exited
    assert result == [0]  # stopped on request, not by a crash loop


def test_a_crash_loop_stops_everything(tmp_path: Path) -> None:
    crashing = _counting_child(tmp_path, "crashing", exit_after_s=0)
    steady = _counting_child(tmp_path, "steady", exit_after_s=60)
    children = [crashing, steady]
    for child in children:
        stack._start_child(child, {})
    stopping = threading.Event()
    try:
        code = stack.supervise(children, {}, stopping)
    finally:
        stack._stop_children(children)
    assert code == 1
    assert stopping.is_set()
    assert _starts(tmp_path, "crashing") == stack.CRASH_LOOP_EXITS
    assert steady.proc is not None
    assert steady.proc.returncode is not None  # stopped with the rest
