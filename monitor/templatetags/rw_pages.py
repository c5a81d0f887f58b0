"""Template helpers of the dashboard pages (number formats live in rw.py)."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any
from urllib.parse import urlencode

from django import template
from django.contrib.humanize.templatetags.humanize import intcomma
from django.template.defaultfilters import date, truncatechars
from django.urls import reverse
from django.utils.formats import localize
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator
from django.utils.timezone import localtime

from monitor.models import BUDGET_STATUSES, OUTCOME_OK, STATUS_UNKNOWN, ProbeResult, Region, Task
from monitor.pages.common import DemoHistory, demo_history
from monitor.pages.regions import Matrix, MatrixRow
from monitor.pages.task import RouteRow
from monitor.templatetags.rw import DASH, errors, interval, ms, pct, tps

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
    return {
        "demo": demo_history(request),
        "next": request.get_full_path() if request is not None else "/",
        "csrf_token": context.get("csrf_token"),
    }


@register.simple_tag
def generated_history() -> DemoHistory | None:
    """For templates without a request (the digest): the generated history's span, if any."""
    return demo_history(None)


@register.simple_tag
def matrix_cells(row: MatrixRow, matrix: Matrix) -> SafeString:
    """A regions-matrix row's cells. In Python, not the template language, and escaped with
    the standard library's html.escape (what Django's escape does, without its lazy-string
    checks): the matrix is up to routes x regions cells (180 for 30 routes in 6 regions),
    which in the template made rendering half of the page's time."""
    unit = matrix.unit
    out = []
    for c in row.cells:
        if unit == "ms":
            shown = ms_or_few(c.value)
        elif unit == "tps":
            shown = tps_or_few(c.value)
        else:
            shown = errors(c.errors, c.attempts)
        out.append(
            f'<td class="num cell-{escape(c.status)}{" winner" if c.winner else ""}" '
            f'data-region="{escape(c.region.slug)}">'
        )
        if c.winner:
            out.append(
                f'<span class="star" title="fastest qualifying route in {escape(c.region.name)}"'
                ">★</span> "
            )
        out.append(escape(shown))
        if c.reason and c.probes:
            short = c.reason if len(c.reason) <= 60 else Truncator(c.reason).chars(60)
            out.append(f' <small class="why" title="{escape(c.reason)}">{escape(short)}</small>')
        if c.stale and c.probes:
            out.append(' <span class="badge stale">stale</span>')
        out.append("</td>")
    return mark_safe("".join(out))  # noqa: S308 (every value in it went through escape)


@register.simple_tag
def ranked_row(row: RouteRow, task: Task, region: Region | None) -> SafeString:
    """One route's row of the task page's ranked table, in Python for the reason
    matrix_cells is (up to one row of 13 cells per candidate route)."""
    c = row.candidate
    where = f"?task={escape(task.slug)}" + (
        f"&amp;region={escape(region.slug)}" if region is not None else ""
    )
    href = reverse("rw-route", args=[row.route.pk]) + where
    classes = ("" if c.qualifies else "dimmed") + (" winner" if row.is_winner else "")
    out = [f'<tr class="{classes}" data-route="{row.route.pk}">', f"<td>{row.rank}</td>"]
    out.append(
        '<td class="route">'
        + ('<span class="star" title="fastest qualifying route">★</span> ' if row.is_winner else "")
        + f'<a href="{href}">{escape(str(row.route))}</a>'
        + (' <span class="tag">simulated</span>' if row.route.provider.is_simulated else "")
        + "</td>"
    )
    out.append(
        f'<td class="num">{escape(ms(c.metric_ms))} '
        f'<small class="ci">{escape(interval(c.metric.low, c.metric.high))}</small></td>'
    )
    out.append(f'<td class="num">{escape(ms(row.ttft_p50_ms))}</td>')
    out.append(
        f'<td class="num {escape(row.ttft_status)}">{escape(ms_or_few(row.ttft_p95_ms))}</td>'
    )
    out.append(f'<td class="num">{escape(tps(row.tps_p50))}</td>')
    out.append(f'<td class="num">{escape(ms(row.e2e_p50_ms))}</td>')
    out.append(f'<td class="num {escape(row.e2e_status)}">{escape(ms_or_few(row.e2e_p95_ms))}</td>')
    if c.pass_rate:
        rate = c.pass_rate
        shown = f'{escape(pct(rate.point))} <small class="ci">'
        shown += f"{escape(interval(rate.low, rate.high, 'pct'))}</small>"
    else:
        shown = DASH
    out.append(f'<td class="num">{shown}</td>')
    index = row.route.quality_index
    out.append(f'<td class="num">{DASH if index is None else escape(localize(index))}</td>')
    # Availability with its interval, as the overview shows it; our missed slots apart.
    shown = escape(errors(c.errors.k, c.errors.n))
    if c.errors.n:
        shown += (
            f' <small class="ci" data-errors-interval title="Out only when the whole 95% interval'
            f' is above the {escape(pct(task.error_ceiling()))} ceiling">'
            f"{escape(interval(c.errors.low, c.errors.high, 'pct'))}</small>"
        )
    missed = row.stats.count_missed if row.stats is not None else 0
    if missed:
        shown += (
            '<br><small class="muted" data-missed title="Slots our workers missed: ours, never'
            f" the route's errors\">{escape(intcomma(missed))} missed by us</small>"
        )
    out.append(f'<td class="num" data-metric="errors">{shown}</td>')
    out.append(f'<td class="num">{escape(intcomma(row.probes))}</td>')
    status = '<span class="badge stale">stale</span> ' if row.stale else ""
    if c.qualifies:
        status += '<span class="badge ok">qualifies</span>'
        if c.tied:
            status += ' <span class="badge tied">tied within noise</span>'
    else:
        detail = f": {escape(c.detail)}" if c.detail else ""
        status += (
            f'<span class="muted" title="{escape(c.detail)}">{escape(c.reason)}{detail}</span>'
        )
    out.append(f"<td>{status}</td></tr>")
    return mark_safe("".join(out))  # noqa: S308 (every value in it went through escape)


_GENERATED_TAG = (
    ' <small class="tag generated" title="Generated demo history: drawn from the simulator\'s '
    'profiles, not measured">generated</small>'
)


@register.simple_tag
def log_row(r: ProbeResult) -> SafeString:
    """One result's row of the probe log, in Python for the reason matrix_cells is (50 rows
    of 12 cells a page). Its task, route and region are already read (monitor.pages.log)."""
    at = localtime(r.started_at)
    out = [
        f'<tr class="outcome-{escape(r.outcome)}" data-result="{r.pk}">',
        f'<td><time datetime="{escape(date(at, "c"))}">{escape(date(at, "m-d H:i:s"))}</time>',
        _GENERATED_TAG if r.generated else "",
        "</td><td>",
    ]
    if r.task is not None:
        task_href = reverse("rw-task", args=[r.task.slug])
        out.append(f'<a href="{escape(task_href)}">{escape(r.task.name)}</a>')
    else:
        out.append('<span class="muted">ad hoc</span>')
    route_href = reverse("rw-route", args=[r.route.pk])
    out.append(f'</td><td><a href="{route_href}">{escape(str(r.route))}</a></td>')
    out.append(f"<td>{escape(r.region.name)}</td><td>")
    if r.outcome == OUTCOME_OK:
        out.append('<span class="badge ok">ok</span>')
    else:
        out.append(f'<span class="badge over">{escape(r.error_kind or r.outcome)}</span>')
    if r.quality_pass is True:
        out.append(' <span class="tag">pass</span>')
    elif r.quality_pass is False:
        out.append(' <span class="tag over">fail</span>')
    out.append(f'</td><td class="num">{escape(ms(r.ttft_ms))}</td>')
    out.append(f'<td class="num">{escape(ms(r.e2e_ms))}</td>')
    out.append(f'<td class="num">{escape(tps(r.tps))}</td>')
    out.append(f'<td class="num">{escape(thousands(r.output_tokens))}</td>')
    if r.cached_tokens is None:
        out.append('<td class="num"><span class="muted" title="not reported">n/r</span></td>')
    else:
        out.append(f'<td class="num">{escape(thousands(r.cached_tokens))}</td>')
    out.append(f'<td>{escape(str(r.http_version))}</td><td class="answer" hx-disable>')
    if r.error_detail:
        out.append(f'<span class="error">{escape(truncatechars(r.error_detail, 160))}</span>')
    else:
        out.append(escape(truncatechars(r.text, 160)))
    out.append("</td></tr>")
    return mark_safe("".join(out))  # noqa: S308 (every value in it went through escape)
