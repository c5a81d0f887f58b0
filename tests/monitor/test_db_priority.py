"""monitor.db_priority: a web process raised above nice 0 gives its PostgreSQL backends its
nice and its autogroup's (each backend leads a session of its own: at nice 0 the overview's
waited for a CPU four times as long as it ran under bench-load), and only backends that are
provably the local server's, serving that connection."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections

from monitor import db_priority

WEB_NICE = -5


@pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice needs root (CI runs as root)")
@pytest.mark.django_db(transaction=True)
def test_a_raised_web_process_gives_its_new_backends_its_priority() -> None:
    db_priority.install()
    own_group = Path(f"/proc/{os.getpid()}/autogroup")
    group_before = db_priority.autogroup_nice(os.getpid())
    seen: dict[str, Any] = {}

    def web_thread() -> None:  # Django opens a connection per thread: a new backend
        os.setpriority(os.PRIO_PROCESS, 0, WEB_NICE)  # this thread only
        try:
            own_group.write_text(str(WEB_NICE))
            seen["groups"] = group_before is not None
        except OSError:  # a kernel that shows autogroups but refuses to set them (CI's)
            seen["groups"] = False
        try:
            connection.ensure_connection()
            backend = connection.connection.info.backend_pid
            seen["backend"] = backend
            seen["nice"] = os.getpriority(os.PRIO_PROCESS, backend)
            seen["group"] = db_priority.autogroup_nice(backend)
        finally:
            connections.close_all()
            if seen["groups"]:
                own_group.write_text(str(group_before or 0))

    thread = threading.Thread(target=web_thread)
    thread.start()
    thread.join(30)

    assert seen["nice"] == WEB_NICE, seen
    if seen["groups"]:  # a kernel whose autogroups can be set
        assert seen["group"] == WEB_NICE, seen
    # A process at the default priority leaves its backend alone.
    connection.ensure_connection()
    mine = connection.connection.info.backend_pid
    assert os.getpriority(os.PRIO_PROCESS, mine) == 0


@pytest.mark.django_db
def test_only_a_backend_of_the_server_at_the_sockets_other_end_is_touched() -> None:
    connection.ensure_connection()
    raw = connection.connection
    backend = raw.info.backend_pid
    host = str(raw.info.host)
    assert host.startswith("/"), "the embedded server answers on a Unix socket"
    assert db_priority.local_backend(raw.fileno(), host, backend) == backend
    # A server over TCP may be another host's: its backend pid means nothing here.
    assert db_priority.local_backend(raw.fileno(), "127.0.0.1", backend) is None
    # A socket whose peer is not that backend's parent (here: this process itself).
    left, right = socket.socketpair()
    with left, right:
        assert db_priority.local_backend(left.fileno(), host, backend) is None
    # A pid that is not a process here.
    assert db_priority.local_backend(raw.fileno(), host, 2**22 + 7) is None
