"""A region worker's local spool: results it could not publish wait here for the broker.

A batch's results are already paid for; when the broker cannot take them (Redis down, full or
unreachable), monitor.tasks writes them here as one JSON file per message and publishes them
again before the next batch and every RW_SPOOL_RETRY_SECONDS. Ingest stores a result that was
measured inside its slot's deadline however late it arrives, so a spooled result still counts.

Bounded: at most SPOOL_MAX_BATCHES files and SPOOL_MAX_BYTES bytes; past either, the oldest are
dropped, each drop logged with how many results went and the total dropped so far. A message
that cannot be written at all (the disk is full) is dropped the same way (`record_dropped`):
counted, logged, and the batch's other probes go on.

Several processes (a prefork worker's children, its periodic flusher) share the directory: a
file is claimed by renaming it to a name carrying the claimer's pid, so each is published by
one process; a claim left by a process that died is taken back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from django.conf import settings

log = logging.getLogger(__name__)

SpoolKind = Literal["results", "race", "scenario"]
_SUFFIX = ".json"
_CLAIMED = ".claimed-"
_DROPPED_FILE = "dropped-results.count"
# Drops this process could not write to the counter yet (its disk was full): added at the next
# write that succeeds. The region worker is one process (Celery's threads pool).
_unwritten = 0
_counter_lock = threading.Lock()


class SpoolEntry(TypedDict):
    """One spooled message: what monitor.tasks would have published to ingest."""

    kind: SpoolKind
    spooled_at: float  # Unix time
    count: int  # results in the message (a race counts 1)
    body: object  # the message's JSON argument (results_to_json / race_result_to_json)


@dataclass(frozen=True)
class Spooled:
    path: Path
    entry: SpoolEntry


def directory() -> Path:
    path = Path(settings.SPOOL_DIR)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _entries(path: Path) -> list[Path]:
    # Names start with a zero-padded nanosecond time: sorted by name is oldest first.
    return sorted(p for p in path.iterdir() if p.name.endswith(_SUFFIX))


def save(kind: SpoolKind, body: object, count: int) -> Path:
    """Keep one message that could not be published; then enforce the bounds."""
    path = directory()
    entry: SpoolEntry = {"kind": kind, "spooled_at": time.time(), "count": count, "body": body}
    name = f"{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}{_SUFFIX}"
    tmp = path / f".{name}.tmp"
    try:
        with open(tmp, "w", opener=lambda p, f: os.open(p, f, 0o600)) as fh:
            json.dump(entry, fh)
        tmp.replace(path / name)
    except BaseException:
        with contextlib.suppress(OSError):  # a partial file would keep the disk full
            tmp.unlink()
        raise
    log.warning("broker unavailable: %d %s kept in the local spool (%s)", count, kind, path)
    if _unwritten:
        _add_dropped(path, 0)
    _enforce_bounds(path)
    return path / name


def record_dropped(kind: SpoolKind, count: int, exc: BaseException) -> int:
    """A message that could be neither published nor spooled: its results are counted with
    the spool's drops and logged once; returns the total dropped so far."""
    try:
        total = _add_dropped(directory(), count)
    except OSError:
        total = dropped_total() + count
    log.error(
        "cannot keep %d %s in the local spool (%s: %s): dropped; %d results dropped from this "
        "spool in all",
        count,
        kind,
        type(exc).__name__,
        getattr(exc, "strerror", None) or "",
        total,
    )
    return total


def _count(path: Path) -> int:
    try:
        data = json.loads(path.read_text())
        return int(data.get("count", 0))
    except (OSError, ValueError, AttributeError):
        return 0


def _add_dropped(path: Path, n: int) -> int:
    """Add n to the counter file; returns the total. Written whole beside it and renamed, so a
    full disk leaves the old total readable; what could not be written waits in `_unwritten`."""
    global _unwritten
    counter = path / _DROPPED_FILE
    with _counter_lock:
        try:
            total = int(counter.read_text().strip() or 0)
        except (OSError, ValueError):
            total = 0
        total += n + _unwritten
        tmp = path / f".{_DROPPED_FILE}.{os.getpid()}.tmp"
        try:
            tmp.write_text(str(total))
            tmp.replace(counter)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            _unwritten += n
        else:
            _unwritten = 0
        return total


def dropped_total() -> int:
    try:
        written = int((directory() / _DROPPED_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        written = 0
    return written + _unwritten


def _enforce_bounds(path: Path) -> None:
    files = _entries(path)
    sizes = {}
    for f in files:
        try:
            sizes[f] = f.stat().st_size
        except FileNotFoundError:  # claimed meanwhile by another process
            continue
    files = [f for f in files if f in sizes]
    total_bytes = sum(sizes.values())
    dropped_files = dropped_results = 0
    while files and (
        len(files) > settings.SPOOL_MAX_BATCHES or total_bytes > settings.SPOOL_MAX_BYTES
    ):
        oldest = files.pop(0)
        n = _count(oldest)
        try:
            oldest.unlink()
        except FileNotFoundError:
            continue
        total_bytes -= sizes[oldest]
        dropped_files += 1
        dropped_results += n
    if dropped_files:
        total = _add_dropped(path, dropped_results)
        log.error(
            "result spool full (%d messages, %d bytes at most): dropped the %d oldest "
            "(%d results); %d results dropped from this spool in all",
            settings.SPOOL_MAX_BATCHES,
            settings.SPOOL_MAX_BYTES,
            dropped_files,
            dropped_results,
            total,
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reclaim_abandoned(path: Path) -> None:
    """Claims left by a process that died before publishing go back to the spool."""
    for f in path.iterdir():
        head, sep, pid = f.name.rpartition(_CLAIMED)
        if not sep or not pid.isdigit() or _pid_alive(int(pid)):
            continue
        with contextlib.suppress(FileNotFoundError):  # another process took it back first
            f.rename(path / head)


def pending() -> int:
    """Messages waiting in the spool (claimed ones included)."""
    path = directory()
    return sum(1 for f in path.iterdir() if _SUFFIX in f.name and not f.name.startswith("."))


def drain(publish: Callable[[SpoolEntry], None]) -> int:
    """Publish spooled messages oldest first; stop at the first that fails (the broker is still
    away). Returns how many were published. First, drops counted while the disk was full are
    written to the counter (the next drop would write them too, but there may be none)."""
    path = directory()
    if _unwritten:
        with contextlib.suppress(OSError):
            _add_dropped(path, 0)
    _reclaim_abandoned(path)
    sent = 0
    for f in _entries(path):
        claimed = f.with_name(f"{f.name}{_CLAIMED}{os.getpid()}")
        try:
            f.rename(claimed)
        except FileNotFoundError:
            continue  # another process has it
        try:
            entry: SpoolEntry = json.loads(claimed.read_text())
        except (OSError, ValueError):
            log.error("unreadable spool file %s set aside", f.name)
            claimed.rename(f.with_name(f".bad-{f.name}"))
            continue
        try:
            publish(entry)
        except Exception:
            claimed.rename(f)
            raise
        claimed.unlink()
        sent += 1
        log.info(
            "published %d spooled %s (kept %.0f s)",
            entry["count"],
            entry["kind"],
            time.time() - entry["spooled_at"],
        )
    return sent
