"""The web's database sessions at the web's CPU priority, where PostgreSQL runs on this host
(monitor.wsgi installs it; bench-load's page reader installs it as a web worker would).

`make run` starts the web at nice -5 (devstack.stack.WEB_NICE), so that a page someone waits
on takes the CPU before the probing and ingesting workers. A page's queries run in its
PostgreSQL backend, though, and every backend leads a session of its own (PostgreSQL calls
setsid), so on Linux, which shares the CPUs between sessions first (autogroups), each is one
more session at nice 0 beside the workers': under bench-load at 1x the overview's backend
waited for a CPU 113 ms at p50, four times as long as it ran (bench/RESULTS.md).

So each new connection of a process running below nice 0 gives its backend the process's nice
and its session's autogroup nice, when the backend is provably a process of this host: the
connection is a Unix socket, and the backend's parent is the server at the socket's other end
(SO_PEERCRED). A server elsewhere (compose's own container, a managed database) is left
alone: its CPU weight is set where it runs (compose's cpu_shares). Without the permission to
lower a nice (root or CAP_SYS_NICE) it is said once in the log, and nothing else changes.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from pathlib import Path
from typing import Any

from django.db.backends.signals import connection_created

log = logging.getLogger(__name__)

_said = False


def install() -> None:
    connection_created.connect(follow, dispatch_uid="monitor.db_priority")


def follow(sender: Any, connection: Any, **kwargs: Any) -> None:
    """connection_created: this process's nice and autogroup nice to its backend (see above)."""
    if connection.vendor != "postgresql":
        return
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    if nice >= 0:
        return  # a process at the default priority or below: nothing to share
    raw = connection.connection
    backend = local_backend(raw.fileno(), str(raw.info.host), int(raw.info.backend_pid))
    if backend is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, backend, nice)
    except OSError as exc:
        _say_once(f"the web's database sessions stay at the server's priority ({exc.strerror})")
        return
    group = autogroup_nice(os.getpid())
    if group is None:
        return
    try:  # some kernels show autogroups but refuse to set them (EINVAL): the nice still holds
        Path(f"/proc/{backend}/autogroup").write_text(str(group))
    except OSError as exc:
        _say_once(f"the web's database sessions keep their own autogroup ({exc.strerror})")


def local_backend(fd: int, host: str, backend: int) -> int | None:
    """`backend` when it is a process of this host serving this connection: a Unix socket
    (its host a directory) whose peer, the server that listens there, is the backend's parent."""
    if not host.startswith("/"):
        return None
    try:
        with socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        server, _, _ = struct.unpack("3i", creds)
        stat = Path(f"/proc/{backend}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces and parentheses): state, parent.
    fields = stat[stat.rindex(")") + 2 :].split()
    return backend if server > 0 and int(fields[1]) == server else None


def autogroup_nice(pid: int) -> int | None:
    """The nice of a process's autogroup ("/autogroup-42 nice -5"); None without autogroups."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _say_once(message: str) -> None:
    global _said
    if not _said:
        _said = True
        log.info(message)
