"""Rules of the project layout that a quick look can check."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.support import ROOT


def test_probes_never_imports_django() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "probes").rglob("*.py")
        if re.search(r"^\s*(from|import)\s+django", path.read_text(), re.MULTILINE)
    ]
    assert offenders == []


def test_templates_load_nothing_from_a_cdn() -> None:
    pattern = re.compile(r'(src|href)="https?://', re.IGNORECASE)
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "templates").rglob("*.html")
        if pattern.search(path.read_text())
    ]
    assert offenders == []
    assert (ROOT / "static/vendor/htmx-2.0.11/htmx.min.js").stat().st_size > 10_000
    assert (ROOT / "static/vendor/chartjs-4.6.1/chart.umd.min.js").stat().st_size > 100_000


def test_the_compose_file_is_valid(tmp_path) -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        if os.environ.get("RW_CI"):
            pytest.fail("docker-compose is missing in CI (.ci/run installs it)")
        pytest.skip("docker-compose is not installed")
    (tmp_path / "docker-compose.yml").write_text((ROOT / "docker-compose.yml").read_text())
    (tmp_path / ".env").write_text((ROOT / ".env.example").read_text())
    result = subprocess.run(
        [binary, "config", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    services = subprocess.run(
        [binary, "config", "--services"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    ).stdout.split()
    for name in ["postgres", "redis", "web", "beat", "ingest", "worker-us-east"]:
        assert name in services


def _importers(package: str, targets: tuple[str, ...]) -> list[str]:
    pattern = re.compile(
        r"^\s*(from|import)\s+monitor(\.("
        + "|".join(targets)
        + r")\b|\s+import\s+.*\b("
        + "|".join(targets)
        + r")\b)",
        re.MULTILINE,
    )
    return [
        str(path.relative_to(ROOT))
        for path in (ROOT / "monitor" / package).rglob("*.py")
        if pattern.search(path.read_text())
    ]


def test_imports_point_down_only() -> None:
    assert _importers("digest", ("pages",)) == []
    assert _importers("stats", ("pages", "digest")) == []
    assert _importers("pipeline", ("pages", "digest")) == []
