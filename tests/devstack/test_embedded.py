"""The embedded Redis of `make run` and `make test`, started for real in a folder of its own.

A broker's append-only file grows with every message ever queued; Redis replays it all at
start, answering LOADING meanwhile (seconds a GB: 1.6 GB took 14 s here after a few load
benchmarks). A start must wait for that, keep every key, and a Redis that cannot start at all
must be a clear error that leaves nothing running.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from devstack import embedded
from tests import support

SETS = 3_000_000  # about 1 s to replay here: longer than the start wait the test allows
QUEUED = 1_000


def _write_aof(path: Path) -> None:
    """SETs of one key (the same 100,000 values over and over), then a queue of QUEUED messages: what a broker's file looks like
    (much replayed, little kept)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    set_cmd = b"*3\r\n$3\r\nSET\r\n$4\r\nlast\r\n$8\r\n%08d\r\n"
    chunk = b"".join(set_cmd % i for i in range(100_000))
    with path.open("wb") as f:
        for _ in range(SETS // 100_000):
            f.write(chunk)
        for i in range(QUEUED):
            f.write(b"*3\r\n$5\r\nRPUSH\r\n$5\r\nqueue\r\n$8\r\n%08d\r\n" % i)


def _kept(url: str) -> tuple[object, object]:
    client = redis.Redis.from_url(url)
    try:
        return client.get("last"), client.lrange("queue", 0, -1)
    finally:
        client.close()


def test_a_redis_replaying_a_long_file_is_waited_for_keeps_everything_and_is_compacted(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    aof = tmp_path / "redis" / "appendonly.aof"
    _write_aof(aof)
    size = aof.stat().st_size
    assert size > embedded.AOF_COMPACT_MIN_BYTES
    try:
        # A start wait far shorter than the replay: LOADING is progress, not silence.
        url = embedded.start_redis(tmp_path, wait_s=0.3)
        assert "reading its append-only file (111 MB)" in capfd.readouterr().err
        expected = (b"%08d" % 99_999, [b"%08d" % i for i in range(QUEUED)])
        assert _kept(url) == expected
        # Far larger than what it holds: rewritten in the background, keeping everything.
        assert support.wait_until(lambda: aof.stat().st_size < size // 100, 30), aof.stat()
        embedded.stop_redis(tmp_path)
        url = embedded.start_redis(tmp_path, wait_s=0.3)
        assert _kept(url) == expected
    finally:
        embedded.stop_redis(tmp_path)


def test_a_redis_that_cannot_start_is_a_clear_error_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    """A broken file: `make test` (as `make run`, the same set-up) says what Redis said, with
    no traceback, and stops the PostgreSQL it had started before."""
    aof = tmp_path / "redis" / "appendonly.aof"
    aof.parent.mkdir(parents=True)
    aof.write_bytes(b"not a command\r\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["RW_TEST_VAR_DIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "devstack", "test", "--", "--version"],
        env=env,
        cwd=support.ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "embedded Redis stopped at start" in out
    assert "Bad file format reading the append only file" in out
    assert "Traceback" not in out
    assert (tmp_path / "postgres" / "PG_VERSION").exists(), "PostgreSQL was started first"
    assert not embedded.postgres_running(tmp_path)
    assert embedded.redis_port(tmp_path) is None
