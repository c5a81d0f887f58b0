"""Celery for real: one beat process and a worker; the periodic tick really runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from monitor.models import Heartbeat
from tests import support


@pytest.mark.django_db(transaction=True)
def test_beat_ticks_and_a_worker_runs_the_tick(tmp_path: Path) -> None:
    env = support.child_env(connection.settings_dict, TICK_SECONDS="1")
    worker = support.start(
        support.celery(
            "worker", "--queues", "ingest,default", "--pool", "solo", "--loglevel", "INFO"
        ),
        env,
        tmp_path / "worker.log",
    )
    beat = support.start(
        support.celery("beat", "--schedule", str(tmp_path / "beat-schedule"), "--loglevel", "INFO"),
        env,
        tmp_path / "beat.log",
    )
    try:

        def ticked_twice() -> bool:
            row = Heartbeat.objects.filter(name="tick").first()
            return row is not None and row.count >= 2

        assert support.wait_until(ticked_twice, timeout_s=60), (
            tmp_path / "worker.log"
        ).read_text()[-3000:] + (tmp_path / "beat.log").read_text()[-2000:]
    finally:
        support.stop(beat)
        support.stop(worker)
