"""The pages in Chromium, against a live server over loopback, fed by real probes of the
simulator (conftest). Screenshots go to test-artifacts/dashboard-*.png."""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone
from playwright.sync_api import Browser, BrowserContext, Dialog, Page

from monitor.models import ProbeResult, RaceRun
from monitor.pages.whatif import Scenario, estimate
from simulator.testing import SimulatorProcess, free_port
from tests import support
from tests.browser import artifact, chromium
from tests.monitor.conftest import World, configure, probe_and_ingest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
LAPTOP = {"width": 1366, "height": 900}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Playwright's sync API keeps an event loop in this thread; the ORM calls the tests make
    # beside it are still plain synchronous calls, so Django's async guard does not apply.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with chromium() as b:
            yield b
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def server(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The production web stack (gunicorn, WhiteNoise, the middleware) on a free loopback
    port, on the test database; the overview refreshes every second."""
    with django_db_blocker.unblock():
        env = support.child_env(connection.settings_dict, DASHBOARD_REFRESH_SECONDS="1")
    port = free_port()
    log = tmp_path_factory.mktemp("web") / "gunicorn.log"
    proc = support.start(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "monitor.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
            "--threads",
            "4",
        ],
        env,
        log,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        assert support.wait_until(up, 30), log.read_text()[-2000:]
        yield url
    finally:
        support.stop(proc)


class Session:
    """A logged-in browser tab that records console errors, page errors and requests."""

    def __init__(self, browser: Browser, base_url: str, user: User, viewport: dict[str, int]):
        client = Client()
        client.force_login(user)
        self.base_url = base_url
        self.context: BrowserContext = browser.new_context(viewport=viewport)  # type: ignore[arg-type]
        self.context.add_cookies(
            [
                {
                    "name": settings.SESSION_COOKIE_NAME,
                    "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
                    "url": base_url,
                }
            ]
        )
        self.page: Page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on(
            "response",
            lambda r: self.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None,
        )
        self.page.on("dialog", self._dialog)

    def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, path: str) -> Page:
        response = self.page.goto(self.base_url + path)
        assert response is not None
        assert response.status == 200, (path, response.status)
        self.page.wait_for_load_state("networkidle")
        return self.page

    def chart(self, canvas_id: str) -> dict[str, Any]:
        # After an htmx swap, charts are drawn once the new content has settled.
        self.page.wait_for_function(
            "(id) => window.Chart && Chart.getChart(document.getElementById(id))",
            arg=canvas_id,
            timeout=5000,
        )
        data: dict[str, Any] = self.page.evaluate(
            """(id) => {
                const chart = Chart.getChart(document.getElementById(id));
                if (!chart) return null;
                return {type: chart.config.type, labels: chart.data.labels,
                        datasets: chart.data.datasets.map(d => ({label: d.label, data: d.data}))};
            }""",
            canvas_id,
        )
        assert data is not None, (
            f"no chart drawn on #{canvas_id}",
            self.page.url,
            self.page.inner_text("main")[:1500],
            self.errors,
        )
        return data

    def json_data(self, element_id: str) -> Any:
        return self.page.evaluate(
            "(id) => JSON.parse(document.getElementById(id).content.querySelector('script').textContent)",
            element_id,
        )

    def mark(self) -> None:
        """A marker that only survives if the page is never reloaded."""
        self.page.evaluate("window.__rwMarker = 'still here'")

    def marked(self) -> bool:
        return bool(self.page.evaluate("window.__rwMarker === 'still here'"))

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def session(browser: Browser, server: str, teammate: User) -> Iterator[Session]:
    s = Session(browser, server, teammate, LAPTOP)
    yield s
    s.close()


@pytest.fixture
def world(simulator: SimulatorProcess) -> World:
    world = configure(simulator.base_url)
    probe_and_ingest(world, simulator.base_url)
    return world


def _races(world: World) -> None:
    fast, mid = world.routes["fast-small"], world.routes["claudish-mid"]
    now = timezone.now()
    for i in range(6):
        winner, loser = (fast, mid) if i % 3 else (mid, fast)
        RaceRun.objects.create(
            task=world.task,
            region=world.regions[i % 2],
            slot_at=now - timedelta(minutes=i + 1),
            deadline_at=now,
            status="done",
            started_at=now - timedelta(minutes=i + 1),
            winner=winner,
            winner_ms=180.0 + i,
            lanes={
                str(winner.pk): {
                    "elapsed_ms": 180.0,
                    "tokens_paid": 50,
                    "saved_ms": 0.0,
                    "outcome": "ok",
                },
                str(loser.pk): {
                    "elapsed_ms": 180.0,
                    "cancelled": True,
                    "tokens_paid": 12,
                    "saved_ms": 90.0,
                    "outcome": "ok",
                },
            },
            loser_tokens=12,
            loser_cost_usd=Decimal("0.00005"),
        )


def test_every_page_loads_without_console_errors_and_draws_its_charts(
    session: Session, world: World, browser: Browser, server: str, teammate: User
) -> None:
    _races(world)
    fast = world.routes["fast-small"]
    pages = {
        "overview": "/",
        "task": f"/tasks/{world.task.slug}/",
        "route": f"/routes/{fast.pk}/?task={world.task.slug}",
        "regions": "/regions/",
        "log": "/log/",
        "races": "/races/",
    }
    for name, path in pages.items():
        session.open(path)
        session.page.screenshot(path=artifact(f"dashboard-{name}.png"), full_page=True)
        assert session.errors == [], (name, session.errors)

    session.open(pages["task"])
    scatter = session.chart("scatter-chart")
    source = session.json_data("scatter-data")
    by_label = {d["label"]: d["data"] for d in scatter["datasets"]}
    assert set(by_label) == {
        "fastest qualifying",
        "qualifies",
        "below the bar / not qualifying",
        "quality bar",
    }
    plotted = (
        by_label["fastest qualifying"]
        + by_label["qualifies"]
        + by_label["below the bar / not qualifying"]
    )
    assert sorted(p["route_id"] for p in plotted) == sorted(p["route_id"] for p in source["points"])
    assert len(by_label["fastest qualifying"]) == 1
    assert all(
        p["y"] < 80
        for p in by_label["below the bar / not qualifying"]
        if not p["qualifies"] and p["y"] < 80
    )
    assert {p["y"] for p in by_label["quality bar"]} == {80.0}
    # Hovering the winner shows its numbers in the tooltip.
    winner = by_label["fastest qualifying"][0]
    box = session.page.evaluate(
        """() => { const c = Chart.getChart(document.getElementById('scatter-chart'));
                   const el = c.getDatasetMeta(0).data[0]; const r = c.canvas.getBoundingClientRect();
                   return {x: r.left + el.x, y: r.top + el.y}; }"""
    )
    session.page.mouse.move(box["x"], box["y"])
    session.page.wait_for_function(
        "() => Chart.getChart(document.getElementById('scatter-chart')).tooltip.opacity > 0"
    )
    tooltip = session.page.evaluate(
        "() => Chart.getChart(document.getElementById('scatter-chart')).tooltip.body.flatMap(b => b.lines)"
    )
    assert tooltip[0] == winner["label"]
    assert any(line.startswith("TTFT p50:") for line in tooltip)

    session.open(pages["route"])
    series = support.unfold_series(session.json_data("series-data"))
    for canvas, key in (("chart-ttft", "ttft_ms"), ("chart-e2e", "e2e_ms"), ("chart-tps", "tps")):
        chart = session.chart(canvas)
        assert chart["labels"] == series["labels"]
        assert [d["label"] for d in chart["datasets"]] == ["p50", "p95", "p99"]
        for d in chart["datasets"]:
            assert d["data"] == series[key][d["label"]]
        assert any(v is not None for v in chart["datasets"][0]["data"])
    waterfall = session.chart("chart-waterfall")
    assert waterfall["labels"][-2:] == ["queue + prefill", "decode"]
    assert waterfall["datasets"][0]["data"] == [
        [s["start_ms"], s["end_ms"]] for s in session.json_data("waterfall-data")
    ]

    session.open(pages["races"])
    wins = session.chart("chart-wins")
    assert wins["labels"] == session.json_data("wins-data")["labels"]
    assert sorted(wins["datasets"][0]["data"]) == [33.3, 66.7]
    assert session.errors == []

    phone = Session(browser, server, teammate, PHONE)
    try:
        for name in ("overview", "task", "route"):
            page = phone.open(pages[name])
            page.screenshot(path=artifact(f"dashboard-{name}-phone.png"), full_page=True)
            # Nothing but the scrollable tables is wider than the phone.
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"] + 1, (name, width)
        assert phone.errors == []
    finally:
        phone.close()


def test_the_overview_refreshes_its_numbers_without_a_full_reload(
    session: Session, simulator: SimulatorProcess
) -> None:
    world = configure(simulator.base_url)
    # The server refreshes the overview every second (fixture `server`).
    page = session.open("/")
    assert "No probes yet" in page.inner_text("#freshness")
    assert page.locator('[data-metric="rank"]').count() == 0
    session.mark()
    probe_and_ingest(world, simulator.base_url)
    page.wait_for_selector('[data-metric="rank"]', timeout=15_000)
    assert "Last probe" in page.inner_text("#freshness")
    assert session.marked()
    first = page.get_attribute("#overview-body", "data-rendered-at")
    page.wait_for_function(
        "(first) => document.querySelector('#overview-body').dataset.renderedAt !== first",
        arg=first,
        timeout=10_000,
    )
    assert session.marked()
    # The winner's ranking figure, with its interval and sample count.
    cells = page.locator('[data-metric="rank"]').all_inner_texts()
    assert cells
    assert all(" ms" in c and "probes" in c for c in cells), cells
    page.screenshot(path=artifact("dashboard-overview-refreshed.png"), full_page=True)
    assert session.errors == []


def test_filters_and_range_selectors_update_the_page_in_place(
    session: Session, world: World
) -> None:
    fast = world.routes["fast-small"]
    page = session.open(f"/routes/{fast.pk}/?task={world.task.slug}")
    session.mark()
    hourly = session.chart("chart-ttft")["labels"]
    assert all(label.endswith(":00") for label in hourly)
    page.click('#route-body a[data-range="30d"]')
    page.wait_for_selector('#route-body a.chip.active[data-range="30d"]')
    daily = session.chart("chart-ttft")["labels"]
    assert daily
    assert all(len(label) == 10 and label[4] == "-" for label in daily)
    assert "range=30d" in page.url
    page.click('#route-body a[data-region="us-east"]')
    page.wait_for_selector('#route-body a.chip.active[data-region="us-east"]')
    assert "US East" in page.inner_text("#route-body h2")
    assert session.marked()

    page = session.open("/log/")
    session.mark()
    page.select_option('select[name="outcome"]', "error")
    page.wait_for_function("() => location.search.includes('outcome=error')")
    page.wait_for_load_state("networkidle")
    outcomes = page.eval_on_selector_all("#log tbody tr", "rows => rows.map(r => r.className)")
    assert outcomes
    assert set(outcomes) == {"outcome-error"}
    assert session.marked()
    page.select_option('select[name="outcome"]', "")
    page.wait_for_function("() => !location.search.includes('outcome=error')")
    page.wait_for_load_state("networkidle")
    first = page.eval_on_selector_all("#log tbody tr", "rows => rows.map(r => r.dataset.result)")
    page.click("#older")
    page.wait_for_function("() => location.search.includes('before=')")
    page.wait_for_load_state("networkidle")
    second = page.eval_on_selector_all("#log tbody tr", "rows => rows.map(r => r.dataset.result)")
    assert second
    assert not set(first) & set(second)
    assert session.marked()

    page = session.open("/regions/")
    session.mark()
    page.click('#matrix-body a[data-metric="tps_p50"]')
    page.wait_for_selector('#matrix-body a.chip.active[data-metric="tps_p50"]')
    assert "tok/s" in page.inner_text("#matrix")
    assert session.marked()
    assert session.errors == []


def test_the_what_if_reproduces_the_seeds_example(session: Session, world: World) -> None:
    page = session.open(f"/tasks/{world.task.slug}/")
    session.mark()
    for name, value in {
        "calls": "10",
        "input": "10000",
        "output": "500",
        "parallel": "1",
        "name_1": "gpt-oss-120b on Cerebras",
        "ttft_ms_1": "1620",
        "tps_1": "1823",
        "name_2": "GPT-5.5",
        "ttft_ms_2": "75100",
        "tps_2": "60",
    }.items():
        page.fill(f'#whatif input[name="{name}"]', value)
    page.click('#whatif button[type="submit"]')
    page.wait_for_selector('#whatif tr[data-whatif="GPT-5.5"]')
    page.wait_for_load_state("networkidle")
    fast = page.locator('#whatif tr[data-whatif="gpt-oss-120b on Cerebras"]')
    slow = page.locator('#whatif tr[data-whatif="GPT-5.5"]')
    assert fast.locator("td.total").inner_text() == "18.9 s"
    assert slow.locator("td.total").inner_text() == "13 min 54 s"
    # The measured routes beat both, so ratios are against the fastest measured route; the
    # ratio between the two typed-in routes is the seeds' 44x.
    fast_ms = int(fast.locator("td.total").get_attribute("data-total-ms") or 0)
    slow_ms = int(slow.locator("td.total").get_attribute("data-total-ms") or 0)
    seeds = Scenario(calls=10, input_tokens=10_000, output_tokens=500)
    assert fast_ms == round(estimate(seeds, 1620, 1823).total_ms)
    assert slow_ms == round(estimate(seeds, 75_100, 60).total_ms)
    assert round(slow_ms / fast_ms) == 44
    assert session.marked()
    page.locator("#whatif").screenshot(path=artifact("dashboard-whatif.png"))
    assert session.errors == []


HOSTILE = (
    '<script>window.__pwned = 1; alert("script")</script>'
    '<a hx-get="/pwned-htmx" hx-trigger="load" href="javascript:alert(2)">click</a>'
    '<img src="/pwned-img" onerror="window.__pwned = 2">'
)


def test_a_hostile_model_answer_renders_inert(session: Session, world: World) -> None:
    ProbeResult.objects.filter(outcome="ok").update(text=HOSTILE)
    ProbeResult.objects.filter(outcome="error").update(error_detail=HOSTILE[:400])
    fast = world.routes["fast-small"]
    fast.display_name = HOSTILE[:200]
    fast.save()
    for path in (
        "/log/",
        "/log/?outcome=error",
        "/",
        f"/tasks/{world.task.slug}/",
        f"/routes/{fast.pk}/",
    ):
        session.requests.clear()
        page = session.open(path)
        cells = page.locator("td.answer")
        if cells.count():
            # Shown as text, and clicking it does nothing.
            assert "<script>" in cells.first.inner_text()
            cells.first.locator("xpath=.").click()
            page.wait_for_timeout(300)
        page.wait_for_timeout(500)
        assert not any(
            "pwned" in url or url.startswith("javascript:") for url in session.requests
        ), session.requests
        own = [u for u in session.requests if u.startswith(session.base_url)]
        assert own == session.requests  # nothing left this origin
        assert page.evaluate("window.__pwned === undefined")
        assert page.locator("a[hx-get='/pwned-htmx'], img[src='/pwned-img']").count() == 0
    assert session.dialogs == []
    assert session.errors == []
    session.page.screenshot(path=artifact("dashboard-hostile-log.png"), full_page=True)
