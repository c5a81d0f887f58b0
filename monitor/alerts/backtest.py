"""Before enabling a rule: how often would it have fired over the stored history?

The rule is evaluated hour by hour over the last DAYS days with the live evaluator
(monitor.alerts.evaluation), on the task's hourly rollup rows read once (one query, only the
columns the rule needs) and slid over in memory: a month of a task's rows in the generated
demo history answers in well under the admin's 2 s budget. A breach counts as a firing as it
does live: once it has held for the rule's minimum duration counted from the onset of its
evidence (monitor.alerts.onset's change point, on each hour's count past the line instead of
single probes, within the window and after the subject's last resolution: the start of an
hour), confident at every evaluation in between.

Rules on live state only (no route qualifies, stale figures, missed slots, spend cap, served
model) have no hourly history to replay: their backtest says so, except "the winner changed",
counted from the recorded winner changes.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Prefetch

from monitor.alerts import evaluation, onset
from monitor.alerts.evaluation import BASELINE_OFFSET, Keyed
from monitor.alerts.models import (
    KIND_AVAILABILITY,
    KIND_LATENCY,
    KIND_QUALITY,
    KIND_RATE_LIMIT,
    KIND_WINNER_CHANGED,
    AlertRule,
)
from monitor.models import GRAIN_HOUR, Rollup, Route, Task, WinnerChange
from monitor.stats.rollups import COUNTERS, Stats, bucket_start

DAYS = 30
REPLAYED = frozenset({KIND_LATENCY, KIND_AVAILABILITY, KIND_QUALITY, KIND_RATE_LIMIT})


@dataclass
class Firing:
    at: datetime
    subject: str
    summary: str
    why: str


@dataclass
class Backtest:
    rule: AlertRule
    since: datetime
    until: datetime
    firings: list[Firing] = field(default_factory=list)
    hours: int = 0
    supported: bool = True
    note: str = ""
    seconds: float = 0.0

    @property
    def headline(self) -> str:
        if not self.supported:
            return self.note
        n = len(self.firings)
        return f"would have fired {n} time{'s' if n != 1 else ''} in the last {DAYS} days"


def _columns(rule: AlertRule) -> list[str]:
    base = ["route_id", "region_id", "bucket_start", *COUNTERS]
    if rule.kind != KIND_LATENCY:
        return [*base, "error_kinds"]
    # A latency rule reads one histogram, never the error kinds (a JSON document a row to
    # decode: a tenth of a month's replay).
    metric = rule.effective_metric()
    if metric.startswith("tps"):
        return [*base, "tps_hist"]
    kind = metric.rpartition("_p")[0]
    return [*base, "app_e2e_hist" if kind == "app_e2e" else f"ref_{kind}_hist"]


def run(rule: AlertRule, now: datetime, days: int = DAYS) -> Backtest:
    started = time.perf_counter()
    # Read once, not once per replayed hour: the task's routes (with providers, for their
    # names), regions and steps (Task.is_scenario).
    rule.task = Task.objects.prefetch_related(
        Prefetch("routes", queryset=Route.objects.select_related("provider")), "regions", "steps"
    ).get(pk=rule.task_id)
    until = bucket_start(now, GRAIN_HOUR) + timedelta(hours=1)
    since = until - timedelta(days=days)
    result = Backtest(rule=rule, since=since, until=until)
    if rule.kind == KIND_WINNER_CHANGED:
        for c in WinnerChange.objects.filter(
            task=rule.task, at__gte=since, at__lt=until, route__isnull=False
        ).select_related("route", "previous", "region"):
            result.firings.append(
                Firing(
                    c.at, f"change:{c.pk}", f"{c.region.slug}: {c.previous} -> {c.route}", c.reason
                )
            )
        result.seconds = time.perf_counter() - started
        return result
    if rule.kind not in REPLAYED:
        result.supported = False
        result.note = (
            "no backtest for this kind: it watches live state, which is not kept hour by hour"
        )
        return result
    earliest = since - rule.window() - (BASELINE_OFFSET if rule.baseline_ratio else timedelta())
    by_hour: dict[datetime, Keyed] = defaultdict(dict)
    rows = (
        Rollup.objects.filter(
            task=rule.task,
            grain=GRAIN_HOUR,
            region__isnull=False,
            bucket_start__gte=bucket_start(earliest, GRAIN_HOUR),
            bucket_start__lt=until,
        )
        .values(*_columns(rule))
        .iterator(chunk_size=5000)
    )
    for row in rows:
        by_hour[row["bucket_start"]][(row["route_id"], row["region_id"])] = Stats.of_values(row)

    def read(start: datetime, end: datetime, by_region: bool) -> Keyed:
        hour = bucket_start(start, GRAIN_HOUR)
        if by_region and hour + timedelta(hours=1) >= end:
            # One hour (a 60-minute window evaluated on the hour): its rows as they are, each
            # histogram merged once however many evaluations read it (callers only read).
            return by_hour.get(hour, {})
        merged: Keyed = {}
        while hour < end:
            for (route_id, region_id), stats in by_hour.get(hour, {}).items():
                key = (route_id, region_id) if by_region else (route_id,)
                into = merged.get(key)
                if into is None:
                    into = merged[key] = Stats()
                into.add(stats)
            hour += timedelta(hours=1)
        return merged

    def onset_of(finding: evaluation.Finding, at: datetime, floor: datetime | None) -> datetime:
        # The live definition (monitor.alerts.onset) on the pieces the backtest has: each
        # hour's count past the line in each agreeing region, from its histogram.
        evidence = finding.evidence
        if evidence is None:
            return at
        hour = bucket_start(at - rule.window(), GRAIN_HOUR)
        hours = []
        while hour < at:
            if floor is None or hour >= floor:
                hours.append(hour)
            hour += timedelta(hours=1)
        found = onset.of_pieces(
            evidence,
            {
                unit: [
                    onset.Piece(h, *evidence.count(stats, evidence.lines.get(unit)))
                    for h in hours
                    if (stats := by_hour.get(h, {}).get(unit)) is not None
                ]
                for unit in evidence.units
            },
        )
        return found if found is not None else at

    onsets: dict[str, datetime] = {}  # open subjects: their onset
    resolved: dict[str, datetime] = {}  # each subject's last resolution
    told: set[str] = set()
    at = since + timedelta(hours=1)  # each evaluation sees the whole hour before it
    while at <= until:
        result.hours += 1
        found = {f.subject: f for f in evaluation.evaluate(rule, at, read)}
        for subject in list(onsets):
            if subject not in found:
                del onsets[subject]
                told.discard(subject)
                resolved[subject] = at
        for subject, finding in found.items():
            began = onsets.get(subject)
            if began is None:
                began = onsets[subject] = onset_of(finding, at, resolved.get(subject))
            if subject not in told and at - began >= rule.hold_for():
                told.add(subject)
                result.firings.append(
                    Firing(at, subject, finding.summary, str(finding.facts.get("why", "")))
                )
        at += timedelta(hours=1)
    result.seconds = time.perf_counter() - started
    return result
