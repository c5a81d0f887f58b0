"""The probe log's rows are written in Python (monitor.templatetags.rw_pages.log_row_html) for
their CPU: byte for byte what front/rows/log_row.html renders from the same values, escaping
included, in every branch of the row."""

from __future__ import annotations

import itertools
from typing import Any

from django.template.loader import get_template
from django.utils.safestring import mark_safe

from monitor.templatetags.rw_pages import log_row_html

HOSTILE = "<script>alert('x')</script> & \"quoted\""


def _values(**over: Any) -> dict[str, Any]:
    # Every value with a character to escape: a value written unescaped fails the test.
    values: dict[str, Any] = {
        "outcome": "ok<",
        "pk": "12<3",
        "at_iso": "2026-11-28T05:00:01&+00:00",
        "at": "11-28 <05>:00:01",
        "generated": False,
        "task_href": "/tasks/t0/?a=1&b=<2>",
        "task_name": "Chat <short>",
        "route_href": '/routes/7/?a=1&b="2"',
        "route": "Provider & Co / model\"x'",
        "region": "eu-west & <b>",
        "ok": True,
        "error_kind": "",
        "quality_pass": None,
        "ttft": "1,234 <ms>",
        "e2e": "2.5 & s",
        "tps": '87 "tok/s"',
        "output_tokens": "1'024",
        "cached": "5<12>",
        "http_version": "2<",
        "error_detail": "",
        "text": HOSTILE,
    }
    return values | over


def test_every_branch_of_the_row_matches_the_template() -> None:
    template = get_template("front/rows/log_row.html")
    branches = itertools.product(
        (False, True),  # generated
        ("/tasks/t0/", ""),  # a task's probe, or ad hoc
        (True, False),  # ok, or an error kind
        (None, True, False),  # quality verdict
        (None, "5<12>"),  # cached tokens reported or not
        ("", HOSTILE),  # error detail
    )
    count = 0
    for generated, task_href, ok, quality, cached, detail in branches:
        values = _values(
            generated=generated,
            task_href=task_href,
            ok=ok,
            outcome="ok" if ok else "error",
            error_kind="" if ok else "timeout<b>",
            quality_pass=quality,
            cached=cached,
            error_detail=detail,
        )
        assert log_row_html(values) == template.render(values), values
        count += 1
    assert count == 2 * 2 * 2 * 3 * 2 * 2


def test_values_are_escaped_as_the_template_escapes_them() -> None:
    """Text from a provider is escaped; a value already marked safe is not escaped twice."""
    template = get_template("front/rows/log_row.html")
    values = _values(text=HOSTILE, ttft=mark_safe("1&nbsp;ms"))
    html = log_row_html(values)
    assert html == template.render(values)
    assert "<script>" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quoted&quot;" in html
    assert "1&nbsp;ms" in html
