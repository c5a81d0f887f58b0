"""The table rows rendered from templates (monitor.templatetags.rw_pages): their values are
escaped once, in Python, so the row templates only place them (issue 33's task page CPU)."""

from __future__ import annotations

import cProfile
import pstats
from html import escape

from django.http import QueryDict
from django.utils import timezone

from monitor.models import ProbeResult
from monitor.pages import task as pages_task
from monitor.pages.common import parse_range
from monitor.templatetags import rw_pages
from tests.monitor.conftest import World


def _lazy_escapes(profile: cProfile.Profile) -> int:
    """Calls of Django's escape (behind its lazy-string wrapper): what the template's
    autoescape runs for each value that is not already safe."""
    return sum(
        stat[1]
        for (path, _, name), stat in pstats.Stats(profile).stats.items()  # type: ignore[attr-defined]
        if path.endswith("django/utils/html.py") and name == "escape"
    )


def test_ranked_and_log_rows_escape_each_value_once_and_leave_the_template_nothing_to_escape(
    probed_world: World,
) -> None:
    hostile = "<b onclick=\"x()\">fast & 'small'</b>"
    fast = probed_world.routes["fast-small"]
    fast.display_name = hostile
    fast.save()
    ProbeResult.objects.filter(route=fast).update(text=hostile)
    task = probed_world.task
    page = pages_task.build(task, None, parse_range(QueryDict("")), {}, timezone.now())
    results = list(
        ProbeResult.objects.filter(route=fast).select_related("task", "route__provider", "region")[
            :5
        ]
    )
    assert page.rows
    assert results

    profile = cProfile.Profile()
    profile.enable()
    ranked = [rw_pages.ranked_row(row, task, None) for row in page.rows]
    logged = [rw_pages.log_row(r) for r in results]
    profile.disable()

    # Escaped once (not twice: no "&amp;lt;"), and no raw markup from the data.
    shown = escape(hostile)
    row = next(html for html in ranked if f'data-route="{fast.pk}"' in html)
    for html in (row, *logged):
        assert shown in html
        assert "<b onclick" not in html
        assert "&amp;lt;" not in html
        assert "&amp;amp;" not in html
    # The numbers the template places are text already: "1", not a localized number.
    assert "<td>1</td>" in ranked[0]
    # The templates escaped nothing themselves: per value, their autoescape's lazy escape
    # took more of a row's time than the row's own formatting.
    assert _lazy_escapes(profile) == 0
