"""Real processes for the integration tests that start, kill and restart parts of the stack
(celery workers and beats, delay proxies), kept running the way the deployment keeps them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tests import support


@dataclass
class ProcessStack:
    """Named processes, each logging to `tmp/<name>.log` (appended across restarts)."""

    tmp: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    argv: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, dict[str, str]] = field(default_factory=dict)
    # Processes kept running as compose's `restart: unless-stopped` and `make run` keep them:
    # one that exits is started again (a Celery worker exits when its Redis connection breaks
    # mid-acknowledgement). Stopping or killing one on purpose stops keeping it.
    kept: set[str] = field(default_factory=set)
    restarts: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, name: str, argv: list[str], extra: dict[str, str] | None = None) -> None:
        self.argv[name], self.extra[name] = argv, extra or {}
        log = self.tmp / f"{name}.log"
        with log.open("ab") as fh:
            fh.write(b"\n--- (re)started\n")
        handle = log.open("ab")
        self.procs[name] = subprocess.Popen(
            argv,
            env={**self.env, **self.extra[name]},
            cwd=support.ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def restart(self, name: str) -> None:
        self.start(name, self.argv[name], self.extra[name])

    def supervise(self, *names: str) -> None:
        with self.lock:
            self.kept.update(names)

    def revive(self) -> None:
        """Start again every kept process that exited."""
        with self.lock:
            for name in sorted(self.kept):
                if self.procs[name].poll() is not None:
                    self.restarts[name] += 1
                    self.restart(name)

    def stop(self, name: str) -> None:
        with self.lock:
            self.kept.discard(name)
        support.stop(self.procs[name])

    def kill_group(self, name: str) -> None:
        """kill -9 the process and its children."""
        with self.lock:
            self.kept.discard(name)
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def children(self, name: str) -> list[int]:
        pid = self.procs[name].pid
        try:
            text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        except OSError:
            return []
        return [int(c) for c in text.split()]

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def logs(self, tail: int = 2500) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-tail:]}" for p in sorted(self.tmp.glob("*.log"))
        )

    def stop_all(self, timeout_s: float = 5) -> None:
        """Ask every process to stop at once, then kill the process groups still running
        (a worker's warm shutdown would otherwise wait for its batch)."""
        with self.lock:
            self.kept.clear()
        alive = [p for p in self.procs.values() if p.poll() is None]
        for proc in alive:
            proc.terminate()
        deadline = time.monotonic() + timeout_s
        for proc in alive:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


S = TypeVar("S", bound=ProcessStack)


@contextmanager
def running(stack: S) -> Iterator[S]:
    """Revive the stack's kept processes every second; stop everything at the end."""
    done = threading.Event()

    def supervisor() -> None:
        while not done.wait(1.0):
            stack.revive()

    watcher = threading.Thread(target=supervisor, name="stack-supervisor", daemon=True)
    watcher.start()
    try:
        yield stack
    finally:
        done.set()
        watcher.join()
        stack.stop_all()
