"""How the pages look to a new user, in Chromium at 1400 px: light and dark mode (from
prefers-color-scheme), AA colour contrast on every page (axe-core's color-contrast rule),
tables that fit or scroll inside their card, a loading indicator on htmx requests, the setup
checklist of an empty deployment, and the generated demo history plainly marked.
Screenshots of each page in both modes go to test-artifacts/look-<page>-<scheme>.png."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from playwright.sync_api import Browser, BrowserContext, Page

from monitor import demo_history
from monitor.management.commands.load_demo import DEMO_CONFIG
from monitor.models import Route
from simulator.config import load
from tests.browser import ROOT, artifact
from tests.monitor.pages.test_browser import browser, server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDE = {"width": 1400, "height": 1000}
SCHEMES = ("light", "dark")
AXE = ROOT / "static" / "vendor" / "axe-core-4.14.1" / "axe.min.js"


def _context(browser: Browser, base_url: str, user: User, scheme: str) -> BrowserContext:  # noqa: F811
    client = Client()
    client.force_login(user)
    # bypass_csp: the pages forbid inline scripts, and axe-core is injected as one.
    context = browser.new_context(viewport=WIDE, color_scheme=scheme, bypass_csp=True)  # type: ignore[arg-type]
    context.add_cookies(
        [
            {
                "name": settings.SESSION_COOKIE_NAME,
                "value": client.cookies[settings.SESSION_COOKIE_NAME].value,
                "url": base_url,
            }
        ]
    )
    return context


def _open(page: Page, url: str) -> None:
    response = page.goto(url)
    assert response is not None, url
    assert response.status == 200, url
    page.wait_for_load_state("networkidle")
    # Charts are drawn after load; wait for every canvas to have its chart.
    page.wait_for_function(
        "() => !window.Chart || [...document.querySelectorAll('canvas[data-chart]')]"
        ".every((c) => Chart.getChart(c))",
        timeout=5000,
    )


def contrast_violations(page: Page) -> list[dict[str, Any]]:
    """axe-core's color-contrast rule (WCAG AA: 4.5:1, 3:1 for large text) on the page."""
    page.add_script_tag(path=str(AXE))
    violations: list[dict[str, Any]] = page.evaluate(
        """async () => {
            const r = await axe.run(document, {runOnly: {type: 'rule', values: ['color-contrast']}});
            return r.violations.flatMap((v) => v.nodes.map((n) => ({
                target: n.target.join(' '), summary: n.failureSummary})));
        }"""
    )
    return violations


def overflowing_cards(page: Page) -> list[str]:
    """Cards whose content is wider than the card (a table that neither fits nor scrolls
    inside its own .table-wrap), and the page itself scrolling sideways."""
    result: list[str] = page.evaluate(
        """() => {
            const out = [];
            document.querySelectorAll('.card, .empty, .demo-banner').forEach((card, i) => {
                if (card.scrollWidth > card.clientWidth + 1) {
                    out.push((card.querySelector('h2')?.textContent || card.className + i).trim()
                             + ': ' + card.scrollWidth + ' > ' + card.clientWidth);
                }
            });
            const doc = document.documentElement;
            if (doc.scrollWidth > doc.clientWidth + 1) out.push('page: ' + doc.scrollWidth);
            return out;
        }"""
    )
    return result


def _check(page: Page, name: str, scheme: str) -> None:
    page.screenshot(path=artifact(f"look-{name}-{scheme}.png"), full_page=True)
    assert contrast_violations(page) == [], (name, scheme)
    assert overflowing_cards(page) == [], (name, scheme)


@pytest.fixture
def contexts(browser: Browser, server: str, teammate: User) -> Iterator[dict[str, Page]]:  # noqa: F811
    opened = {scheme: _context(browser, server, teammate, scheme) for scheme in SCHEMES}
    try:
        yield {scheme: context.new_page() for scheme, context in opened.items()}
    finally:
        for context in opened.values():
            context.close()


def test_a_new_user_sees_a_setup_checklist_then_every_page_with_marked_demo_history(
    server: str,  # noqa: F811
    contexts: dict[str, Page],
) -> None:
    # A fresh deployment: the overview is a checklist with live status, not one sentence.
    for scheme, page in contexts.items():
        _open(page, server + "/")
        steps = page.locator("[data-setup-checklist] li[data-step]")
        assert steps.count() == 5
        assert page.locator("[data-step=providers] .badge").inner_text() == "to do"
        assert page.locator("[data-step=providers] a").get_attribute("href") == (
            "/admin/monitor/provider/"
        )
        _check(page, "setup", scheme)

    call_command("load_demo", "--simulator", "http://127.0.0.1:8100")
    # Two days are enough for every page (a week takes longer than this test needs).
    written = demo_history.generate(load(DEMO_CONFIG), days=2)
    assert written > 10_000
    route = Route.objects.get(model_id="wafer-llama-70b")
    # At once (before live probes would take over): winners with figures for each task (a
    # region may still have none when no route meets its bars: the product's own verdict).
    _open(contexts["light"], server + "/")
    assert contexts["light"].locator("[data-setup-checklist]").count() == 0
    for task in ("support-answer", "document-summary"):
        assert contexts["light"].locator(f"[data-task={task}] td.route a").count() >= 2, task
    pages = {
        "overview": "/",
        "task": "/tasks/support-answer/",
        "route": f"/routes/{route.pk}/?task=support-answer",
        "regions": "/regions/",
        "log": "/log/",
        "races": "/races/?task=support-answer",
        "digest": "/digest/preview/",
    }
    for scheme, page in contexts.items():
        for name, path in pages.items():
            _open(page, server + path)
            marker = "[data-generated-banner]"
            assert page.locator(marker).count() == 1, (name, scheme)
            assert "generated demo history" in page.locator(marker).inner_text().lower()
            _check(page, name, scheme)
        # Dark mode is the page's own colours, not the browser's defaults (the digest
        # preview is an email, with its own inline light colours).
        _open(page, server + "/")
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == ("rgb(247, 248, 250)" if scheme == "light" else "rgb(15, 23, 42)")

    page = contexts["light"]
    # Chart axes say their time zone.
    _open(page, server + pages["route"])
    title = page.evaluate(
        "() => Chart.getChart(document.querySelector('canvas[data-chart=series]'))"
        ".options.scales.x.title.text"
    )
    assert "UTC" in title
    # The demo's 24 h chart shows the tail from the first start, not only its median: the
    # history's last day and a half is probed every 5 minutes, as a team's would be.
    drawn = page.evaluate(
        """() => Object.fromEntries(Chart.getChart('chart-e2e').data.datasets.map((d) => [
            d.label, d.data.filter((v) => v !== null && (v.y ?? v) !== null).length]))"""
    )
    assert min(drawn[line] for line in ("p50", "p95", "p99")) > 20, drawn
    # An htmx request shows the loading indicator while it is in flight.
    _open(page, server + "/")
    during = page.evaluate(
        """() => {
            document.querySelector('a.button[hx-get]').click();
            return document.getElementById('loading').classList.contains('htmx-request');
        }"""
    )
    assert during is True
    page.wait_for_function(
        "() => !document.getElementById('loading').classList.contains('htmx-request')"
    )
    page.evaluate("document.getElementById('loading').classList.add('htmx-request')")
    page.wait_for_function(
        "() => getComputedStyle(document.getElementById('loading')).opacity === '1'"
    )
    # Hiding the generated history: the overview has nothing measured to rank yet.
    page.click("text=Hide generated history")
    page.wait_for_load_state("networkidle")
    assert "Generated demo history hidden" in page.inner_text("[data-generated-banner]")
    assert page.locator("td.route a").count() == 0
    assert Path(artifact("look-overview-dark.png")).stat().st_size > 10_000
