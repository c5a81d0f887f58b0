"""The whole test suite as two shards run side by side, each on embedded servers of its own.

Most of the suite's time is real time: the `slow` tests wait on probes that take 20-60 s, on
workers killed and restarted, on outages held for their length, while using little CPU. The
rest is CPU: Django views, Chromium, statistics. Run one after the other they take about 26
minutes on 2 cores; side by side, the waiting of one shard is the other's working time.

Each shard has its own var directory, so its own PostgreSQL and Redis (tests that restart
them restart their shard's only) and its own static files. A shard is the `slow` marker or its
complement, so every test is in exactly one. Only the whole suite is split: given test paths,
`-m`, `-k` or `--lf`, or external servers (DATABASE_URL, REDIS_URL), or RW_TEST_SHARDS=1, the
suite runs as one pytest, as before. The `slow` shard's output is kept in a file and printed
when both have ended; the command fails when either shard fails (pytest's exit 5, nothing
collected, included).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

# The shards: the waiting one first (its output is printed at the end), then the rest.
SHARDS = (("slow", "slow"), ("the rest", "not slow"))
# Options that choose tests: with any of them the caller chose, and nothing is split.
CHOOSERS = ("-m", "-k", "--lf", "--last-failed", "--ff", "--failed-first", "--sw", "--stepwise")


def split(pytest_args: Sequence[str], env: dict[str, str], root: Path) -> bool:
    """Whether this run is the whole suite, to be run as two shards."""
    if env.get("RW_TEST_SHARDS", "2") == "1":
        return False
    if env.get("DATABASE_URL") or env.get("REDIS_URL"):
        return False  # shared external servers: the shards' restarts would hit each other
    for arg in pytest_args:
        if arg.split("=", 1)[0] in CHOOSERS:
            return False
        if not arg.startswith("-") and (root / arg.split("::", 1)[0]).exists():
            return False  # a test file, folder or node id
    return True


def run(
    pytest_args: Sequence[str],
    var_dir: Path,
    start: Callable[[Path], tuple[dict[str, str], Callable[[], None]]],
    command: Sequence[str],
    cwd: Path,
) -> int:
    """Both shards at once; `start(var_dir)` brings up a shard's servers and returns its
    environment and how to stop them. Returns 0 only when both shards passed."""
    procs: list[tuple[str, subprocess.Popen[bytes], Path | None]] = []
    stops: list[Callable[[], None]] = []
    try:
        for i, (name, marker) in enumerate(SHARDS):
            shard_dir = (
                var_dir
                if i == len(SHARDS) - 1
                else var_dir.with_name(f"{var_dir.name}-{marker.replace(' ', '-')}")
            )
            env, stop = start(shard_dir)
            stops.append(stop)
            args = [*command, "-m", marker, *pytest_args]
            if i < len(SHARDS) - 1:
                log = shard_dir / "pytest.log"
                with log.open("wb") as out:
                    proc = subprocess.Popen(
                        args, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT
                    )
                procs.append((name, proc, log))
                print(
                    f"devstack: the {name} shard runs beside this one; its output follows at the end ({log})",
                    flush=True,
                )
            else:
                procs.append((name, subprocess.Popen(args, env=env, cwd=cwd), None))
        codes = {name: proc.wait() for name, proc, _ in reversed(procs)}
    finally:
        for _name, proc, _ in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
        for stop in reversed(stops):
            stop()
    for name, _, kept in procs:
        if kept is not None:
            sys.stdout.write(f"\n===== the {name} shard =====\n")
            sys.stdout.write(kept.read_text(errors="replace"))
    summary = ", ".join(
        f"{name}: {'passed' if code == 0 else f'exit {code}'}" for name, code in codes.items()
    )
    print(f"\ndevstack: shards {summary}", flush=True)
    return 0 if all(code == 0 for code in codes.values()) else max(codes.values()) or 1
