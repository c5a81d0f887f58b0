"""What every dashboard page shares: who may read it, which window it shows.

Page data is built in the page modules of monitor.pages (one per page); views only parse the
request, call a builder and render. Every percentile a page shows comes from the rollups.
Freshness and budget colours are the task's own rules (Task.is_fresh, Task.budget_status).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Concatenate, ParamSpec

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponseBase
from django.utils import timezone

from monitor.models import GENERATED_SPAN_KEY, GRAIN_DAY, GRAIN_HOUR, GeneratedSpan
from monitor.pages.http import HtmxHttpRequest
from monitor.stats import rollups

P = ParamSpec("P")
View = Callable[Concatenate[HtmxHttpRequest, P], HttpResponseBase]


def may_read(request: HtmxHttpRequest) -> bool:
    """Read-only pages need a login unless PUBLIC_READONLY_PAGES (read at request time)."""
    return bool(settings.PUBLIC_READONLY_PAGES or request.user.is_authenticated)


def readonly_page(view: View[P]) -> View[P]:
    """@login_required, except when the deployment made read-only pages public."""

    @functools.wraps(view)
    def wrapper(request: HtmxHttpRequest, *args: P.args, **kwargs: P.kwargs) -> HttpResponseBase:
        if not may_read(request):
            return redirect_to_login(request.get_full_path())
        return view(request, *args, **kwargs)

    return wrapper  # type: ignore[return-value]  # functools.wraps keeps the signature


@dataclass(frozen=True)
class Range:
    """A time window a page can show: its key in the URL, its length, the rollup grain of
    its chart points."""

    key: str
    label: str
    length: timedelta
    series_grain: str

    def since(self, now: datetime) -> datetime:
        return now - self.length

    @property
    def stats_grain(self) -> str:
        return rollups.grain_for(self.length)


RANGES: dict[str, Range] = {
    r.key: r
    for r in (
        Range("24h", "24 h", timedelta(hours=24), GRAIN_HOUR),
        Range("7d", "7 d", timedelta(days=7), GRAIN_HOUR),
        Range("30d", "30 d", timedelta(days=30), GRAIN_DAY),
    )
}
DEFAULT_RANGE = "24h"


def parse_range(
    params: Mapping[str, str],
    default: str = DEFAULT_RANGE,
    *,
    not_before: datetime | None = None,
    now: datetime | None = None,
) -> Range:
    """The window the URL asks for; with `not_before` (generated demo history hidden), cut to
    start there, read hourly (the history ends on an hour: no hourly row mixes the two)."""
    window = RANGES.get(params.get("range", default), RANGES[default])
    if not_before is None:
        return window
    now = now or timezone.now()
    if now - window.length >= not_before:
        return window
    length = max(now - not_before, timedelta(minutes=1))
    return Range(window.key, window.label, length, GRAIN_HOUR)


# Generated demo history (monitor.demo_history): every page that shows it says so, and a
# reader can leave it out (a cookie, so the choice follows them from page to page).
HIDE_GENERATED_COOKIE = "rw_hide_generated"


@dataclass(frozen=True)
class DemoHistory:
    """The generated history's span (first and last generated result), and whether this
    reader hides it."""

    start: datetime
    last: datetime
    hidden: bool

    @property
    def end(self) -> datetime:
        """The first hour with no generated result: hourly rollups from here on hold measured
        probes only. Pages that read rollups start here when the history is hidden."""
        return rollups.bucket_start(self.last, GRAIN_HOUR) + timedelta(hours=1)

    @property
    def not_before(self) -> datetime | None:
        return self.end if self.hidden else None


def demo_history(request: HttpRequest | None = None) -> DemoHistory | None:
    """None unless the database holds generated history (one row read; kept per request)."""
    cached: DemoHistory | bool | None = (
        getattr(request, "_rw_demo_history", False) if request is not None else False
    )
    if cached is not False:
        return cached if isinstance(cached, DemoHistory) else None
    # One row (GeneratedSpan), not a search of the results' partitions.
    span = GeneratedSpan.objects.filter(pk=GENERATED_SPAN_KEY).first()
    info = None
    if span is not None:
        hidden = bool(request is not None and request.COOKIES.get(HIDE_GENERATED_COOKIE))
        info = DemoHistory(start=span.start, last=span.last, hidden=hidden)
    if request is not None:
        request._rw_demo_history = info  # type: ignore[attr-defined]
    return info


def hidden_before(request: HttpRequest) -> datetime | None:
    """The time before which the rollup pages leave results out (generated history hidden)."""
    info = demo_history(request)
    return info.not_before if info else None


def hidden_until(request: HttpRequest) -> datetime | None:
    """The last generated result's time, when the reader hides them (raw rows: the probe log
    and its exports leave out generated rows, and need not read before this)."""
    info = demo_history(request)
    return info.last if info and info.hidden else None


def parse_int(value: str | None) -> int | None:
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        return None
