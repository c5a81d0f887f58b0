"""Prometheus' own checker, `promtool`, from Debian's `prometheus` package (`.ci/run` installs
it): what a Prometheus user would run against our /metrics and our alert rules."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def promtool_path() -> str:
    path = os.environ.get("RW_PROMTOOL") or shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(path).exists():
        # Failing, not skipping: a check that silently does not run proves nothing.
        pytest.fail(
            f"promtool not found at {path}: apt-get install prometheus (or set RW_PROMTOOL)"
        )
    return path


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [promtool_path(), *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return result
