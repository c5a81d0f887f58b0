"""The races page: for one task, how often each route won its races, the time racing saved
against calling that route alone, and the tokens paid for cancelled losers.

Aggregated in SQL over the task's races in the window (index race_task_time); the per-route
lanes are a JSON object per race, expanded with jsonb_each. Means, not percentiles: races have
no rollups, and pages never compute percentiles over raw rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import connection

from monitor.models import SLOT_DISPATCHED, RaceRun, Region, Route, Task
from monitor.pages.common import Range

RECENT = 20

_LANES_SQL = """
SELECT lane.key,
       count(*) AS raced,
       count(*) FILTER (WHERE r.winner_id::text = lane.key) AS won,
       avg((lane.value->>'saved_ms')::float8)
         FILTER (WHERE r.winner_id IS NOT NULL AND r.winner_id::text <> lane.key) AS saved_ms,
       avg((lane.value->>'elapsed_ms')::float8)
         FILTER (WHERE r.winner_id::text = lane.key) AS win_ms,
       coalesce(sum((lane.value->>'tokens_paid')::bigint)
         FILTER (WHERE r.winner_id IS NULL OR r.winner_id::text <> lane.key), 0) AS extra_tokens,
       count(*) FILTER (WHERE coalesce((lane.value->>'cancelled')::boolean, false)
                          OR lane.value->>'outcome' = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE NOT coalesce((lane.value->>'cancelled')::boolean, false)
                          AND lane.value->>'outcome' IS NOT NULL
                          AND lane.value->>'outcome' NOT IN ('ok', '', 'cancelled')) AS failed
FROM monitor_racerun AS r CROSS JOIN LATERAL jsonb_each(r.lanes) AS lane
WHERE r.task_id = %s AND r.started_at >= %s AND r.started_at < %s AND r.status = 'done' {region}
GROUP BY lane.key
"""

_TOTALS_SQL = """
SELECT count(*) FILTER (WHERE status = 'done'), count(winner_id) FILTER (WHERE status = 'done'),
       count(*) FILTER (WHERE status = 'missed'), avg(winner_ms) FILTER (WHERE status = 'done'),
       coalesce(sum(loser_tokens), 0), coalesce(sum(loser_cost_usd), 0)
FROM monitor_racerun
WHERE task_id = %s AND started_at >= %s AND started_at < %s {region}
"""


@dataclass
class Lane:
    route: Route | None
    route_label: str
    raced: int
    won: int
    mean_saved_ms: float | None  # in races this route lost: time saved vs calling it alone
    mean_win_ms: float | None
    extra_tokens: int  # tokens paid for this route while it lost
    # A loser cancelled once another route won: it lost, it did not fail.
    cancelled: int
    failed: int  # its answer came back as a failure (probes.errors)

    @property
    def win_rate(self) -> float | None:
        return self.won / self.raced if self.raced else None


@dataclass
class RacesPage:
    task: Task
    region: Region | None
    range: Range
    races: int
    decided: int  # races with a winner
    missed: int  # races whose result never arrived
    mean_winner_ms: float | None
    loser_tokens: int
    loser_cost_usd: Decimal
    lanes: list[Lane]
    recent: list[RaceRun]

    @property
    def has_data(self) -> bool:
        return self.races > 0

    def chart(self) -> dict[str, list[object]]:
        return {
            "labels": [lane.route_label for lane in self.lanes],
            "win_rate": [
                round(lane.win_rate * 100, 1) if lane.win_rate is not None else None
                for lane in self.lanes
            ],
        }


def build(task: Task, region: Region | None, window: Range, now: datetime) -> RacesPage:
    params: list[int | datetime] = [task.pk, window.since(now), now]
    region_sql = ""
    if region is not None:
        region_sql = "AND region_id = %s"
        params.append(region.pk)
    with connection.cursor() as cursor:
        cursor.execute(_TOTALS_SQL.format(region=region_sql), params)
        races, decided, missed, mean_winner, loser_tokens, loser_cost = cursor.fetchone()
        cursor.execute(
            _LANES_SQL.format(region=region_sql.replace("region_id", "r.region_id")), params
        )
        lane_rows = cursor.fetchall()
    routes = {
        str(r.pk): r
        for r in Route.objects.filter(
            pk__in=[int(k) for k, *_ in lane_rows if k.isdigit()]
        ).select_related("provider")
    }
    lanes = [
        Lane(
            route=routes.get(key),
            route_label=str(routes[key]) if key in routes else f"route {key} (deleted)",
            raced=raced,
            won=won,
            mean_saved_ms=saved,
            mean_win_ms=win_ms,
            extra_tokens=int(extra),
            cancelled=cancelled,
            failed=failed,
        )
        for key, raced, won, saved, win_ms, extra, cancelled, failed in lane_rows
    ]
    lanes.sort(key=lambda lane: (-(lane.win_rate or 0), lane.route_label))
    recent_qs = RaceRun.objects.filter(
        task=task, started_at__gte=window.since(now), started_at__lt=now
    ).exclude(status=SLOT_DISPATCHED)
    if region is not None:
        recent_qs = recent_qs.filter(region=region)
    recent = list(
        recent_qs.select_related("winner__provider", "region").order_by("-started_at")[:RECENT]
    )
    return RacesPage(
        task=task,
        region=region,
        range=window,
        races=races,
        decided=decided,
        missed=missed,
        mean_winner_ms=mean_winner,
        loser_tokens=int(loser_tokens),
        loser_cost_usd=Decimal(loser_cost),
        lanes=lanes,
        recent=recent,
    )
