"""A region worker host's own record of the signed messages it ran: replay protection that
whoever writes to the broker cannot erase.

The broker's nonce claim (monitor.pipeline.signing.claim_nonce, `rw:nonce:<region>:<nonce>`)
lives in Redis, so anyone who can write there can delete it, or rewrite it to name a dead
process of this host, and the same signed batch runs again until it expires. So each host
also keeps, beside its result spool, a small SQLite file of the messages it claimed:

    claims(region, nonce, keep_until, claimer, state)

- `running`: claimed by `claimer` (a process of this host, named by its pid and its start
  time, so a new process that got the same pid is not taken for it).
- `retaken`: its first claimer died running it (killed, OOM) and Celery delivered it again
  (acks_late, reject_on_worker_lost); another process of this host took it over. Once only: a
  message that kills its worker twice is not run a third time.
- `done`: it ran to the end (or the broker's claim refused it): never again on this host.

A row is kept until its message expires (and CLOCK_SKEW_S more), after which the message is
refused as expired anyway; expired rows are pruned every PRUNE_EVERY_S, so the file holds at
most the messages of one expiry window. Committed before a probe is sent, and WAL with
synchronous=NORMAL: a claim survives the process being killed (-9); a power loss may lose
the last claims (fsync per message would cost more than the rest of the claim).

A full disk must not stop probing (issue 28, item 5): a claim that cannot be written (SQLite's
"full" or I/O errors) is `UNRECORDED`, logged once a minute, and the broker's claim alone
decides, as before; a message already recorded is still refused while the file can be read.
Any other failure (the directory not writable, a corrupt file) refuses the message: we
cannot check for a replay.

One process holds one connection, used under a lock by the threads pool's threads; several
processes (a prefork pool) share the file through SQLite's locking (BEGIN IMMEDIATE).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import threading
import time
from enum import Enum
from pathlib import Path
from typing import Any

from celery.signals import task_postrun

from monitor.pipeline.region import spool

log = logging.getLogger(__name__)

FILE_NAME = "replay.sqlite3"
PRUNE_EVERY_S = 60.0
# A message is refused as expired this long after its expiry at the latest (signing.verify
# refuses at once; a clock stepped back may accept it a little longer).
KEEP_AFTER_EXPIRY_S = 30.0
# A message without an expiry (none the beat sends) is remembered this long.
NO_EXPIRY_KEEP_S = 86400.0

RUNNING, RETAKEN, DONE = "running", "retaken", "done"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    region TEXT NOT NULL,
    nonce TEXT NOT NULL,
    keep_until REAL NOT NULL,
    claimer TEXT NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (region, nonce)
) WITHOUT ROWID;
-- Pruning reads expired rows by this.
CREATE INDEX IF NOT EXISTS claims_keep_until ON claims (keep_until);
"""


class Claim(Enum):
    FIRST = "first"  # never seen on this host: now running here
    RETAKEN = "retaken"  # its claimer here died running it: taken over, once
    REFUSED = "refused"  # ran, or runs, here already
    UNRECORDED = "unrecorded"  # not seen here, and the disk is full: the broker decides


class Unavailable(Exception):
    """The local record cannot be read or written (not a full disk): refuse the message."""


_lock = threading.Lock()
_conn: sqlite3.Connection | None = None
_conn_pid = 0
_pruned_at = 0.0
_unrecorded_logged_at = -PRUNE_EVERY_S
# What this thread claimed last, marked done when its Celery task ends (`_task_ended`).
_claimed = threading.local()


def path() -> Path:
    directory = spool.directory() / "replay"
    directory.mkdir(exist_ok=True, mode=0o700)
    return directory / FILE_NAME


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, from /proc), "" where that cannot be
    read, or None when no such process runs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
        try:  # no /proc: the pid alone says
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    except OSError:
        return ""
    # Fields after the command name (which may hold spaces and parentheses): state is the
    # 3rd field, starttime the 22nd.
    fields = stat.rpartition(b")")[2].split()
    return fields[19].decode() if len(fields) > 19 else ""


_me: tuple[int, str] = (0, "")


def me() -> str:
    """This process, as a claim names it: pid and start time."""
    global _me
    pid = os.getpid()
    if _me[0] != pid:
        _me = (pid, f"{pid}:{_start_time(pid) or ''}")
    return _me[1]


def _alive(claimer: str) -> bool:
    pid, _, started = claimer.partition(":")
    if not pid.isdigit():
        return False
    now = _start_time(int(pid))
    return now is not None and (not started or not now or now == started)


def _connection() -> sqlite3.Connection:
    global _conn, _conn_pid
    if _conn is None or _conn_pid != os.getpid():  # a forked child opens its own
        conn = sqlite3.connect(path(), timeout=10, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        _conn, _conn_pid = conn, os.getpid()
    return _conn


def _drop_connection() -> None:
    global _conn
    if _conn is not None:
        _conn.close()
        _conn = None


def _storage_failed(exc: BaseException) -> bool:
    """A full (or failing) disk, not a refusal to open: SQLite says SQLITE_FULL, or an I/O
    error (a full tmpfs fails the shared-memory file's allocation as SQLITE_IOERR_SHMSIZE)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EIO)


def _decide(conn: sqlite3.Connection, region: str, nonce: str, keep_until: float) -> Claim:
    row = conn.execute(
        "SELECT claimer, state FROM claims WHERE region = ? AND nonce = ?", (region, nonce)
    ).fetchone()
    if row is None:
        conn.execute(
            "INSERT INTO claims (region, nonce, keep_until, claimer, state) VALUES (?, ?, ?, ?, ?)",
            (region, nonce, keep_until, me(), RUNNING),
        )
        return Claim.FIRST
    claimer, state = row
    if state == RUNNING and not _alive(claimer):
        conn.execute(
            "UPDATE claims SET claimer = ?, state = ? WHERE region = ? AND nonce = ?",
            (me(), RETAKEN, region, nonce),
        )
        return Claim.RETAKEN
    return Claim.REFUSED


def claim(region: str, nonce: str, expires_at: float | None) -> Claim:
    """Record that this process runs the message, unless this host ran it (or runs it) already;
    Unavailable when the record cannot be used at all."""
    now = time.time()
    keep_until = (expires_at if expires_at is not None else now + NO_EXPIRY_KEEP_S) + (
        KEEP_AFTER_EXPIRY_S
    )
    with _lock:
        try:
            conn = _connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                outcome = _decide(conn, region, nonce, keep_until)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:  # SQLite may have rolled it back itself
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
        except (sqlite3.Error, OSError) as exc:
            _drop_connection()  # opened again for the next message
            if not _storage_failed(exc):
                raise Unavailable(f"{type(exc).__name__}: {exc}") from None
            _unrecorded(exc)
            return Claim.UNRECORDED
        _prune(conn, now)
    if outcome in (Claim.FIRST, Claim.RETAKEN):
        _claimed.key = (region, nonce)
    return outcome


def _unrecorded(exc: BaseException) -> None:
    global _unrecorded_logged_at
    if time.monotonic() - _unrecorded_logged_at >= PRUNE_EVERY_S:  # once a minute at most
        _unrecorded_logged_at = time.monotonic()
        log.warning(
            "cannot record claimed messages in the local replay cache (%s: %s, a full disk?): "
            "only the broker's claim guards them against a replay",
            type(exc).__name__,
            exc,
        )


def settle(region: str, nonce: str) -> None:
    """The message this process claimed ran to its end, or was refused after all: this host
    never runs it again, even once this process is gone."""
    with _lock:
        try:
            _connection().execute(
                "UPDATE claims SET state = ? WHERE region = ? AND nonce = ? AND claimer = ?",
                (DONE, region, nonce, me()),
            )
        except (sqlite3.Error, OSError) as exc:
            # Left `running`: once this process is gone, one more run of it could be taken
            # over; the broker's claim and the spend ledger (monitor.stats.spend) still count.
            log.warning("cannot mark a message done in the local replay cache (%s)", exc)
    if getattr(_claimed, "key", None) == (region, nonce):
        _claimed.key = None


def _prune(conn: sqlite3.Connection, now: float) -> None:
    global _pruned_at
    if now - _pruned_at < PRUNE_EVERY_S:
        return
    _pruned_at = now
    try:
        conn.execute("DELETE FROM claims WHERE keep_until < ?", (now,))
    except sqlite3.Error as exc:  # a full disk: the next prune tries again
        log.warning("cannot prune the local replay cache (%s)", exc)


def size() -> int:
    """Messages remembered now (expired ones not pruned yet included)."""
    with _lock:
        return int(_connection().execute("SELECT count(*) FROM claims").fetchone()[0])


@task_postrun.connect
def _task_ended(**_: Any) -> None:
    """A Celery task ended (returned or raised) in this thread (the threads pool runs a task
    and its signals in one thread): the message it claimed, if any, is done."""
    key = getattr(_claimed, "key", None)
    if key is not None:
        settle(*key)
