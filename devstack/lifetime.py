"""A `make run` stack lives no longer than the `python -m devstack run` that started it (Linux).

- Its children end with it, however it ends (SIGKILL included): each gets a parent-death
  signal, PR_SET_PDEATHSIG set to SIGKILL between fork and exec (`die_with_parent`), not a
  watchdog, so nothing has to outlive the parent to clean up after it. SIGKILL, not SIGTERM:
  a warm shutdown of a region worker needs the simulator and its delay proxy, which get the
  signal at the same moment; killed, its unfinished probes are recorded missed, which counts
  against no route. The kernel sends the signal when the *thread* that started the child
  ends, so children are started by the thread that supervises them to the end (the main
  thread of `run`). Grandchildren do not inherit it: gunicorn's workers and the prefork pool
  of a Celery worker end by themselves when their parent goes (gunicorn watches its parent,
  Celery sets the same signal).
- A run holds a lock on `<var>/devstack-run.lock` while it lives and records its pid, web port
  and a token in `<var>/devstack-run.json`; every process it starts carries the token in its
  environment (TOKEN_VAR), and so do theirs. A start that finds the lock held says how to stop
  that run; one that finds the record of a run that ended without removing it stops whatever
  still carries that run's token (`take_over`).
- The embedded PostgreSQL and Redis are not children: they keep their data and serve other
  commands (`manage.py` from another shell), so they outlive a run that dies. The next start
  reuses them and stops at its end those the dead run had started (`Claim.adopted`), as that
  run would have.
- A port the stack needs that another process holds is named with that process, and the start
  stops (`busy_ports`); the web server is said to be up only when the listening socket is its
  own (`holds_port`).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

TOKEN_VAR = "RW_DEVSTACK_RUN"  # noqa: S105 (a variable name; its value is no secret)
# Leftovers get SIGKILL (as from the parent-death signal); they are gone well within this.
LEFTOVER_WAIT_S = 10.0

_PR_SET_PDEATHSIG = 1
# Looked up here, in the parent: a child between fork and exec must not load libraries.
_prctl = None
if sys.platform.startswith("linux"):
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _prctl.restype = ctypes.c_int


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn giving the child SIGKILL when the calling thread ends (None off Linux).
    Should the parent die between fork and the prctl, the signal would never come: the child
    then sees another parent and kills itself."""
    if _prctl is None:
        return None
    prctl = _prctl
    parent = os.getpid()

    def _preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return _preexec


class RunRecord(TypedDict):
    pid: int
    port: int
    token: str
    embedded_started: list[str]  # embedded servers the run started, and so stops at its end


class StackBusy(Exception):
    """The stack cannot start: another run, or a port it needs is taken. One line."""


@dataclass
class Claim:
    """This run's hold on its var dir, from `take_over` until `release`."""

    var_dir: Path
    record: RunRecord
    adopted: list[str] = field(default_factory=list)  # embedded servers a dead run left
    _lock: int = -1

    @property
    def token(self) -> str:
        return self.record["token"]

    def record_embedded(self, started: list[str]) -> None:
        self.record["embedded_started"] = list(started)
        _write_record(self.var_dir, self.record)

    def release(self) -> None:
        """The run ended in order: no record left to act on, the lock free."""
        _record_path(self.var_dir).unlink(missing_ok=True)
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1


def _record_path(var_dir: Path) -> Path:
    return var_dir / "devstack-run.json"


def _read_record(var_dir: Path) -> RunRecord | None:
    try:
        data = json.loads(_record_path(var_dir).read_text())
        return RunRecord(
            pid=int(data["pid"]),
            port=int(data["port"]),
            token=str(data["token"]),
            embedded_started=[str(n) for n in data.get("embedded_started", [])],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_record(var_dir: Path, record: RunRecord) -> None:
    path = _record_path(var_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


@contextlib.contextmanager
def take_over(
    var_dir: Path, ports: dict[int, str], port: int, say: Callable[[str], None]
) -> Iterator[Claim]:
    """Hold `var_dir` for one run serving the web on `port`; `ports` (port -> what needs it)
    must be free. Raises StackBusy when another run holds the var dir or a port is taken;
    stops, saying so in one line, what a run that ended without stopping left behind."""
    var_dir.mkdir(parents=True, exist_ok=True)
    lock = os.open(var_dir / "devstack-run.lock", os.O_RDWR | os.O_CREAT, 0o600)
    claim = None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StackBusy(_running_elsewhere(_read_record(var_dir))) from None
        earlier = _read_record(var_dir)
        adopted: list[str] = []
        if earlier is not None:
            _stop_leftovers(earlier, say)
            adopted = earlier["embedded_started"]
        busy = busy_ports(ports, web_port=port)
        if busy:
            raise StackBusy(busy)
        record = RunRecord(
            pid=os.getpid(), port=port, token=secrets.token_hex(8), embedded_started=adopted
        )
        _write_record(var_dir, record)
        claim = Claim(var_dir, record, adopted, lock)
        yield claim
    finally:
        if claim is not None:
            claim.release()
        else:
            os.close(lock)


def _running_elsewhere(record: RunRecord | None) -> str:
    if record is None:
        return "another `python -m devstack run` is starting with this var dir; wait for it"
    pid = record["pid"]
    return (
        f"a stack is already running from this checkout (pid {pid}, "
        f"http://localhost:{record['port']}/): stop it first (Ctrl-C in its terminal, or "
        f"kill {pid})"
    )


def _stop_leftovers(earlier: RunRecord, say: Callable[[str], None]) -> None:
    left = carrying(earlier["token"])
    if not left:
        return
    say(
        f"an earlier run (pid {earlier['pid']}) ended and left {len(left)} of its processes "
        f"running ({', '.join(f'{pid} {_command(pid)}' for pid in left)}); stopping them"
    )
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    while time.monotonic() < deadline and any(_alive(pid) for pid in left):
        time.sleep(0.05)


def carrying(token: str) -> list[int]:
    """Live processes (ours to read) whose environment carries the run token `token`."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # another user's, or gone meanwhile
            continue
        if needle in environ.split(b"\0") and _alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def _alive(pid: int) -> bool:
    """Running: not gone, and not a zombie waiting for a parent to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _command(pid: int, width: int = 60) -> str:
    """`python -m gunicorn monitor.wsgi ...`: a process's command line, short, in backquotes."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "`?`"
    words = [os.path.basename(argv[0].decode(errors="replace"))]
    words += [a.decode(errors="replace") for a in argv[1:]]
    line = " ".join(" ".join(words).split())  # one line, whatever `python -c` was given
    return f"`{line if len(line) <= width else line[: width - 3] + '...'}`"


# --- ports ----------------------------------------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the servers themselves: old connections in TIME_WAIT do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listeners(port: int) -> list[int]:
    """Pids (ours to read) holding a socket that listens on TCP `port`, any address."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local_address "0100007F:1F40", st "0A" is LISTEN, inode the tenth field.
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                inodes.add(f"socket:[{fields[9]}]")
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
        except OSError:
            continue
    return sorted(pids)


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def holds_port(session: int, port: int) -> bool:
    """Whether a process of session `session` (a child started in a session of its own: its
    pid) listens on `port`."""
    return any(_session(pid) == session for pid in listeners(port))


def strangers(session: int, port: int) -> list[int]:
    """The processes listening on `port` that are not of session `session`."""
    return [pid for pid in listeners(port) if _session(pid) != session]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _owner(port: int) -> int | None:
    """Who to stop to free `port`: the first listener whose parent does not listen too (a
    gunicorn's master, not its workers), or the `python -m devstack run` that started it."""
    holders = listeners(port)
    top = [pid for pid in holders if _parent(pid) not in holders]
    if not top:
        return None
    parent = _parent(top[0])
    if parent is not None and "-m devstack run" in _command(parent, width=1000):
        return parent
    return top[0]


def busy_ports(ports: dict[int, str], web_port: int) -> str:
    """One line naming the ports of `ports` (port -> what needs it) that are taken, by whom
    and how to go on; "" when all are free."""
    by_owner: dict[int | None, list[int]] = {}
    for port in ports:
        if not _port_free(port):
            by_owner.setdefault(_owner(port), []).append(port)
    if not by_owner:
        return ""
    parts = []
    for owner, taken in by_owner.items():
        which = (
            f"port {taken[0]} ({ports[taken[0]]}) is"
            if len(taken) == 1
            else f"ports {', '.join(map(str, taken))} are"
        )
        who = f"pid {owner} {_command(owner)}" if owner else "a process of another user"
        parts.append(f"{which} taken by {who}")
    owners = [str(owner) for owner in by_owner if owner]
    how = f"stop {'it' if len(by_owner) == 1 else 'them'} first"
    if owners:
        how += f" (kill {' '.join(owners)})"
    if list(by_owner.values()) == [[web_port]]:
        how += ", or give the web another port with --port N"
    return f"cannot start: {'; '.join(parts)}: {how}"
