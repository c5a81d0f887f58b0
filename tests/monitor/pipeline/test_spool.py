"""The region worker's bounded spool (monitor.pipeline.region.spool): real files, real
processes' pids.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from monitor.pipeline.region import spool


@pytest.fixture
def spool_dir(tmp_path: Path, settings) -> Path:
    settings.SPOOL_DIR = tmp_path / "spool"
    settings.SPOOL_MAX_BATCHES = 3
    settings.SPOOL_MAX_BYTES = 10_000
    return settings.SPOOL_DIR


def test_the_spool_keeps_what_could_not_be_sent_and_sends_it_oldest_first(spool_dir) -> None:
    for i in range(3):
        spool.save("results", [{"n": i}], 1)
    assert spool.pending() == 3
    sent: list[object] = []
    assert spool.drain(lambda entry: sent.append(entry["body"])) == 3
    assert sent == [[{"n": 0}], [{"n": 1}], [{"n": 2}]]
    assert spool.pending() == 0
    assert all(not p.name.endswith(".json") for p in spool_dir.iterdir())


def test_a_failed_publish_leaves_the_spool_as_it_was(spool_dir) -> None:
    spool.save("results", [{"n": 0}], 1)
    spool.save("race", {"race": 1}, 1)

    def broker_down(entry: spool.SpoolEntry) -> None:
        raise OSError("connection refused")

    with pytest.raises(OSError, match="connection refused"):
        spool.drain(broker_down)
    assert spool.pending() == 2
    kinds = []
    spool.drain(lambda entry: kinds.append(entry["kind"]))
    assert kinds == ["results", "race"]


def test_a_full_spool_drops_its_oldest_and_counts_them(spool_dir, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="monitor.pipeline.region.spool")
    for i in range(5):
        spool.save("results", [{"n": i}] * 2, 2)
    assert spool.pending() == 3
    assert spool.dropped_total() == 4  # two messages of two results
    assert "dropped the 1 oldest (2 results); 4 results dropped" in caplog.text
    bodies: list[object] = []
    spool.drain(lambda entry: bodies.append(entry["body"]))
    assert [b[0]["n"] for b in bodies] == [2, 3, 4]  # type: ignore[index]
    # The byte bound too: one big message pushes the others out.
    spool.save("results", [{"n": 9, "text": "x" * 9000}], 1)
    spool.save("results", [{"n": 10, "text": "y" * 9000}], 1)
    assert spool.pending() == 1


def test_drops_the_counter_could_not_take_are_written_by_the_next_drain(spool_dir) -> None:
    """A drop counted while the counter could not be written (the disk full; here its
    temporary file's name taken by a directory) reaches the file at the next drain, not only
    at a next drop, which may never come."""
    spool_dir.mkdir(parents=True, exist_ok=True)
    blocker = spool_dir / f".{spool._DROPPED_FILE}.{os.getpid()}.tmp"
    blocker.mkdir()
    try:
        assert spool.record_dropped("results", 2, OSError(28, "No space left on device")) == 2
        assert not (spool_dir / spool._DROPPED_FILE).exists()
    finally:
        blocker.rmdir()
    spool.drain(lambda entry: None)
    assert (spool_dir / spool._DROPPED_FILE).read_text() == "2"
    assert spool.dropped_total() == 2


def test_a_claim_left_by_a_dead_process_is_taken_back(spool_dir) -> None:
    path = spool.save("results", [{"n": 1}], 1)
    # A process that claimed the file and died: pid 2**22 + 1 is above Linux's pid_max default.
    path.rename(path.with_name(f"{path.name}.claimed-{2**22 + 1}"))
    bodies: list[object] = []
    assert spool.drain(lambda entry: bodies.append(entry["body"])) == 1
    assert bodies == [[{"n": 1}]]


def test_a_spool_file_holds_only_results_and_only_its_owner_reads_it(spool_dir) -> None:
    path = spool.save("results", [{"n": 1}], 1)
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["count"] == 1
