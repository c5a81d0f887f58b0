"""The probe log (recent results, filtered, paged) and the CSV / JSON exports of the same filter.

Paging is by keyset (started_at, id), newest first. Without a route filter no B-tree index
orders the whole table by time, so a page is read by walking back from the cursor in growing
time slices (1 min, 4 min, 16 min...) that the (route, started_at) index (skip scan) or the
BRIN index on started_at answers cheaply; with a route filter the (route, started_at) index
does it directly. The first slice is short because at 3,600 combinations a minute an hour
holds 216,000 rows (sorting them for 50 took 260 ms). The rows' task, route and region are
read after the page's rows are chosen, never joined before the sort: the newest minutes have
no statistics yet, so the planner expects one row and joins thousands.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Q, QuerySet, prefetch_related_objects
from django.utils.dateparse import parse_datetime

from monitor.models import ERROR_KINDS, OUTCOMES, ProbeResult, Region, Route, Task
from monitor.pages.common import parse_int

PAGE_SIZE = 50
LOG_RANGES = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
DEFAULT_LOG_RANGE = "24h"
# The newest rows are read from a short slice of time first, then from slices four times as
# long until the page is full: no index orders every result by time (only each route's), so
# one query over the whole window would read and sort all of it. 15 s holds 900 results at
# 60 probes/s, 9,000 at ten times that.
FIRST_SLICE = timedelta(seconds=15)
# The first page also shows results stamped a little ahead of this server's clock (a region
# worker's clock ahead of ours).
CLOCK_AHEAD = timedelta(minutes=1)
OUTCOME_VALUES = {v for v, _ in OUTCOMES}
ERROR_KIND_VALUES = {v for v, _ in ERROR_KINDS}


@dataclass
class LogFilter:
    task: Task | None = None
    route: Route | None = None
    region: Region | None = None
    outcome: str = ""
    error_kind: str = ""
    range: str = DEFAULT_LOG_RANGE
    # Generated demo history hidden: only results from here on (monitor.pages.common).
    not_before: datetime | None = None

    @property
    def window(self) -> timedelta:
        return LOG_RANGES[self.range]

    def since(self, now: datetime) -> datetime:
        start = now - self.window
        return max(start, self.not_before) if self.not_before is not None else start

    def query(self) -> dict[str, str]:
        """The filter as query-string values (for links that keep it)."""
        out = {"range": self.range}
        if self.task:
            out["task"] = self.task.slug
        if self.route:
            out["route"] = str(self.route.pk)
        if self.region:
            out["region"] = self.region.slug
        if self.outcome:
            out["outcome"] = self.outcome
        if self.error_kind:
            out["error_kind"] = self.error_kind
        return out


def parse_filter(params: Mapping[str, str]) -> LogFilter:
    """Unknown values are ignored (the filter falls back to 'any'), never an error page."""
    task_slug = params.get("task") or ""
    region_slug = params.get("region") or ""
    route_id = parse_int(params.get("route"))
    outcome = params.get("outcome") or ""
    kind = params.get("error_kind") or ""
    window = params.get("range") or DEFAULT_LOG_RANGE
    return LogFilter(
        task=Task.objects.filter(slug=task_slug).first() if task_slug else None,
        route=Route.objects.select_related("provider").filter(pk=route_id).first()
        if route_id
        else None,
        region=Region.objects.filter(slug=region_slug).first() if region_slug else None,
        outcome=outcome if outcome in OUTCOME_VALUES else "",
        error_kind=kind if kind in ERROR_KIND_VALUES else "",
        range=window if window in LOG_RANGES else DEFAULT_LOG_RANGE,
    )


def filtered(f: LogFilter) -> QuerySet[ProbeResult]:
    qs = ProbeResult.objects.all()
    if f.route:
        qs = qs.filter(route=f.route)
    if f.task:
        qs = qs.filter(task=f.task)
    if f.region:
        qs = qs.filter(region=f.region)
    if f.outcome:
        qs = qs.filter(outcome=f.outcome)
    if f.error_kind:
        qs = qs.filter(error_kind=f.error_kind)
    if f.not_before is not None:
        qs = qs.filter(generated=False)
    return qs


@dataclass
class Cursor:
    started_at: datetime
    id: int

    def encode(self) -> str:
        return f"{self.started_at.isoformat()}~{self.id}"

    @classmethod
    def decode(cls, value: str | None) -> Cursor | None:
        if not value or "~" not in value:
            return None
        when, _, pk = value.rpartition("~")
        started = parse_datetime(when)
        number = parse_int(pk)
        return cls(started, number) if started and started.tzinfo and number else None


@dataclass
class LogPage:
    filter: LogFilter
    rows: list[ProbeResult]
    next_cursor: Cursor | None
    first_page: bool
    slices_read: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def page(
    f: LogFilter,
    cursor: Cursor | None,
    now: datetime,
    size: int = PAGE_SIZE,
    *,
    known: Iterable[Task | Route | Region] = (),
) -> LogPage:
    """`known`: tasks, routes (with their providers) and regions already read (the page's
    filter lists): the rows take theirs from them rather than reading them again."""
    base = filtered(f)
    since = f.since(now)
    upper = cursor.started_at if cursor else now + CLOCK_AHEAD
    rows: list[ProbeResult] = []
    step = FIRST_SLICE
    slices = 0
    first = True
    while len(rows) <= size and upper > since:
        # The first slice of the newest page ends ahead of now, but is as long back from now
        # as any first slice (it was [now, now + 1 min]: nearly always empty, so every read
        # of the log read and sorted the 4 minutes after it).
        lower = max(since, (now if first and cursor is None else upper) - step)
        qs = base.filter(started_at__gte=lower)
        if first and cursor:
            qs = qs.filter(
                Q(started_at__lt=cursor.started_at)
                | Q(started_at=cursor.started_at, id__lt=cursor.id)
            )
        elif first:
            qs = qs.filter(started_at__lte=upper)
        else:
            qs = qs.filter(started_at__lt=upper)
        rows.extend(qs.order_by("-started_at", "-id")[: size + 1 - len(rows)])
        slices += 1
        first = False
        upper = lower
        step *= 4
    more = len(rows) > size
    rows = rows[:size]
    by_key: dict[tuple[type, int | None], Task | Route | Region] = {
        (type(obj), obj.pk): obj for obj in known
    }
    for row in rows:
        for name, model, pk in (
            ("task", Task, row.task_id),
            ("route", Route, row.route_id),
            ("region", Region, row.region_id),
        ):
            if (model, pk) in by_key:
                setattr(row, name, by_key[model, pk])
    # Any not known: one read each (those known are not read again).
    prefetch_related_objects(rows, "task", "route__provider", "region")
    return LogPage(
        filter=f,
        rows=rows,
        next_cursor=Cursor(rows[-1].started_at, rows[-1].pk) if more and rows else None,
        first_page=cursor is None,
        slices_read=slices,
    )


# --- exports ------------------------------------------------------------------------------

EXPORT_FIELDS = [
    ("started_at", "started_at"),
    ("task", "task__slug"),
    ("provider", "route__provider__name"),
    ("model", "route__model_id"),
    ("route_id", "route_id"),
    ("region", "region__slug"),
    ("outcome", "outcome"),
    ("error_kind", "error_kind"),
    ("error_detail", "error_detail"),
    ("http_version", "http_version"),
    ("connection_reused", "connection_reused"),
    ("served_model", "served_model"),
    ("service_tier", "service_tier"),
    ("request_id", "request_id"),
    ("http2", "http2"),
    ("cold", "cold"),
    ("body_encoding", "body_encoding"),
    ("prefix_mode", "prefix_mode"),
    ("dns_ms", "dns_ms"),
    ("connect_ms", "connect_ms"),
    ("tls_ms", "tls_ms"),
    ("upload_ms", "upload_ms"),
    ("request_bytes", "request_bytes"),
    ("ttfb_ms", "ttfb_ms"),
    ("ttft_ms", "ttft_ms"),
    ("ttfat_ms", "ttfat_ms"),
    ("e2e_ms", "e2e_ms"),
    ("input_tokens", "input_tokens"),
    ("cached_tokens", "cached_tokens"),
    ("output_tokens", "output_tokens"),
    ("token_source", "token_source"),
    ("reasoning_tokens", "reasoning_tokens"),
    ("hidden_reasoning_tokens", "hidden_reasoning_tokens"),
    ("tps", "tps"),
    ("tps_token_source", "tps_token_source"),
    ("itl_p50_ms", "itl_p50_ms"),
    ("itl_max_ms", "itl_max_ms"),
    ("ratelimit_remaining_requests", "ratelimit_remaining_requests"),
    ("ratelimit_remaining_tokens", "ratelimit_remaining_tokens"),
    ("retry_after_s", "retry_after_s"),
    ("quality_pass", "quality_pass"),
    ("cost_usd", "cost_usd"),
    ("text", "text"),
    # Added after the first columns, so a reader that takes columns by position still reads
    # them where they were.
    # The planned slot (start lag is started_at - slot_at); a scenario's call has none of its
    # own: its scenario's slot is scenario_slot_at.
    ("slot_at", "slot_at"),
    # Demo history drawn from the simulator's profiles, not measured (monitor.demo_history).
    ("generated", "generated"),
    # Probed with the task's reference option set: only these rank routes.
    ("reference", "reference"),
    # Tokens that arrived in the stream (what speed counts), apart from billed output.
    ("streamed_output_tokens", "streamed_output_tokens"),
    # One call of a scenario: the scenario's id, its slot and the step (0 first); empty for
    # a single probe.
    ("scenario_id", "scenario_id"),
    ("scenario_slot_at", "scenario__slot_at"),
    ("step", "step"),
]
EXPORT_HEADER = [name for name, _ in EXPORT_FIELDS]


def export_rows(f: LogFilter, now: datetime, limit: int) -> Iterator[tuple[Any, ...]]:
    """The filter's results, oldest first, at most `limit`, read in chunks (server-side cursor)."""
    qs = filtered(f).filter(started_at__gte=f.since(now), started_at__lte=now)
    columns = [column for _, column in EXPORT_FIELDS]
    return qs.order_by("started_at", "id").values_list(*columns)[:limit].iterator(chunk_size=2000)


class _Echo:
    def write(self, value: str) -> str:
        return value


# Where a spreadsheet may start a cell: the text's start, or after any separator it might be
# told to split on (a file opened with ";" or "|" splits inside our quoted fields), then spaces
# (some trim them). A formula starts with one of = + - @, or a tab or carriage return.
_FORMULA_AT = re.compile(r"(^|[,;|\t\r\n])(?=[ ]*[=+\-@\t\r])")


def _cell(value: Any) -> Any:
    """Provider text could start a spreadsheet formula in any of its segments: each such
    segment gets a leading quote, which shows as text."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, str):
        return _FORMULA_AT.sub(r"\1'", value)
    return "" if value is None else value


def csv_stream(rows: Iterator[tuple[Any, ...]]) -> Iterator[str]:
    # Every field quoted: a separator inside one never splits it in a reader that honours quotes.
    writer = csv.writer(_Echo(), quoting=csv.QUOTE_ALL)
    yield writer.writerow(EXPORT_HEADER)
    for row in rows:
        yield writer.writerow([_cell(v) for v in row])


def ndjson_stream(rows: Iterator[tuple[Any, ...]]) -> Iterator[str]:
    """One JSON object a line, each line whole (NDJSON / JSON Lines): the JSON export's objects
    without the array around them. A newline inside a value is escaped by JSON, so never
    splits a line."""
    for row in rows:
        yield json.dumps(dict(zip(EXPORT_HEADER, row, strict=True)), cls=DjangoJSONEncoder) + "\n"


def json_stream(rows: Iterator[tuple[Any, ...]]) -> Iterator[str]:
    yield "["
    sep = "\n"
    for row in rows:
        yield sep + json.dumps(dict(zip(EXPORT_HEADER, row, strict=True)), cls=DjangoJSONEncoder)
        sep = ",\n"
    yield "\n]\n"
