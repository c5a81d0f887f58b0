"""Dashboard views: thin and typed. Each parses its request, calls its page's builder
(monitor.answer.board, monitor.pages.task, .route, ...) and renders one template (or, for htmx, one
partial)."""

from __future__ import annotations

import functools
import hmac
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.db import InterfaceError, OperationalError, connection
from django.db.models import Max
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import mark_safe
from django.views.decorators.gzip import gzip_page
from django.views.decorators.http import require_GET, require_POST

from monitor.answer import board
from monitor.answer.board import metric_label
from monitor.models import (
    ERROR_KINDS,
    GRAIN_DAY,
    GRAIN_HOUR,
    HEARTBEAT_TICK,
    OUTCOMES,
    Heartbeat,
    Region,
    Rollup,
    Route,
    Task,
)
from monitor.pages import log as pages_log
from monitor.pages import metrics as pages_metrics
from monitor.pages import monitoring, shared
from monitor.pages import races as pages_races
from monitor.pages import regions as pages_regions
from monitor.pages import route as pages_route
from monitor.pages import scenario as pages_scenario
from monitor.pages import task as pages_task
from monitor.pages import whatif as pages_whatif
from monitor.pages.common import (
    HIDE_GENERATED_COOKIE,
    RANGES,
    hidden_before,
    hidden_until,
    may_read,
    parse_range,
    readonly_page,
)
from monitor.pages.http import HtmxHttpRequest
from monitor.pages.setup import setup_checklist
from monitor.pipeline import queues
from monitor.stats import spend


def _partial(request: HtmxHttpRequest, template: str, partials: set[str]) -> str:
    """htmx asks for one part of a page by its target's id; anything else gets the page."""
    target = request.htmx.target if request.htmx else None
    if target in partials:
        return f"{template}#{target}"
    return template


def _region(slug: str | None, task: Task | None = None) -> Region | None:
    if not slug:
        return None
    qs = task.regions.all() if task is not None else Region.objects.all()
    return qs.filter(slug=slug).first()


def _task(params: Mapping[str, str], tasks: list[Task]) -> Task | None:
    """The task named by ?task=, else the first of `tasks` (None when there are none). A list:
    the page shows them all as its chips, so it reads them once."""
    slug = params.get("task")
    named = next((t for t in tasks if t.slug == slug), None) if slug else None
    return named or (tasks[0] if tasks else None)


def _last_probe_at() -> datetime | None:
    """From the rollups, not a scan of the raw results: the last few hourly rows, or (when
    nothing ran lately) the daily rows."""
    since = timezone.now() - timedelta(hours=3)
    recent = Rollup.objects.filter(grain=GRAIN_HOUR, bucket_start__gte=since, region__isnull=True)
    last: datetime | None = recent.aggregate(last=Max("last_probe_at"))["last"]
    if last is None:
        daily = Rollup.objects.filter(grain=GRAIN_DAY, region__isnull=True)
        last = daily.aggregate(last=Max("last_probe_at"))["last"]
    return last


def _overview_body(not_before: datetime | None, now: datetime) -> dict[str, Any]:
    tick = Heartbeat.objects.filter(name=HEARTBEAT_TICK).first()
    if not_before is not None and now - board.WINDOW < not_before:
        # Generated history hidden: this reader's own overview, over the measured part only:
        # the hours after the last generated result's (none yet while that hour lasts).
        data = board.build(now, since=not_before)
    else:
        data = board.current(now)
    healths = monitoring.regions_health(now)
    # A region with no live worker, or whose path failed, is never shown green: its cells are
    # unknown, saying why (the snapshot's rows are rendered again for this read).
    verdicts = monitoring.region_verdicts(healths)
    for row in data.rows:
        for cell in row.cells:
            if cell.region_slug in verdicts:
                cell.stale = True
                if cell.winner is None:
                    cell.why = verdicts[cell.region_slug]
                else:
                    cell.silence = verdicts[cell.region_slug]
                data.rows_html = ""
    return {
        "rows": data.rows,
        # Rendered with the snapshot (a reader's own overview has none: rendered here).
        "rows_html": mark_safe(data.rows_html),  # noqa: S308 (our template's output)
        "built_at": data.built_at,
        "tick": tick,
        "tick_stale": tick is None or now - tick.last_seen > timedelta(minutes=2),
        "last_probe_at": _last_probe_at(),
        "refresh_s": settings.DASHBOARD_REFRESH_SECONDS,
        "rendered_at": now,
        "checklist": None if data.rows else setup_checklist(),
        "cap_notices": _cap_notices(Task.objects.filter(is_active=True), now),
        # Regions missing slots or without a live worker, with the cause (never silent).
        "health_problems": monitoring.banner(now, healths),
    }


@readonly_page
def overview(request: HtmxHttpRequest) -> HttpResponse:
    not_before = hidden_before(request)
    build = functools.partial(_overview_body, not_before)
    body = shared.body(request, "front/overview.html#overview-body", build, hidden=not_before)
    if request.htmx:  # its only htmx request is the refresh of the body
        return HttpResponse(body)
    ctx = {
        "body": body,
        "window_hours": int(board.WINDOW.total_seconds() // 3600),
    }
    return render(request, "front/overview.html", ctx)


def _task_body(
    task: Task, params: Mapping[str, str], not_before: datetime | None, now: datetime
) -> dict[str, Any]:
    region = _region(params.get("region"), task)
    window = parse_range(params, not_before=not_before)
    data = pages_task.build(task, region, window, dict(params), now)
    return {
        "page": data,
        "task": task,
        "regions": task.regions.filter(is_active=True).order_by("name"),
        "ranges": RANGES.values(),
        "custom_rows": range(1, pages_whatif.CUSTOM_ROWS + 1),
        "now": now,
        "built_at": now,
        "cap_notices": _cap_notices([task], now),
        "metric_label": metric_label(data.choice.metric),
        "reference": task.reference_label(),
    }


@readonly_page
def task_detail(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    # Its steps with it: the choice, the scenario panel and the calculator each ask for them.
    task = get_object_or_404(Task.objects.prefetch_related("steps"), slug=slug)
    not_before = hidden_before(request)
    parse_range(request.GET, not_before=not_before)  # a bad range is this read's error
    template = _partial(request, "front/task.html", {"whatif", "task-body"})
    part = template if "#" in template else f"{template}#task-body"
    build = functools.partial(_task_body, task, request.GET.dict(), not_before)
    body = shared.body(request, part, build, hidden=not_before)
    if part == template:  # htmx asked for the body or the calculator
        return HttpResponse(body)
    return render(request, template, {"task": task, "body": body})


def _route_body(
    route: Route, params: Mapping[str, str], not_before: datetime | None, now: datetime
) -> dict[str, Any]:
    # The task chips and the chosen task in one read; its steps with it (is it a scenario?).
    tasks = list(route.tasks.filter(is_active=True).order_by("name").prefetch_related("steps"))
    task = _task(params, tasks)
    region = _region(params.get("region"), task) if task else None
    window = parse_range(params, not_before=not_before)
    return {
        "page": pages_route.build(route, tasks, task, region, window, now),
        "scenario": pages_scenario.build(route, task, region, window, now) if task else None,
        "route": route,
        "task": task,
        "ranges": RANGES.values(),
        "now": now,
        "built_at": now,
        "cap_notices": _cap_notices([task] if task else [], now),
    }


@readonly_page
def route_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    route = get_object_or_404(Route.objects.select_related("provider"), pk=pk)
    not_before = hidden_before(request)
    parse_range(request.GET, not_before=not_before)  # a bad range is this read's error
    build = functools.partial(_route_body, route, request.GET.dict(), not_before)
    body = shared.body(request, "front/route.html#route-body", build, hidden=not_before)
    if _partial(request, "front/route.html", {"route-body"}) != "front/route.html":
        return HttpResponse(body)
    return render(request, "front/route.html", {"route": route, "body": body})


def _regions_body(
    params: Mapping[str, str], not_before: datetime | None, now: datetime
) -> dict[str, Any]:
    tasks = list(Task.objects.filter(is_active=True).order_by("name"))
    task = _task(params, tasks)
    window = parse_range(params, not_before=not_before)
    metric = params.get("metric") or pages_regions.DEFAULT_METRIC
    matrix = pages_regions.build(task, metric, window, now) if task else None
    if matrix is not None and not matrix.has_values and not params.get("task"):
        # Opened without a task: the first task that has figures to show, not one whose
        # every cell reads "too few" (read only when the first one has none).
        for other in tasks[1:]:
            candidate = pages_regions.build(other, metric, window, now)
            if candidate.has_values:
                task, matrix = other, candidate
                break
    return {
        "tasks": tasks,
        "task": task,
        "matrix": matrix,
        "metrics": pages_regions.METRICS.items(),
        "ranges": RANGES.values(),
        "built_at": now,
        "cap_notices": _cap_notices([task] if task else [], now),
    }


@readonly_page
def regions(request: HtmxHttpRequest) -> HttpResponse:
    not_before = hidden_before(request)
    parse_range(request.GET, not_before=not_before)  # a bad range is this read's error
    build = functools.partial(_regions_body, request.GET.dict(), not_before)
    body = shared.body(request, "front/regions.html#matrix-body", build, hidden=not_before)
    if _partial(request, "front/regions.html", {"matrix-body"}) != "front/regions.html":
        return HttpResponse(body)
    return render(request, "front/regions.html", {"body": body})


class _LogRead:
    """What the probe log's shared parts (its filter form and rows, or its rows alone for
    htmx) are built from, read only when a part is built."""

    def __init__(self, params: Mapping[str, str], not_before: datetime | None) -> None:
        self.params, self.not_before = params, not_before

    @functools.cached_property
    def known(self) -> tuple[list[Task], list[Route], list[Region]]:
        return (
            list(Task.objects.order_by("name")),
            list(Route.objects.select_related("provider").order_by("provider__name", "model_id")),
            list(Region.objects.order_by("name")),
        )

    @functools.cached_property
    def filter(self) -> pages_log.LogFilter:
        f = pages_log.parse_filter(self.params)
        f.not_before = self.not_before
        return f

    def page(self, now: datetime) -> dict[str, Any]:
        tasks, routes, regions_all = self.known
        return {
            **self.rows(now),
            "f": self.filter,
            "tasks": tasks,
            "routes": routes,
            "regions_all": regions_all,
            "outcomes": OUTCOMES,
            "error_kinds": ERROR_KINDS,
            "ranges": pages_log.LOG_RANGES.keys(),
        }

    def rows(self, now: datetime) -> dict[str, Any]:
        tasks, routes, regions_all = self.known
        cursor = pages_log.Cursor.decode(self.params.get("before"))
        return {
            "page": pages_log.page(self.filter, cursor, now, known=[*tasks, *routes, *regions_all]),
            "query": self.filter.query(),
            "export_limit": settings.EXPORT_MAX_ROWS,
            "built_at": now,
        }


@readonly_page
def probe_log(request: HtmxHttpRequest) -> HttpResponse:
    not_before = hidden_until(request)
    read = _LogRead(request.GET.dict(), not_before)
    if _partial(request, "front/log.html", {"log-body"}) != "front/log.html":
        body = shared.body(request, "front/log.html#log-body", read.rows, hidden=not_before)
        return HttpResponse(body)
    # The filter form with the rows: one part, outside the rows htmx swaps (focus stays).
    body = shared.body(request, "front/log.html#log-page", read.page, hidden=not_before)
    return render(request, "front/log.html", {"body": body})


@readonly_page
def races(request: HtmxHttpRequest) -> HttpResponse:
    tasks = list(Task.objects.filter(is_active=True).order_by("name"))
    task = _task(request.GET, tasks)
    region = _region(request.GET.get("region"), task) if task else None
    window = parse_range(request.GET, not_before=hidden_before(request))
    ctx = {
        "tasks": tasks,
        "task": task,
        "region": region,
        "page": pages_races.build(task, region, window, timezone.now()) if task else None,
        "ranges": RANGES.values(),
    }
    return render(request, _partial(request, "front/races.html", {"races-body"}), ctx)


# The exports' formats and media types. NDJSON (one JSON object a line, no array around them)
# streams into jq, DuckDB, BigQuery or a log pipeline a line at a time.
EXPORT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
    "ndjson": "application/x-ndjson",
}


@readonly_page
@require_GET
def export(request: HtmxHttpRequest, fmt: str) -> StreamingHttpResponse:
    if fmt not in EXPORT_TYPES:
        raise Http404("unknown export format")
    f = pages_log.parse_filter(request.GET)
    f.not_before = hidden_until(request)
    now = timezone.now()
    rows = pages_log.export_rows(f, now, settings.EXPORT_MAX_ROWS)
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    streams = {
        "csv": pages_log.csv_stream,
        "json": pages_log.json_stream,
        "ndjson": pages_log.ndjson_stream,
    }
    response = StreamingHttpResponse(streams[fmt](rows), content_type=EXPORT_TYPES[fmt])
    response["Content-Disposition"] = f'attachment; filename="routewatch-results-{stamp}.{fmt}"'
    response["X-Export-Row-Limit"] = str(settings.EXPORT_MAX_ROWS)
    return response


@require_POST
def demo_history(request: HtmxHttpRequest) -> HttpResponse:
    """Show or hide generated demo history on every page (a cookie: a display choice)."""
    target = request.POST.get("next") or "/"
    if not url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        target = "/"
    response = redirect(target)
    if request.POST.get("hide"):
        response.set_cookie(
            HIDE_GENERATED_COOKIE, "1", max_age=365 * 86400, samesite="Lax", httponly=True
        )
    else:
        response.delete_cookie(HIDE_GENERATED_COOKIE, samesite="Lax")
    return response


def _scraper_token_ok(request: HttpRequest) -> bool:
    token = settings.METRICS_BEARER_TOKEN
    header = request.headers.get("Authorization", "")
    if not token or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header.removeprefix("Bearer ").encode(), token.encode())


# Gzip when the scraper accepts it (Prometheus sends Accept-Encoding: gzip): a scrape grows with
# tasks x routes x regions (docs/pages-api-metrics.md has the sizes) and compresses ~10x. BREACH
# needs a secret in a compressed response that also reflects attacker-chosen input: /metrics
# carries neither a secret nor a CSRF token (only figures, slugs and model ids) and echoes no
# request input, so compressing it discloses nothing. Scoped to this view, not the pages.
@require_GET
@gzip_page
def metrics(request: HtmxHttpRequest) -> HttpResponse:
    """Prometheus scrape target. With METRICS_BEARER_TOKEN set: that token, or a logged-in
    user (public pages do not make it public); without one, the pages' rule. Gzip-compressed
    when the scraper accepts it."""
    if settings.METRICS_BEARER_TOKEN:
        allowed = _scraper_token_ok(request) or request.user.is_authenticated
    else:
        allowed = may_read(request)
    if not allowed:
        return HttpResponse(
            "authentication required\n",
            status=401,
            content_type="text/plain; charset=utf-8",
            headers={"WWW-Authenticate": 'Bearer realm="routewatch"'},
        )
    body, content_type = pages_metrics.exposition(request.headers.get("Accept", ""), timezone.now())
    return HttpResponse(body, content_type=content_type)


def _broker_figures() -> queues.BrokerFigures | None:
    return queues.broker_figures(g.queue_name for g in Region.objects.filter(is_active=True))


def _cap_notices(tasks: Iterable[Task], now: datetime) -> list[spend.CapState]:
    """Why capped tasks stopped (or paused some routes), for the top of every page."""
    return list(spend.cap_states(tasks, now).values())


def _status_body(now: datetime) -> dict[str, Any]:
    figures = _broker_figures()
    return {
        "figures": figures,
        "letters": [
            {**letter, "parked": datetime.fromtimestamp(letter["parked_at"], UTC)}
            for letter in (queues.dead_letters(50) if figures and figures["dead_letters"] else [])
        ],
        "tick": Heartbeat.objects.filter(name=HEARTBEAT_TICK).first(),
        "cap_notices": _cap_notices(Task.objects.filter(is_active=True), now),
        "regions": monitoring.regions_health(now, with_idle=True),
        "lag_bound_s": settings.START_LAG_MAX_SECONDS,
        "clock_tolerance_s": settings.CLOCK_TOLERANCE_SECONDS,
        "now": now,
        "built_at": now,
    }


@readonly_page
@require_GET
def status(request: HtmxHttpRequest) -> HttpResponse:
    """The pipeline's health: queue depths, unacknowledged and parked messages, the tick,
    and tasks stopped by their spend caps."""
    ctx: dict[str, Any] = {
        "body": shared.body(request, "front/status.html#status-body", _status_body)
    }
    if request.user.is_staff:  # the replay button carries this reader's CSRF token: never shared
        try:
            ctx["dead_letters"] = queues.dead_letter_count()
        except redis.RedisError:
            ctx["dead_letters"] = 0  # the body says the broker does not answer
    return render(request, "front/status.html", ctx)


@staff_member_required
@require_POST
def replay_dead_letters(request: HttpRequest) -> HttpResponse:
    """Ingest the parked messages again (idempotent: nothing is stored twice)."""
    try:
        replayed, stored = queues.replay_dead_letters()
    except (OperationalError, InterfaceError) as exc:
        messages.error(request, f"The database is still unavailable ({type(exc).__name__}).")
    else:
        messages.success(request, f"{replayed} messages replayed: {stored} results newly stored.")
    return redirect("rw-status")


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers and compose healthchecks: the database answers."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})
