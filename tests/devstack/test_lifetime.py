"""A `make run` stack lives no longer than its `python -m devstack run`, and a start never
takes over, or calls up, what another one left.

The "stack" here is a supervisor program doing what `run` does (devstack.lifetime.take_over,
then devstack.supervision.serve) with small stand-in children, killed or hung up from outside.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devstack import lifetime, stack, supervision
from tests.support import ROOT

pytestmark = pytest.mark.fault

# A stand-in child: writes its pid, notes a SIGTERM (the orderly stop) and exits on it; with
# an argument "grandchild" it first starts a process of its own that outlives it.
CHILD = textwrap.dedent(
    """
    import os, pathlib, signal, subprocess, sys, time
    here = pathlib.Path(sys.argv[1])
    if sys.argv[2:] == ["grandchild"]:
        g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        (here / "grandchild.pid").write_text(str(g.pid))
    def stop(*_):
        (here / f"{os.getpid()}.stopped").write_text("SIGTERM")
        print("stopping on SIGTERM", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    (here / f"{os.getpid()}.pid").write_text("")
    while True:
        time.sleep(0.05)
    """
)

# What `run` does, with stand-ins: hold the var dir, start the children carrying the run's
# token, supervise them. With "tty", its standard streams are the terminal it controls.
SUPERVISOR = textwrap.dedent(
    """
    import fcntl, os, sys, termios
    from pathlib import Path
    from devstack import lifetime, stack, supervision
    here, child_code, grandchild = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    if sys.argv[4:] == ["tty"]:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    with lifetime.take_over(here / "var", {}, 0, supervision._say) as claim:
        claim.record_embedded(["REDIS_URL"])
        env = {lifetime.TOKEN_VAR: claim.token}
        children = [
            supervision.Child("one", [sys.executable, "-c", child_code, str(here)]),
            supervision.Child("two", [sys.executable, "-c", child_code, str(here), grandchild]),
        ]
        sys.exit(supervision.serve(children, env))
    """
)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(check: Callable[[], object], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def _child_pids(tmp: Path) -> list[int]:
    return sorted(int(p.stem) for p in tmp.glob("*.pid") if p.stem.isdigit())


@pytest.fixture
def spawned(tmp_path: Path) -> Iterator[list[int]]:
    """Pids this test started (or its supervisor's children wrote): whatever is still
    running of them at the end is killed, and nothing else."""
    pids: list[int] = []
    yield pids
    for path in [*tmp_path.glob("*.pid")]:
        if path.stem.isdigit():
            pids.append(int(path.stem))
        elif path.read_text():
            pids.append(int(path.read_text()))
    for pid in pids:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


def _start_supervisor(
    tmp: Path, *, grandchild: bool = False, terminal: int | None = None
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", SUPERVISOR, str(tmp), CHILD, "grandchild" if grandchild else "-"]
    if terminal is None:
        return subprocess.Popen(argv, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL)
    return subprocess.Popen(
        [*argv, "tty"],
        cwd=ROOT,
        start_new_session=True,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )


def test_the_children_die_with_a_supervisor_killed_outright(
    tmp_path: Path, spawned: list[int]
) -> None:
    supervisor = _start_supervisor(tmp_path)
    spawned.append(supervisor.pid)
    assert _wait_for(lambda: len(_child_pids(tmp_path)) == 2), "the children did not start"
    children = _child_pids(tmp_path)

    supervisor.kill()
    supervisor.wait(10)

    assert _wait_for(lambda: not any(_running(pid) for pid in children), 10), (
        f"children of the killed supervisor still running: {children}"
    )


def test_closing_its_terminal_stops_the_stack_in_order(tmp_path: Path, spawned: list[int]) -> None:
    """As closing the window of `make run`: SIGHUP, and every later write to the terminal fails."""
    master, terminal = os.openpty()
    try:
        supervisor = _start_supervisor(tmp_path, terminal=terminal)
    finally:
        os.close(terminal)
    spawned.append(supervisor.pid)
    output = b""
    deadline = time.monotonic() + 20
    while len(_child_pids(tmp_path)) < 2 and time.monotonic() < deadline:
        if select.select([master], [], [], 0.05)[0]:
            output += os.read(master, 4096)
    children = _child_pids(tmp_path)
    assert len(children) == 2, output.decode(errors="replace")

    os.close(master)

    assert supervisor.wait(60) == 0
    for pid in children:
        assert (tmp_path / f"{pid}.stopped").read_text() == "SIGTERM"
        assert not _running(pid)
    assert not (tmp_path / "var" / "devstack-run.json").exists()  # an orderly end


def test_a_start_stops_what_a_killed_run_left_and_refuses_while_one_runs(
    tmp_path: Path, spawned: list[int]
) -> None:
    supervisor = _start_supervisor(tmp_path, grandchild=True)
    spawned.append(supervisor.pid)
    grandchild_pid = tmp_path / "grandchild.pid"
    assert _wait_for(lambda: grandchild_pid.exists() and grandchild_pid.read_text())
    grandchild = int(grandchild_pid.read_text())
    said: list[str] = []

    with pytest.raises(lifetime.StackBusy) as busy:  # noqa: SIM117 (the body is never reached)
        with lifetime.take_over(tmp_path / "var", {}, 0, said.append):
            pass
    assert f"(pid {supervisor.pid}," in str(busy.value)
    assert f"kill {supervisor.pid}" in str(busy.value)

    supervisor.kill()
    supervisor.wait(10)
    # Its children die with it; a process of theirs does not, nor the embedded Redis it had
    # started (a server to reuse, not a child).
    time.sleep(0.5)
    assert _running(grandchild)

    with lifetime.take_over(tmp_path / "var", {}, 0, said.append) as claim:
        assert claim.adopted == ["REDIS_URL"]  # stopped at the end of this run instead
    assert len(said) == 1
    assert f"an earlier run (pid {supervisor.pid}) ended and left 1 of its processes" in said[0]
    assert str(grandchild) in said[0]
    assert _wait_for(lambda: not _running(grandchild), 10)


def _holder(*, healthz: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    """Another process listening on a loopback port (answering /healthz with 200 if asked):
    it and its port."""
    code = textwrap.dedent(
        f"""
        import http.server, socket, sys, time
        class Ok(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()
            def log_message(self, *args):
                pass
        server = http.server.HTTPServer(("127.0.0.1", 0), Ok)
        print(server.server_address[1], flush=True)
        server.serve_forever() if {healthz} else time.sleep(120)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_a_start_on_a_taken_port_says_who_holds_it_in_one_line(
    tmp_path: Path, spawned: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    holder, port = _holder()
    spawned.append(holder.pid)

    code = stack.run(port, var_dir=tmp_path / "var")

    said = capsys.readouterr().out.splitlines()
    assert code != 0
    assert len(said) == 1, said
    assert f"port {port} (the web) is taken by pid {holder.pid}" in said[0]
    assert re.search(rf"\(kill [\d ]*\b{holder.pid}\b", said[0])
    assert not any("is up" in line for line in said)
    assert not (tmp_path / "var" / "postgres").exists()  # nothing was started


def test_a_server_it_did_not_start_is_never_said_to_be_up(
    tmp_path: Path, spawned: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    """The port was free at the check, then another server took it: /healthz answers, but
    not from the web server started here (still trying to bind, as gunicorn does)."""
    impostor, port = _holder(healthz=True)
    spawned.append(impostor.pid)
    web = supervision.Child("web", [sys.executable, "-c", "import time; time.sleep(120)"])
    supervision._start_child(web, {})
    assert web.proc is not None
    spawned.append(web.proc.pid)
    try:
        up = supervision._announce_web(web, port, threading.Event(), timeout_s=3)
    finally:
        supervision._stop_children([web], wait_s=5)

    said = capsys.readouterr().out
    assert not up
    assert "is up" not in said
    assert f"port {port} is answered by pid {impostor.pid}, not by the web server" in said


def test_our_web_server_is_said_to_be_up(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = f"""
import http.server
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", {port}), Ok).serve_forever()
"""
    web = supervision.Child("web", [sys.executable, "-c", code])
    supervision._start_child(web, {})
    try:
        up = supervision._announce_web(web, port, threading.Event(), timeout_s=30)
    finally:
        supervision._stop_children([web], wait_s=5)
    assert up
    assert f"Routewatch is up: http://localhost:{port}/" in capsys.readouterr().out
