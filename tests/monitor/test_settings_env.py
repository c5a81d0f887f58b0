"""A malformed environment value stops start-up with a message naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import ROOT

SETUP = "import django; django.setup(); print('started')"


def _start_with(**overrides: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(overrides)
    env["DJANGO_SETTINGS_MODULE"] = "monitor.settings"
    return subprocess.run(
        [sys.executable, "-c", SETUP], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_it_starts_with_the_test_environment() -> None:
    result = _start_with()
    assert result.returncode == 0, result.stderr
    assert "started" in result.stdout


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TICK_SECONDS", "soon", "TICK_SECONDS must be an integer"),
        ("TICK_SECONDS", "0", "TICK_SECONDS must be at least 1"),
        ("DEBUG", "maybe", "DEBUG must be a boolean"),
        ("DATABASE_URL", "sqlite:///db.sqlite3", "DATABASE_URL must be a PostgreSQL URL"),
        ("REDIS_URL", "http://localhost:6379", "REDIS_URL must start with redis://"),
        ("FIELD_ENCRYPTION_KEYS", "not-a-key", "FIELD_ENCRYPTION_KEYS entry 1 is not a Fernet key"),
        ("TIME_ZONE", "Mars/Olympus", "TIME_ZONE must be an IANA time zone"),
        ("EMAIL_PORT", "70000", "EMAIL_PORT must be at most 65535"),
        ("SITE_URL", "routewatch.example", "SITE_URL must start with http"),
        ("SECRET_KEY_FILE", "/nonexistent/secret", "SECRET_KEY_FILE points to"),
    ],
)
def test_a_malformed_value_names_the_variable(name: str, value: str, message: str) -> None:
    result = _start_with(**{name: value})
    assert result.returncode != 0
    assert message in result.stderr
    assert "Routewatch configuration error" in result.stderr


def test_a_secret_can_come_from_a_file(tmp_path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("from-a-file-" + "x" * 40)
    env_code = "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"
    env = dict(os.environ, SECRET_KEY_FILE=str(secret), DJANGO_SETTINGS_MODULE="monitor.settings")
    result = subprocess.run(
        [sys.executable, "-c", env_code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "from-a-file-" + "x" * 40
