"""Monitoring health in plain sight: is each region keeping its schedule, and if not, why.

Per region: slots due, probed and missed over the last hour and day (monitor.stats.health, the
minutes ingest keeps), the start lag's p50 and p99, the slots still open, the batches waiting in
its queue, the probes its workers carry and when one was last seen (their beacons,
monitor.pipeline.region.liveness). The Status page shows the table, `/metrics` exports it, and the
overview's banner names every region that misses more than 1% of its slots or has no live
worker, with the cause.

Two verdicts keep a region's trouble off its providers: a region with no live worker is
**down** (its slots are recorded missed, ours, never a provider's error), and a region whose
every probe of the last minutes failed to reach any of its providers (no route answered, two
or more providers, each failure a network one: DNS, connect, TLS, or no headers in time) has
a **failed path**: the pages say the region's network failed, not each provider.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import redis
from django.conf import settings
from django.db import connection
from django.db.models import Count, Q

from monitor.models import (
    SLOT_DISPATCHED,
    Heartbeat,
    ProbeResult,
    ProbeSlot,
    Region,
    RegionMinute,
    Route,
)
from monitor.pipeline import queues
from monitor.pipeline.ingest.results import region_heartbeat
from monitor.pipeline.region import liveness
from monitor.stats import health

HOUR = timedelta(hours=1)
DAY = timedelta(hours=24)
# A region's path is judged on its probes of this window (several ticks of every route).
PATH_WINDOW = timedelta(minutes=3)
# Failures that say the path to a provider failed, before any answer came.
PATH_KINDS = health.PATH_KINDS
PATH_MIN_PROBES = 3


@dataclass(frozen=True)
class PathFailure:
    """Every probe of a region in PATH_WINDOW failed at its network, across these providers."""

    probes: int
    providers: int


@dataclass
class RegionHealth:
    region: Region
    hour: health.Schedule
    day: health.Schedule
    open_slots: int  # sent, no result yet, deadline not passed
    overdue: int  # open past their deadline: the sweep records them missed within a tick
    queue_depth: int | None  # None: the broker does not answer
    workers: list[liveness.Beacon] | None  # None: the broker does not answer
    last_result_at: datetime | None  # the last results its workers delivered to ingest
    path_failed: PathFailure | None = None
    scheduled: bool = True  # some active task probes from it
    problems: list[str] = field(default_factory=list)

    @property
    def down(self) -> bool:
        """No live worker (the broker answering): nothing probes from this region."""
        return self.workers == []

    @property
    def in_flight(self) -> int:
        return sum(w["in_flight"] for w in self.workers or [])

    @property
    def capacity(self) -> int:
        return sum(w["capacity"] for w in self.workers or [])

    @property
    def holding(self) -> int:
        return sum(w["holding"] for w in self.workers or [])

    @property
    def threads(self) -> int:
        return sum(w["threads"] for w in self.workers or [])

    @property
    def worker_seen_at(self) -> datetime | None:
        seen = [w["seen_at"] for w in self.workers or []]
        return datetime.fromtimestamp(max(seen), UTC) if seen else None

    @property
    def saturated(self) -> bool:
        """Its workers cannot take more now: every probe or every thread in use."""
        return bool(self.workers) and (
            self.in_flight >= self.capacity or (self.threads > 0 and self.holding >= self.threads)
        )

    @property
    def missed_pct(self) -> float | None:
        share = self.hour.missed_share
        return None if share is None else share * 100


def _cause(h: RegionHealth) -> str:
    """Why a region misses slots, from what its figures show."""
    if h.workers == []:
        return "it has no live worker"
    if h.saturated:
        return "its workers are saturated (probes started too late to count)"
    if h.hour.late and h.hour.late * 2 >= h.hour.missed:
        # Late starts with workers that have room now: the batches waited in the queue while
        # no worker took them (a region's first worker starting, a worker reconnecting after a
        # WAN outage) or the workers were full then. Saying "saturated" sent a new region's
        # admin after capacity it did not lack (docs/remote-regions.md, tried as a new user).
        return (
            "probes started too late to count: its queue backed up (no worker taking from "
            "it for a while: one starting or reconnecting) or its workers were saturated"
        )
    if h.queue_depth:
        return f"{h.queue_depth} batches wait in its queue"
    return "results did not arrive by their slots' deadlines (broker, ingest or network)"


def _worker_problems(h: RegionHealth) -> list[str]:
    out = []
    for w in h.workers or []:
        name = f"{h.region.slug}: worker {w['worker']}"
        if not w.get("clock_ok", True):
            off = float(w.get("clock_offset_s") or 0.0)
            # The worker's own tolerance (RW_CLOCK_TOLERANCE_SECONDS where it runs).
            tolerance = w.get("clock_tolerance_s", settings.CLOCK_TOLERANCE_SECONDS)
            out.append(
                f"{name}: its clock is {abs(off):.0f} s {'ahead of' if off < 0 else 'behind'} "
                f"the central clock, beyond its tolerance of {tolerance} s: it refuses work "
                "(its slots are recorded missed, ours) until its time sync (NTP) is fixed"
            )
        if not w.get("consuming", True):
            out.append(f"{name}: stopped consuming (messages wait); it restarts itself")
    return out


def _problems(h: RegionHealth, now: datetime) -> list[str]:
    slug = h.region.slug
    out = []
    if h.path_failed is not None:
        out.append(
            f"{slug}: the region's network path failed: all {h.path_failed.probes} probes of "
            f"the last {PATH_WINDOW.seconds // 60} minutes, to {h.path_failed.providers} "
            "providers, failed before any answer (DNS, connect, TLS or no headers in time); "
            "the providers are not to blame"
        )
    if not h.scheduled and h.workers:
        out.append(
            f"{slug}: {len(h.workers)} live worker(s), but no active task probes from this "
            "region: it gets no work until one does (admin: Tasks, its regions)"
        )
    share = h.hour.missed_share
    if share is not None and share > health.MISSED_SHARE_MAX:
        out.append(f"{slug}: {share:.0%} of slots missed in the last hour; {_cause(h)}")
    if h.down:
        seen = h.last_result_at
        since = f"; results last arrived {_ago(now - seen)} ago" if seen else ""
        out.append(
            f"{slug}: down, no live worker{since}; its slots are recorded missed, "
            "never counted against providers"
        )
    elif h.saturated and not out:
        out.append(f"{slug}: its workers are saturated ({h.in_flight} probes in flight)")
    return out + _worker_problems(h)


def _ago(delta: timedelta) -> str:
    s = int(delta.total_seconds())
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h"


def scheduled_regions() -> list[Region]:
    """Active regions that some active task probes from."""
    return list(
        Region.objects.filter(is_active=True, tasks__is_active=True).distinct().order_by("name")
    )


def _with_idle(
    scheduled: list[Region], beacons: dict[str, list[liveness.Beacon]] | None
) -> list[Region]:
    """The regions the Status page lists: those some active task probes from, and any other
    active region with a live worker (enrolled and started before a task probes from it, or
    taken out of its tasks: its worker shows, and the page says why it gets no work)."""
    known = {g.slug for g in scheduled}
    live = [slug for slug in (beacons or {}) if slug not in known]
    idle = Region.objects.filter(is_active=True, slug__in=live) if live else []
    return sorted([*scheduled, *idle], key=lambda g: g.name)


def regions_health(now: datetime, *, with_idle: bool = False) -> list[RegionHealth]:
    """The health of each region some active task probes from; `with_idle` (the Status page):
    and of each other active region with a live worker. The scheduled regions and the live
    workers are read once (they were read twice for the Status page)."""
    scheduled = scheduled_regions()
    if not scheduled and not with_idle:
        return []
    beacons = liveness.live_workers()
    regions = _with_idle(scheduled, beacons) if with_idle else scheduled
    scheduled_ids = {g.pk for g in scheduled}
    if not regions:
        return []
    hour = health.schedules(now, HOUR)
    day = health.schedules(now, DAY, with_lags=False)
    ids = [g.pk for g in regions]
    open_by = {
        region_id: (n, overdue)
        for region_id, n, overdue in ProbeSlot.objects.filter(
            status=SLOT_DISPATCHED, region_id__in=ids
        )
        .values("region_id")
        .annotate(n=Count("id"), overdue=Count("id", filter=Q(deadline_at__lt=now)))
        .values_list("region_id", "n", "overdue")
    }
    seen = {
        hb.name: hb.last_seen
        for hb in Heartbeat.objects.filter(name__in=[region_heartbeat(i) for i in ids])
    }
    failed_paths = path_failures(now, ids)
    try:
        depths: dict[str, int] | None = queues.depths(g.queue_name for g in regions)
    except redis.RedisError:
        depths = None
    out = []
    for g in regions:
        h = RegionHealth(
            region=g,
            hour=hour.get(g.pk, health.Schedule(health.minute_of(now - HOUR))),
            day=day.get(g.pk, health.Schedule(health.minute_of(now - DAY))),
            open_slots=open_by.get(g.pk, (0, 0))[0],
            overdue=open_by.get(g.pk, (0, 0))[1],
            queue_depth=None if depths is None else depths.get(g.queue_name, 0),
            workers=None if beacons is None else beacons.get(g.slug, []),
            last_result_at=seen.get(region_heartbeat(g.pk)),
            path_failed=failed_paths.get(g.pk),
            scheduled=g.pk in scheduled_ids,
        )
        h.problems = _problems(h, now)
        out.append(h)
    return out


# The regions, of those asked about, with a probe of the window that got past the network, in
# one statement: first from the schedule's minutes (monitor.stats.health, RegionMinute.reached:
# a few rows a region, every live probe of the whole minutes inside the window), then, only
# for the regions still in doubt, from the window's raw rows (the minute the window starts in,
# and results no minute counts, such as generated history). The raw part reads through the
# (route_id, started_at) index, every route's window at once (the route ids an InitPlan
# array), and not at all when the minutes clear every region (a one-time filter). Read for
# every region, the raw part was the overview's and the Status page's costliest query under
# load (bench-load: 58-70 ms at p50, 104-132 ms at p95, ~10,000 rows at 59 slots a second).
_REACHED_SQL = f"""
WITH cleared AS (
  SELECT DISTINCT region_id FROM {RegionMinute._meta.db_table}
  WHERE minute >= %(since)s AND region_id = ANY(%(regions)s) AND reached > 0)
SELECT region_id FROM cleared
UNION
SELECT DISTINCT region_id FROM {ProbeResult._meta.db_table}
WHERE (SELECT count(*) FROM cleared) < cardinality(%(regions)s::bigint[])
  AND route_id = ANY(ARRAY(SELECT id FROM {Route._meta.db_table}))
  AND started_at >= %(since)s AND started_at <= %(now)s AND region_id = ANY(%(regions)s)
  AND region_id <> ALL(ARRAY(SELECT region_id FROM cleared))
  AND slot_at IS NOT NULL AND outcome <> 'missed'
  AND NOT (outcome = 'error' AND error_kind = ANY(%(kinds)s))
"""


def path_failures(now: datetime, region_ids: list[int]) -> dict[int, PathFailure]:
    """Regions whose every probe of PATH_WINDOW failed at the network, to two or more
    providers: the region's path, not each provider (monitor.models.ProbeResult, the recent
    days' partition only). A region with a probe of the window that got past the network is
    not counted at all (_REACHED_SQL: from the schedule's minutes, then the raw rows for the
    regions they do not clear)."""
    if not region_ids:
        return {}
    since = now - PATH_WINDOW
    with connection.cursor() as cursor:
        cursor.execute(
            _REACHED_SQL,
            {"since": since, "now": now, "regions": list(region_ids), "kinds": sorted(PATH_KINDS)},
        )
        reached = {region_id for (region_id,) in cursor.fetchall()}
    suspects = [i for i in region_ids if i not in reached]
    if not suspects:
        return {}
    recent = ProbeResult.objects.filter(
        started_at__gte=now - PATH_WINDOW, started_at__lte=now, slot_at__isnull=False
    ).exclude(outcome="missed")
    rows = (
        recent.filter(region_id__in=suspects)
        .values("region_id")
        .annotate(
            n=Count("id"),
            path=Count("id", filter=Q(outcome="error", error_kind__in=PATH_KINDS)),
            providers=Count("route__provider_id", distinct=True),
        )
        .values_list("region_id", "n", "path", "providers")
    )
    return {
        region_id: PathFailure(probes=n, providers=providers)
        for region_id, n, path, providers in rows
        if n >= PATH_MIN_PROBES and path == n and providers >= 2
    }


def banner(now: datetime, healths: list[RegionHealth] | None = None) -> list[str]:
    """The overview's banner: one line per problem, naming the region and its cause."""
    healths = regions_health(now) if healths is None else healths
    return [p for h in healths for p in h.problems]


def region_verdicts(healths: list[RegionHealth]) -> dict[str, str]:
    """Region slug -> why its cells cannot be read as its providers' figures now: down (no
    live worker, where workers have delivered results before: a region whose figures came
    from elsewhere, an import or this process, has no workers to lose), or its path failed.
    The overview marks those cells so (never green)."""
    out = {}
    for h in healths:
        if h.down and h.last_result_at is not None:
            out[h.region.slug] = (
                "its region is down (no live worker): nothing probes from there, "
                "the providers are not to blame"
            )
        elif h.path_failed is not None:
            out[h.region.slug] = (
                "its region's network path failed (every probe failed before any answer, "
                f"across {h.path_failed.providers} providers): the providers are not to blame"
            )
    return out
