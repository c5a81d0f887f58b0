"""Folding results into the rollups at ingest (monitor.stats.rollups tells the whole story):
four rows per result, one UPSERT per batch in a stable order (no deadlock between ingest
workers), missed rows taken back out exactly, and writes into settled hours counted late.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import Field
from django.utils import timezone

from monitor.models import (
    GRAIN_DAY,
    GRAIN_HOUR,
    OUTCOME_MISSED,
    OUTCOME_OK,
    Heartbeat,
    Rollup,
    ScenarioResult,
)
from monitor.stats import hist
from monitor.stats.rollups import (
    COUNTERS,
    HISTOGRAMS,
    LATE_LEAD,
    LATE_WRITES,
    Counters,
    Key,
    Stats,
    bucket_start,
    settled_after,
)


class ResultRow(NamedTuple):
    """The columns of an inserted probe result that rollups fold in (monitor.pipeline.ingest)."""

    task_id: int | None
    route_id: int
    region_id: int
    slot_at: datetime | None
    started_at: datetime
    outcome: str
    error_kind: str
    ttft_ms: float | None
    ttfat_ms: float | None
    e2e_ms: float | None
    tps: float | None
    reference: bool
    quality_pass: bool | None
    cached_tokens: int | None
    input_tokens: int | None
    output_tokens: int | None
    cost_usd: Decimal | None
    # A scenario's result (monitor.pipeline.beat.scenarios) folds in as one row with its app e2e;
    # probe results have none (ingest reads the columns above only).
    app_e2e_ms: float | None = None


@dataclass
class _Delta(Counters):
    error_kinds: Counter[str] = field(default_factory=Counter)
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    tps: list[float] = field(default_factory=list)
    ttfat: list[float] = field(default_factory=list)
    ref_ttft: list[float] = field(default_factory=list)
    ref_ttfat: list[float] = field(default_factory=list)
    ref_e2e: list[float] = field(default_factory=list)
    app_e2e: list[float] = field(default_factory=list)
    last_probe_at: datetime | None = None
    last_ok_at: datetime | None = None

    def add(self, r: ResultRow) -> None:
        if r.outcome == OUTCOME_OK:
            self.count_ok += 1
            for value, into, ref_into in (
                (r.ttft_ms, self.ttft, self.ref_ttft),
                (r.ttfat_ms, self.ttfat, self.ref_ttfat),
                (r.e2e_ms, self.e2e, self.ref_e2e),
            ):
                if value is not None:
                    into.append(value)
                    if r.reference:
                        ref_into.append(value)
            if r.tps is not None:
                self.tps.append(r.tps)
            if r.app_e2e_ms is not None:
                self.app_e2e.append(r.app_e2e_ms)
            if self.last_ok_at is None or r.started_at > self.last_ok_at:
                self.last_ok_at = r.started_at
        elif r.outcome == OUTCOME_MISSED:
            self.count_missed += 1
        else:
            self.count_error += 1
        if r.error_kind:
            self.error_kinds[r.error_kind] += 1
        if r.quality_pass is not None:
            self.graded += 1
            self.passed += int(r.quality_pass)
        if r.cached_tokens is not None:
            self.cache_reported += 1
            self.cache_hits += int(r.cached_tokens > 0)
            self.cached_tokens += r.cached_tokens
        self.input_tokens += r.input_tokens or 0
        self.output_tokens += r.output_tokens or 0
        self.cost_usd += r.cost_usd or Decimal("0")
        if r.outcome != OUTCOME_MISSED and (
            self.last_probe_at is None or r.started_at > self.last_probe_at
        ):
            self.last_probe_at = r.started_at


_KEY_COLUMNS = ("grain", "bucket_start", "task_id", "route_id", "region_id")


_LATEST = ("last_probe_at", "last_ok_at")


# Each histogram column's samples in a _Delta, and their scale, in HISTOGRAMS' order.
_HIST_SOURCES = (
    ("ttft", hist.MS),
    ("e2e", hist.MS),
    ("tps", hist.TPS),
    ("ttfat", hist.MS),
    ("ref_ttft", hist.MS),
    ("ref_ttfat", hist.MS),
    ("ref_e2e", hist.MS),
    ("app_e2e", hist.MS),
)


_COLUMNS = ", ".join((*_KEY_COLUMNS, *COUNTERS, "error_kinds", *HISTOGRAMS, *_LATEST))


_UPSERT = f"""
INSERT INTO monitor_rollup ({_COLUMNS})
SELECT {{selected}} FROM unnest({{arrays}}) WITH ORDINALITY AS u({_COLUMNS}, ord)
ORDER BY ord
ON CONFLICT ({", ".join(_KEY_COLUMNS)}) DO UPDATE SET
  {", ".join(f"{c} = monitor_rollup.{c} + EXCLUDED.{c}" for c in COUNTERS)},
  error_kinds = (
    SELECT coalesce(jsonb_object_agg(k, n), '{{{{}}}}'::jsonb) FROM (
      SELECT k, sum(v::int) AS n FROM (
        SELECT * FROM jsonb_each_text(monitor_rollup.error_kinds)
        UNION ALL SELECT * FROM jsonb_each_text(EXCLUDED.error_kinds)
      ) AS kinds(k, v) GROUP BY k HAVING sum(v::int) <> 0
    ) AS summed
  ),
  {", ".join(f"{c} = rw_pairs_add(monitor_rollup.{c}, EXCLUDED.{c})" for c in HISTOGRAMS)},
  {", ".join(f"{c} = GREATEST(monitor_rollup.{c}, EXCLUDED.{c})" for c in _LATEST)}
"""


@cache
def _upsert_sql() -> str:
    """One array parameter a column, whatever the number of rows: the statement stays short
    to send and parse (a VALUES list of 25 parameters a row took longer to build client-side
    than the database took to run it). Error kinds and histograms travel as text (a histogram
    array per row is ragged, which a 2-D array cannot hold) and are cast back per row."""
    arrays, selected = [], []
    for column in _COLUMNS.split(", "):
        if column == "error_kinds":
            arrays.append("%s::text[]")
            selected.append("error_kinds::jsonb")
        elif column in HISTOGRAMS:
            arrays.append("%s::text[]")
            selected.append(f"{column}::integer[]")
        else:
            # A foreign key's db_type is its target's key type (bigint).
            field_ = Rollup._meta.get_field(column.removesuffix("_id"))
            assert isinstance(field_, Field)
            arrays.append(f"%s::{field_.db_type(connection)}[]")
            selected.append(column)
    return _UPSERT.format(arrays=", ".join(arrays), selected=", ".join(selected))


def _pairs_text(pairs: list[int]) -> str:
    return "{" + ",".join(map(str, pairs)) + "}"


def _deltas(results: Iterable[ResultRow]) -> dict[Key, _Delta]:
    deltas: dict[Key, _Delta] = {}
    for r in results:
        if r.task_id is None:
            continue  # ad-hoc probes are not part of any task's rollups
        for grain in (GRAIN_HOUR, GRAIN_DAY):
            start = bucket_start(r.started_at, grain)
            for region_id in (r.region_id, None):
                key = (grain, start, r.task_id, r.route_id, region_id)
                deltas.setdefault(key, _Delta()).add(r)
    return deltas


def scenario_row(scenario: ScenarioResult) -> ResultRow:
    """A scenario as rollups fold it: one result per slot, its app e2e, no single-call
    latencies (its calls are not the task's probes)."""
    return ResultRow(
        task_id=scenario.task_id,
        route_id=scenario.route_id,
        region_id=scenario.region_id,
        slot_at=scenario.slot_at,
        started_at=scenario.started_at,
        outcome=scenario.outcome,
        error_kind=scenario.error_kind,
        ttft_ms=None,
        ttfat_ms=None,
        e2e_ms=None,
        tps=None,
        reference=True,
        quality_pass=scenario.validation_pass,
        cached_tokens=scenario.cached_tokens,
        input_tokens=scenario.input_tokens,
        output_tokens=scenario.output_tokens,
        cost_usd=scenario.cost_usd,
        app_e2e_ms=scenario.app_e2e_ms if scenario.outcome == OUTCOME_OK else None,
    )


def stats_of(
    results: Iterable[ResultRow], *, by_region: bool = True
) -> dict[tuple[int | None, ...], Stats]:
    """Results folded as ingest folds them into a rollup row, read back as Stats: per
    (route id, region id), or per (route id,) over all regions. For figures over an exact
    window (monitor.stats.window), whose edges are parts of hours no rollup row holds alone:
    the same counts, error kinds and histograms as the rows, so the same percentiles and
    intervals."""
    deltas: dict[tuple[int | None, ...], _Delta] = {}
    for r in results:
        if r.task_id is None:
            continue  # ad-hoc probes are not part of any task's rollups
        key: tuple[int | None, ...] = (r.route_id, r.region_id) if by_region else (r.route_id,)
        deltas.setdefault(key, _Delta()).add(r)
    found: dict[tuple[int | None, ...], Stats] = {}
    for k, d in deltas.items():
        stats = Stats(error_kinds=dict(d.error_kinds))
        for name in COUNTERS:
            setattr(stats, name, getattr(d, name))
        for column, (attr, scale) in zip(HISTOGRAMS, _HIST_SOURCES, strict=True):
            stats._defer(column, hist.build(getattr(d, attr), scale))
        stats._seen(d.last_probe_at, d.last_ok_at)
        found[k] = stats
    return found


def apply(results: Iterable[ResultRow]) -> int:
    """Fold results into the rollups; returns how many rollup rows were written."""
    return _upsert(_deltas(results))


def retract(missed: Iterable[ResultRow]) -> int:
    """Take `missed` results back out of the rollups (ingest replaced them with the real,
    late result). Only missed rows: they add counts and error kinds, never a histogram sample
    or a last-probe time, so subtracting their counts undoes them exactly."""
    deltas = _deltas(missed)
    for d in deltas.values():
        if d.ttft or d.e2e or d.tps or d.last_probe_at is not None or d.count_ok or d.count_error:
            raise ValueError("only missed results can be retracted from the rollups")
        for name in COUNTERS:
            setattr(d, name, -getattr(d, name))
        d.error_kinds = Counter({k: -n for k, n in d.error_kinds.items()})
    return _upsert(deltas)


def _upsert(deltas: dict[Key, _Delta]) -> int:
    if not deltas:
        return 0
    # A stable order, so two ingest workers lock rollup rows in the same order (no deadlock).
    # Day rows sort first: a worker writes the hour strip of (task, route, region, day) (their
    # trigger, monitor.HourStrip) only once it holds that day's rollup row, so strips add none.
    keys = sorted(deltas, key=lambda k: (k[0], k[1], k[2], k[3], k[4] or 0))
    columns: list[list[Any]] = [[k[i] for k in keys] for i in range(len(_KEY_COLUMNS))]
    ordered = [deltas[k] for k in keys]
    columns += [[getattr(d, name) for d in ordered] for name in COUNTERS]
    columns.append([json.dumps(d.error_kinds) for d in ordered])
    for attr, scale in _HIST_SOURCES:
        columns.append([_pairs_text(hist.build(getattr(d, attr), scale)) for d in ordered])
    columns += [[getattr(d, name) for d in ordered] for name in _LATEST]
    with connection.cursor() as cursor:
        cursor.execute(_upsert_sql(), columns)
    if _into_settled(keys, timezone.now()):
        # In this transaction: a kept read that sees the new count has these rows too.
        Heartbeat.add(LATE_WRITES)
    return len(deltas)


def _into_settled(keys: Iterable[Key], now: datetime) -> bool:
    edge = now - settled_after() + LATE_LEAD
    edges = {grain: bucket_start(edge, grain) for grain in (GRAIN_HOUR, GRAIN_DAY)}
    return any(bucket < edges[grain] for grain, bucket, *_ in keys)
