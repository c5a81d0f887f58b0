"""Helpers shared by tests that start real processes (Celery workers, beat, the web server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from monitor import limits

ROOT = Path(__file__).resolve().parent.parent


def database_url_of(settings_dict: dict[str, object]) -> str:
    """A DATABASE_URL for the database Django's test runner made, for child processes."""
    user = quote(str(settings_dict.get("USER") or ""), safe="")
    password = quote(str(settings_dict.get("PASSWORD") or ""), safe="")
    host = quote(str(settings_dict.get("HOST") or ""), safe="")
    port = settings_dict.get("PORT") or ""
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    netloc = f"{host}:{port}" if port else host
    return f"postgresql://{auth}{netloc}/{settings_dict['NAME']}"


def child_env(settings_dict: dict[str, object], **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url_of(settings_dict)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("wb")
    return subprocess.Popen(
        argv, env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "monitor", *args]


def region_worker(slug: str, name: str, concurrency: int = 50) -> list[str]:
    """A region worker as deployed: its region's queue, Celery's threads pool
    (monitor.limits.region_worker_args; fewer threads than the product's default)."""
    return celery(
        "worker", "-Q", f"probes.{slug}", "-n", name, "-l", "INFO",
        *limits.region_worker_args(concurrency),
    )  # fmt: skip


# The longest a wait is stretched on a loaded machine (load_factor).
MAX_LOAD_FACTOR = 4.0


def load_factor() -> float:
    """How much longer to wait for a condition on a loaded machine: the 1-minute load average
    per CPU, between 1 and MAX_LOAD_FACTOR. At a load average of 17 on 2 cores, a Celery worker
    took over 30 s to say "ready" and the fault suite failed on waits, not on what it checks;
    a wait is a bound on a condition, never a measurement, and a passing test waits no longer."""
    try:
        per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 1.0
    return min(MAX_LOAD_FACTOR, max(1.0, per_cpu))


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    """Poll `condition` until it holds or `timeout_s` (stretched by load_factor) has passed."""
    deadline = time.monotonic() + timeout_s * load_factor()
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return condition()


SERIES_METRICS = ("ttft_ms", "e2e_ms", "tps", "ttfat_ms")


def unfold_series(packed: dict[str, Any] | str, *, with_tails: bool = True) -> dict[str, Any]:
    """A route chart's packed data (monitor.pages.route.series) as static/js/app.js unfolds
    it: {"labels": [...], "ttft_ms": {"p50": [...], ...}, ...}. Written here again on purpose,
    as the tests' own reading of the format. A tail drawn over several buckets ("tails")
    replaces that quantile's one-bucket figures; `with_tails=False` reads the buckets' own
    figures only (the hour strips)."""
    data = json.loads(packed) if isinstance(packed, str) else packed
    tails = (data.get("tails") or {}) if with_tails else {}
    flat = [point for chunk in data["chunks"] for point in chunk]
    points = flat[data["skip"] : data["skip"] + data["count"]]
    step = timedelta(days=1) if data["step"] == "day" else timedelta(hours=1)
    out: dict[str, Any] = {"labels": []}
    for m in SERIES_METRICS:
        out[m] = {"p50": [], "p95": [], "p99": []}
    for i, point in enumerate(points):
        at = datetime.fromisoformat(data["start"]) + i * step
        out["labels"].append(f"{at:%Y-%m-%d}" if data["step"] == "day" else f"{at:%m-%d %H}:00")
        for mi, m in enumerate(SERIES_METRICS):
            for qi, q in enumerate(("p50", "p95", "p99")):
                at_i = mi * 3 + qi  # points stored before ttfat was charted end after tps
                value = point[at_i] if point and at_i < len(point) else None
                if q in tails and mi < 4:  # a tail point is [ttft, e2e, tps, ttfat]
                    value = tails[q]["points"][i][mi] if tails[q]["points"][i] else None
                out[m][q].append(value)
    return out
