"""A region worker's own commands: run it, and ask whether it is healthy.

    python -m monitor.region_worker run      # the Docker image's default command
    python -m monitor.region_worker health   # exit 0 healthy, 1 not (compose, systemd)

`run` starts Celery on the region's queue (`probes.<RW_REGION>`) with the region worker's
pool (monitor.limits.region_worker_args); extra arguments go to `celery worker`. `health`
reads the health file the worker writes beside its spool every liveness beat
(monitor.pipeline.region.liveness): unhealthy when that file is stale (the process hung or died),
when the worker has stopped consuming although messages wait (celery#10205), or when its clock
is beyond RW_CLOCK_TOLERANCE_SECONDS. It needs neither the broker nor Django, so it answers
during a broker outage too, when the worker itself is fine and keeps its results in its spool.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from monitor import limits
from monitor.pipeline.region import liveness

# A health file older than this means a hung or dead worker (it is written every 2 s).
HEALTH_MAX_AGE_S = 30.0


def celery_argv(region: str, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "monitor", "worker",
        "--queues", f"probes.{region}", "--hostname", f"{region}@%h", "--loglevel", "INFO",
        *limits.region_worker_args(), *extra,
    ]  # fmt: skip


def _spool_dir() -> Path:
    # As monitor.settings reads it, without loading Django (the health command stays light).
    var = os.environ.get("RW_VAR_DIR") or str(Path(__file__).resolve().parent.parent / "var")
    return Path(os.environ.get("RW_SPOOL_DIR") or Path(var) / "spool")


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "run"
    if command == "run":
        region = os.environ.get("RW_REGION", "")
        if not region:
            print(
                "RW_REGION is not set: which region does this worker probe from?", file=sys.stderr
            )
            return 2
        args = celery_argv(region, argv[1:])
        os.execv(args[0], args)  # noqa: S606 (our own interpreter, fixed arguments)
    if command == "health":
        healthy, why = liveness.read_health(_spool_dir(), HEALTH_MAX_AGE_S)
        print(("healthy: " if healthy else "UNHEALTHY: ") + why)
        return 0 if healthy else 1
    print(f"usage: python -m monitor.region_worker [run|health], not {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
