"""Template helpers of the dashboard pages (number formats live in rw.py)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache, lru_cache
from html import escape
from typing import Any
from urllib.parse import urlencode

from django import template
from django.conf import settings
from django.contrib.humanize.templatetags.humanize import intcomma
from django.template.defaultfilters import truncatechars
from django.template.loader import get_template
from django.urls import get_script_prefix, get_urlconf, reverse
from django.utils.formats import localize
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.timezone import localtime

from monitor.models import BUDGET_STATUSES, OUTCOME_OK, STATUS_UNKNOWN, ProbeResult, Region, Task
from monitor.pages.common import DemoHistory, demo_history
from monitor.pages.regions import Matrix, MatrixRow
from monitor.pages.task import RouteRow
from monitor.templatetags.rw import errors, interval, ms, pct, tps

register = template.Library()

STATUS_LABELS = dict(BUDGET_STATUSES)


@register.filter
def status_label(status: str) -> str:
    return STATUS_LABELS.get(status, STATUS_LABELS[STATUS_UNKNOWN])


@register.filter
def ms_or_few(value: float | None) -> str:
    """A percentile, or why it is missing: the histograms hold too few samples for it."""
    return "too few" if value is None else ms(value)


@register.filter
def tps_or_few(value: float | None) -> str:
    return "too few" if value is None else f"{value:,.0f} tok/s"


@register.filter
def number_or_few(value: float | None) -> str:
    return "too few" if value is None else f"{value:,.0f}"


@register.filter
def thousands(value: float | int | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


@register.filter
def times(value: float | None) -> str:
    """A ratio between routes: 44x."""
    if value is None:
        return "—"
    return f"{value:.1f}x" if value < 10 else f"{value:,.0f}x"


@register.filter
def usd(value: Any) -> str:
    if value is None:
        return "—"
    amount = float(value)
    return f"${amount:,.4f}" if amount < 1 else f"${amount:,.2f}"


@register.simple_tag
def query(params: Mapping[str, Any], **overrides: Any) -> str:
    """`?a=1&b=2` from a dict plus overrides; an override of None or "" drops the key."""
    merged = {**params, **overrides}
    clean = {k: v for k, v in merged.items() if v not in (None, "")}
    return "?" + urlencode(clean) if clean else "?"


@register.simple_tag
def chip(label: object, value: object, current: object, **params: object) -> str:
    """A filter chip, active when `value == current` (the page's task, region, range...): a
    link to this page with `params` as its query string, for plain navigation (href) and
    htmx (hx-get; the filter bar sets the target, swap and history). Parameters that are
    None or empty are left out; `data_<name>=value` becomes a data-<name> attribute."""
    data = {k.removeprefix("data_"): v for k, v in params.items() if k.startswith("data_")}
    href = query({}, **{k: v for k, v in params.items() if not k.startswith("data_")})
    attrs = format_html_join("", ' data-{}="{}"', data.items())
    return format_html(
        '<a class="chip{}"{} href="{}" hx-get="{}">{}</a>',
        " active" if value == current else "",
        attrs,
        href,
        href,
        label,
    )


@register.inclusion_tag("front/_demo_banner.html", takes_context=True)
def demo_history_banner(context: template.Context) -> dict[str, Any]:
    """The "includes generated demo history" banner, with its show / hide switch; nothing on
    a database without generated history (monitor.demo_history)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    return {
        "demo": demo_history(request),
        # The switch is a reader's display choice: nothing to offer before a login.
        "can_switch": bool(user is not None and user.is_authenticated),
        "next": request.get_full_path() if request is not None else "/",
        "csrf_token": context.get("csrf_token"),
    }


@register.simple_tag
def generated_history() -> DemoHistory | None:
    """For templates without a request (the digest): the generated history's span, if any."""
    return demo_history(None)


@cache
def _row_template(name: str) -> Any:
    """A row template, compiled once per process (the pages render up to hundreds of rows;
    the values are formatted in Python first, so the template only places them)."""
    return get_template(f"front/rows/{name}.html")


def _escaped(values: dict[str, Any]) -> dict[str, Any]:
    """A row's values for its template, escaped here once (the standard library's html.escape,
    which is what Django's escape does, without its lazy-string checks) and marked safe, so the
    template only places them (numbers it places are given as text by the caller: the template
    would localize them); other values (flags, None) stay as they are for its {% if %}s. Left
    to the template's autoescape, each value went through localize() and the lazy escape: the task
    page's 10 rows took 2.8 ms CPU against 1.0 ms when 7bc9767^ wrote their HTML in Python
    (issue 33's task 24 h row in bench-pages)."""
    return {
        k: SafeString(escape(v)) if isinstance(v, str) and not isinstance(v, SafeString) else v
        for k, v in values.items()
    }


@register.simple_tag
def matrix_cells(row: MatrixRow, matrix: Matrix) -> SafeString:
    """A regions-matrix row's cells (up to routes x regions of them: 180 for 30 routes in 6
    regions), from front/rows/matrix_cells.html."""
    unit = matrix.unit
    cells = []
    for c in row.cells:
        if unit == "ms":
            shown = ms_or_few(c.value)
        elif unit == "tps":
            shown = tps_or_few(c.value)
        else:
            shown = errors(c.errors, c.attempts)
        reason = c.reason if c.reason and c.probes else ""
        cells.append(
            _escaped(
                {
                    "status": c.status,
                    "winner": c.winner,
                    "region_slug": c.region.slug,
                    "region_name": c.region.name,
                    "shown": shown,
                    "reason": reason,
                    "short": reason if len(reason) <= 60 else Truncator(reason).chars(60),
                    "stale": c.stale and c.probes,
                }
            )
        )
    return SafeString(_row_template("matrix_cells").render({"cells": cells}))


@register.simple_tag
def ranked_row(row: RouteRow, task: Task, region: Region | None) -> SafeString:
    """One route's row of the task page's ranked table (one row of 9 cells per candidate
    route), from front/rows/ranked_row.html. Secondary figures (p95 under p50, the quality
    index under the pass rate, the probe count under the errors) fold into their cell, so the
    table fits a laptop."""
    c = row.candidate
    query = {"task": task.slug} | ({"region": region.slug} if region is not None else {})
    index = row.route.quality_index
    rate = c.pass_rate
    missed = row.stats.count_missed if row.stats is not None else 0
    values = {
        "classes": ("" if c.qualifies else "dimmed") + (" winner" if row.is_winner else ""),
        "route_id": str(row.route.pk),
        "rank": str(row.rank),
        "is_winner": row.is_winner,
        "href": reverse("rw-route", args=[row.route.pk]) + "?" + urlencode(query),
        "route": str(row.route),
        "simulated": row.route.provider.is_simulated,
        "metric": ms(c.metric_ms),
        "metric_ci": interval(c.metric.low, c.metric.high),
        "ttft_p50": ms(row.ttft_p50_ms),
        "ttft_p95": ms_or_few(row.ttft_p95_ms),
        "ttft_status": row.ttft_status,
        "tps_p50": tps(row.tps_p50),
        "e2e_p50": ms(row.e2e_p50_ms),
        "e2e_p95": ms_or_few(row.e2e_p95_ms),
        "e2e_status": row.e2e_status,
        "pass_rate": pct(rate.point) if rate else "",
        "pass_ci": interval(rate.low, rate.high, "pct") if rate else "",
        "quality_index": "" if index is None else localize(index),
        "errors": errors(c.errors.k, c.errors.n),
        "errors_ci": interval(c.errors.low, c.errors.high, "pct") if c.errors.n else "",
        "ceiling": pct(task.error_ceiling()),
        "probes": intcomma(row.probes),
        "missed": intcomma(missed) if missed else "",
        "stale": row.stale,
        "qualifies": c.qualifies,
        "tied": c.tied,
        "reason": c.reason,
        "detail": c.detail or "",
    }
    return SafeString(_row_template("ranked_row").render(_escaped(values)))


@register.simple_tag
def log_row(r: ProbeResult) -> SafeString:
    """One result's row of the probe log (50 rows a page), from front/rows/log_row.html. Its
    task, route and region are already read (monitor.pages.log)."""
    return SafeString(_row_template("log_row").render(_escaped(log_row_values(r))))


def log_row_values(r: ProbeResult) -> dict[str, Any]:
    """The row's values, formatted (front/rows/log_row.html's context)."""
    at = localtime(r.started_at)
    return {
        "outcome": r.outcome,
        "pk": str(r.pk),
        "at_iso": at.isoformat(),  # the date filter's "c"
        "at": at.strftime("%m-%d %H:%M:%S"),  # its "m-d H:i:s"
        "generated": r.generated,
        "task_href": _href("rw-task", r.task.slug) if r.task is not None else "",
        "task_name": r.task.name if r.task is not None else "",
        "route_href": _href("rw-route", r.route.pk),
        "route": str(r.route),
        "region": r.region.name,
        "ok": r.outcome == OUTCOME_OK,
        "error_kind": r.error_kind or r.outcome,
        "quality_pass": r.quality_pass,
        "ttft": ms(r.ttft_ms),
        "e2e": ms(r.e2e_ms),
        "tps": tps(r.tps),
        "output_tokens": thousands(r.output_tokens),
        "cached": None if r.cached_tokens is None else thousands(r.cached_tokens),
        "http_version": str(r.http_version),
        "error_detail": truncatechars(r.error_detail, 160) if r.error_detail else "",
        "text": truncatechars(r.text, 160),
    }


def _href(name: str, arg: str | int) -> str:
    """reverse() of a page's URL, once per page for the rows of the same task or route."""
    return _href_in(get_script_prefix(), get_urlconf(), settings.ROOT_URLCONF, name, arg)


@lru_cache(maxsize=4096)
def _href_in(prefix: str, urlconf: str | None, root: str, name: str, arg: str | int) -> str:
    return reverse(name, args=[arg])
