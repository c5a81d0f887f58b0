"""Issue 33 item 7: the quality-vs-speed scatter reads when routes are far apart. In Chromium,
on the production web stack: a linear speed axis while the routes are within 10x of each
other, a logarithmic one (and an axis title that says so) once they span more than 10x."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from playwright.sync_api import Browser

from monitor.models import Task
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f
from tests.monitor.pages.test_browser import LAPTOP, Session, browser, server  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PROBES = 25  # per route: enough for the task's latency figure and its pass rate


def _task(slug: str, e2e_ms: list[float]) -> Task:
    """A task whose routes' e2e p50 are `e2e_ms`, every probe passing its eval case."""
    p = f.provider(f"prov-{slug}")
    routes = [f.route(p, f"{slug}-m{i}") for i in range(len(e2e_ms))]
    region = f.region(f"{slug}-region")
    task = f.task(slug, routes, [region], min_pass_rate=0.5)
    now = timezone.now().replace(second=0, microsecond=0)
    batch = []
    for route, ms in zip(routes, e2e_ms, strict=True):
        for i in range(PROBES):
            at = now - timedelta(minutes=2 * i + 1)
            batch.append(
                f.payload(task, route, region, at, e2e_ms=ms, ttft_ms=ms / 4, quality_pass=True)
            )
    assert ingest.ingest(batch) == len(batch)
    return task


@pytest.fixture
def session(browser: Browser, server: str, teammate: User) -> Iterator[Session]:  # noqa: F811
    s = Session(browser, server, teammate, LAPTOP)
    yield s
    s.close()


def _x_axis(session: Session, slug: str) -> tuple[dict[str, Any], list[float]]:
    session.open(f"/tasks/{slug}/")
    session.chart("scatter-chart")  # drawn
    axis: dict[str, Any] = session.page.evaluate(
        """() => { const c = Chart.getChart(document.getElementById('scatter-chart'));
                   const x = c.scales.x;
                   return {type: x.type, title: c.options.scales.x.title.text,
                           min: x.min, max: x.max}; }"""
    )
    xs = [p["x"] for p in session.json_data("scatter-data")["points"]]
    assert session.errors == [], session.errors
    return axis, xs


def test_a_20x_spread_gets_a_log_axis_that_says_so_and_a_3x_spread_a_linear_one(
    session: Session,
) -> None:
    _task("wide", [400.0, 900.0, 8000.0])
    _task("narrow", [1000.0, 2000.0, 3000.0])

    axis, xs = _x_axis(session, "wide")
    assert max(xs) / min(xs) == pytest.approx(20, rel=0.1)  # histogram estimates: near 20x
    assert axis["type"] == "logarithmic", axis
    assert axis["title"].endswith(", log scale"), axis
    assert axis["title"] == "e2e p50 (s), log scale", axis
    assert axis["min"] <= min(xs)
    assert axis["max"] >= max(xs)

    axis, xs = _x_axis(session, "narrow")
    assert max(xs) / min(xs) == pytest.approx(3, rel=0.1)
    assert axis["type"] == "linear", axis
    assert "log" not in axis["title"], axis
    assert axis["min"] == 0  # a linear speed axis starts at zero
