"""Retention: raw results, scenario results, closed races and slots past their days go;
rollups stay (beat's delete_old_results task, monitor.tasks).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import (
    connection,
    transaction,
)
from django.utils import timezone

from monitor import partitions
from monitor.models import (
    SLOT_DISPATCHED,
    GeneratedSpan,
    RaceRun,
)
from monitor.stats import health

log = logging.getLogger(__name__)


def delete_old_results(days: int, batch: int = 20_000, slot_days: int | None = None) -> int:
    """Retention: raw results older than `days` go (whole daily partitions dropped, rows of the
    other partitions deleted: monitor.partitions), with scenario results and closed races;
    closed slots after `slot_days` (settings.SLOT_RETENTION_DAYS), at most `days`; rollups
    stay. Returns how many rows were deleted row by row (dropped partitions are logged)."""
    now = timezone.now()
    cutoff = now - timedelta(days=days)
    done = partitions.drop_expired(cutoff, batch)
    if done.dropped:
        log.info("retention dropped partitions %s", ", ".join(done.dropped))
    # A scenario started before the cutoff goes with its calls, some of which started after it.
    scenario_rows = _delete_old_scenarios(cutoff, batch)
    if (done.dropped or done.deleted or scenario_rows) and GeneratedSpan.objects.exists():
        GeneratedSpan.refresh()  # some of the generated history may have gone
    kept_days = min(days, slot_days if slot_days is not None else settings.SLOT_RETENTION_DAYS)
    slots = _delete_closed_slots(now - timedelta(days=kept_days), batch)
    RaceRun.objects.filter(slot_at__lt=cutoff).exclude(status=SLOT_DISPATCHED).delete()
    health.drop_before(now - timedelta(days=min(days, health.KEPT_DAYS)))
    return done.deleted + slots + scenario_rows


_DELETE_SLOTS = """
DELETE FROM monitor_probeslot WHERE id IN (
  SELECT id FROM monitor_probeslot WHERE slot_at < %s AND status <> %s LIMIT %s)
"""


def _delete_closed_slots(cutoff: datetime, batch: int) -> int:
    """Closed slots older than the cutoff, `batch` per transaction (an hour's worth at 3,600
    combinations a minute is 216,000): short locks, and autovacuum reuses the space. A
    combination whose last slot went starts a new schedule when probed again
    (monitor.pipeline.beat.slots.starts_later). Open slots wait for the sweep."""
    deleted = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_DELETE_SLOTS, [cutoff, SLOT_DISPATCHED, batch])
            n = int(cursor.rowcount)
        deleted += n
        if n < batch:
            return deleted


_DELETE_SCENARIOS = """
WITH old AS (SELECT id FROM monitor_scenarioresult WHERE slot_at < %s ORDER BY slot_at LIMIT %s),
calls AS (DELETE FROM monitor_proberesult WHERE scenario_id IN (SELECT id FROM old))
DELETE FROM monitor_scenarioresult WHERE id IN (SELECT id FROM old)
"""


def _delete_old_scenarios(cutoff: datetime, batch: int) -> int:
    """Scenario results older than the cutoff, with what is left of their calls (most went
    with their day's partition), `batch` at a time; rollups keep their app e2e. Returns how
    many scenarios went."""
    deleted = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_DELETE_SCENARIOS, [cutoff, batch])
            n = int(cursor.rowcount)
        deleted += n
        if n < batch:
            return deleted
