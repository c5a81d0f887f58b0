"""The dev stack's processes: each a Child, its output prefixed with its name, started,
supervised (one that exits is started again; all stop after a crash loop) and stopped in
order (devstack.stack builds the children; this module runs them)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from devstack import embedded, lifetime

ROOT = embedded.ROOT


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of the stack's environment
    proc: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = field(default=None, repr=False)
    exits: list[float] = field(default_factory=list)  # monotonic times of recent exits
    # Stopped, and waited for, before the others: Celery processes, so a region worker's warm
    # shutdown finishes its batch while the simulator and its delay proxy still answer.
    stop_first: bool = False
    # A CPU priority above the others' (a negative nice, for its whole session): the web's
    # (devstack.stack.WEB_NICE). Needs root or CAP_SYS_NICE; without, the child runs at 0.
    priority: int | None = None
    # Started after the others, once this says so (polled; at most START_WAIT_S, then anyway):
    # beat, once every region worker is live, so no slot is planned for a region nobody serves.
    ready_to_start: Callable[[], bool] | None = None


# Set once our output is gone (its terminal closed: writes fail with EIO): the stack goes on,
# or stops in order, without it.
_OUTPUT_GONE = threading.Event()


def _emit(line: str) -> None:
    if _OUTPUT_GONE.is_set():
        return
    try:
        print(line, flush=True)
    except OSError:
        _OUTPUT_GONE.set()
        # What could not be written would fail again at exit (and make the status 120).
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of the process)


def _say(message: str) -> None:
    _emit(f"\033[1m[routewatch]\033[0m {message}")


def _pump(name: str, stream: object) -> None:
    # Read to the end even with nowhere to write: a child blocked on a full pipe never stops.
    width = 12
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        line = raw.decode(errors="replace").rstrip()
        _emit(f"{name:<{width}}| {line}")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback)
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _announce_web(
    web: Child, port: int, stopping: threading.Event, timeout_s: float = 60.0
) -> bool:
    """Say that Routewatch is up once /healthz answers from the web server started here: the
    socket listening on `port` is held by its session (another server that took the port
    meanwhile may answer too). Returns whether it did."""
    proc = web.proc
    assert proc is not None
    url = f"http://localhost:{port}/"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping.is_set():
        if proc.poll() is not None:
            _say(f"the web server exited (status {proc.returncode}); see its output above")
            return False
        if _answers(f"http://127.0.0.1:{port}/healthz") and lifetime.holds_port(proc.pid, port):
            _say(f"Routewatch is up: {url}  (admin: {url}admin/)  Ctrl-C stops everything.")
            return True
        stopping.wait(0.3)
    if stopping.is_set():
        return False
    others = lifetime.strangers(proc.pid, port)
    if others:
        _say(
            f"port {port} is answered by pid {others[0]}, not by the web server started here; "
            "stop that process and start again"
        )
    else:
        _say(f"the web server did not answer within {timeout_s:.0f} s; see its output above")
    return False


# The longest a child with `ready_to_start` waits for it (a worker's start takes 10-60 s on a
# busy 2-core machine).
START_WAIT_S = 180.0


def start_when_ready(
    children: Sequence[Child],
    env: dict[str, str],
    stopping: threading.Event,
    timeout_s: float = START_WAIT_S,
) -> None:
    """Start each child that has `ready_to_start` once it says so, in order; one still not
    ready after `timeout_s` is started anyway (and said so). None once `stopping` is set."""
    for child in children:
        if child.ready_to_start is None or stopping.is_set():
            continue
        if not _wait_until(child.ready_to_start, stopping, timeout_s):
            if stopping.is_set():
                return
            _say(f"starting {child.name} without waiting longer ({timeout_s:.0f} s)")
        _start_child(child, env)


def _wait_until(ready: Callable[[], bool], stopping: threading.Event, timeout_s: float) -> bool:
    """Poll `ready` every half second until it says yes (True), `stopping` is set or
    `timeout_s` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not stopping.is_set() and time.monotonic() < deadline:
        if ready():
            return True
        stopping.wait(0.5)
    return False


# A child that exits is started again, unless it exited this often within the window.
CRASH_LOOP_EXITS = 5


CRASH_LOOP_WINDOW_S = 120.0


def _start_child(child: Child, env: dict[str, str]) -> None:
    """Start `child`; it is killed when the calling thread ends (devstack.lifetime), so call
    this from the thread that supervises it to the end."""
    child.proc = subprocess.Popen(
        child.argv,
        env={**env, **child.env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # Ctrl-C reaches us only; we stop the children ourselves
        # Runs between fork and exec while the pumps' threads run: safe, as it only makes
        # system calls through a function looked up beforehand.
        preexec_fn=lifetime.die_with_parent(),
    )
    child.pump = threading.Thread(target=_pump, args=(child.name, child.proc.stdout), daemon=True)
    child.pump.start()
    if child.priority is not None and not raise_priority(child.proc.pid, child.priority):
        _say(
            f"{child.name} runs at the workers' CPU priority: raising it to nice "
            f"{child.priority} needs root or CAP_SYS_NICE (docs/scaling.md)"
        )


def raise_priority(pid: int, nice: int, *, session: bool = True) -> bool:
    """Run process `pid` (with `session`: its whole process group and session, `pid` leading
    them, as every child here does) at nice `nice`, below 0 to take the CPU before the
    workers. Where Linux shares the CPUs between sessions first (autogroups: most kernels'
    default), the session's autogroup nice is what counts against other sessions, so it is set
    too. False where not permitted (a negative nice needs root or CAP_SYS_NICE)."""
    try:
        if session:
            os.setpriority(os.PRIO_PGRP, pid, nice)
        else:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError:
        return False
    autogroup = f"/proc/{pid}/autogroup"
    if os.path.exists(autogroup):
        try:
            with open(autogroup, "w") as f:
                f.write(str(nice))
        except OSError:
            return False
    return True


def supervise(children: Sequence[Child], env: dict[str, str], stopping: threading.Event) -> int:
    """Keep the started children running until `stopping` is set: as compose's `restart:
    unless-stopped`, one that exits is started again (a Celery worker exits on some broker
    failures, its Redis connection breaking mid-acknowledgement). A child that exits
    CRASH_LOOP_EXITS times within CRASH_LOOP_WINDOW_S sets `stopping`; returns 1 then, else 0."""
    while not stopping.is_set():
        for child in children:
            if child.proc is None or child.proc.poll() is None:
                continue
            now = time.monotonic()
            child.exits = [t for t in child.exits if now - t < CRASH_LOOP_WINDOW_S] + [now]
            status = child.proc.returncode
            if len(child.exits) >= CRASH_LOOP_EXITS:
                _say(
                    f"{child.name} exited with status {status}, {len(child.exits)} times in "
                    f"{CRASH_LOOP_WINDOW_S:.0f} s; stopping"
                )
                stopping.set()
                return 1
            _say(f"{child.name} exited with status {status}; starting it again")
            _start_child(child, env)
        stopping.wait(0.5)
    return 0


# How long a wave of children may take to stop: a region worker's batch spreads its probes
# over a tick (TICK_SECONDS, 10) and the slowest may take a few seconds more.
STOP_WAIT_S = 25.0


def _stop_children(children: Sequence[Child], wait_s: float = STOP_WAIT_S) -> None:
    """Celery processes first, then the rest. SIGTERM goes to each child itself, never to its
    process group: a Celery worker's warm shutdown lets its pool finish the task at hand (a
    pool process sent SIGTERM directly dies with it: WorkerLostError, a region's batch lost),
    gunicorn stops its own workers. What is still running after `wait_s` (named, so a slow
    stop says who held it), and anything left in a child's group, gets SIGKILL."""
    for wave in ([c for c in children if c.stop_first], [c for c in children if not c.stop_first]):
        for child in wave:
            if child.proc and child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_s
        for child in wave:
            if not child.proc:
                continue
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _say(
                    f"{child.name} did not stop within {wait_s:.0f} s (a probe with a longer "
                    "deadline, most likely); killing it: what it had not finished is recorded "
                    "missed"
                )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.proc.pid, signal.SIGKILL)
            child.proc.wait()


# Each stops `run` as Ctrl-C does: SIGHUP comes when its terminal closes.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def serve(
    children: Sequence[Child], env: dict[str, str], web: tuple[Child, int] | None = None
) -> int:
    """Start the children, say when `web` (the child, its port) is up, supervise them until
    a stop signal (STOP_SIGNALS) or a crash loop, then stop them all; returns supervise's
    status. From the main thread: signal handlers are set there, and the children die with
    the thread that started them."""
    stopping = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:
        stopping.set()

    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_signal)
    try:
        for child in children:
            if child.ready_to_start is None:
                _start_child(child, env)
        if web is not None:
            _announce_web(*web, stopping)
        start_when_ready(children, env, stopping)
        return supervise(children, env, stopping)
    finally:
        _say("stopping")
        _stop_children(children)
