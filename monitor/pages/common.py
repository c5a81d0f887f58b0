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
from django.http import HttpResponseBase

from monitor.models import GRAIN_DAY, GRAIN_HOUR
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


def parse_range(params: Mapping[str, str], default: str = DEFAULT_RANGE) -> Range:
    return RANGES.get(params.get("range", default), RANGES[default])


def parse_int(value: str | None) -> int | None:
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        return None
