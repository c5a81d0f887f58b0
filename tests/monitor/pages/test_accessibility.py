"""Every page for everyone, in Chromium against the production web stack: axe-core with all
of its rules at 1280 px (a laptop) and 390 px (a phone), 0 critical and 0 serious violations;
every table as wide as its card or narrower (no column hidden off the side), the admin's
provider, route and task forms included; a skip link; focus and scroll position kept across
the overview's refresh and the filter swaps. Screenshots go to test-artifacts/a11y-*.png."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from playwright.sync_api import Browser, BrowserContext, Page
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from monitor.models import EvalCase, Task
from simulator.testing import SimulatorProcess
from tests.browser import ROOT, artifact
from tests.monitor.conftest import World
from tests.monitor.pages.test_browser import _races, browser, server, world  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXE = ROOT / "static" / "vendor" / "axe-core-4.14.1" / "axe.min.js"
WIDTHS = {"laptop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}


def _context(
    chromium: Browser, base_url: str, user: User | None, viewport: dict[str, int]
) -> BrowserContext:
    # bypass_csp: the pages forbid inline scripts, and axe-core is injected as one.
    context = chromium.new_context(viewport=viewport, bypass_csp=True)  # type: ignore[arg-type]
    if user is not None:
        client = Client()
        client.force_login(user)
        cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
        context.add_cookies(
            [{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": base_url}]
        )
    return context


def _open(page: Page, url: str) -> None:
    response = page.goto(url)
    assert response is not None, url
    assert response.status == 200, (url, response.status)
    try:
        page.wait_for_load_state("networkidle", timeout=10_000)
    except PlaywrightTimeoutError:
        # Seen on the admin forms on a machine at load 17 (2 cores): the page has loaded
        # (goto waits for "load"); a request still open does not change what axe reads.
        page.wait_for_load_state("load")
    page.wait_for_function(
        "() => !window.Chart || [...document.querySelectorAll('canvas[data-chart]')]"
        ".every((c) => Chart.getChart(c))",
        timeout=15_000,  # a busy machine: Swagger UI's first render takes seconds
    )
    if page.locator("#api-docs").count():
        # Swagger UI draws the description after fetching it.
        page.wait_for_selector("#api-docs .opblock", timeout=15_000)


def serious_violations(page: Page) -> list[dict[str, Any]]:
    """axe-core with every rule it has (experimental and off-by-default ones too), keeping
    the critical and serious violations."""
    page.add_script_tag(path=str(AXE))
    found: list[dict[str, Any]] = page.evaluate(
        """async () => {
            const ids = axe.getRules().map((r) => r.ruleId);
            const r = await axe.run(document, {runOnly: {type: 'rule', values: ids},
                                               resultTypes: ['violations']});
            return r.violations
                .filter((v) => v.impact === 'critical' || v.impact === 'serious')
                .map((v) => ({id: v.id, impact: v.impact, count: v.nodes.length,
                              nodes: v.nodes.slice(0, 3).map((n) => n.target.join(' '))}));
        }"""
    )
    return found


def hidden_columns(page: Page) -> list[str]:
    """Tables wider than the box they sit in (a column off the side, reached only by
    scrolling), and the page itself wider than the window."""
    found: list[str] = page.evaluate(
        """() => {
            const out = [];
            document.querySelectorAll('table').forEach((t, i) => {
                if (!t.offsetParent) return;
                const box = t.parentElement;
                const name = t.id || t.className || 'table ' + i;
                const table = t.getBoundingClientRect(), outer = box.getBoundingClientRect();
                if (table.right > outer.right + 1 || box.scrollWidth > box.clientWidth + 1) {
                    out.push(name + ': ' + Math.round(table.width) + ' px in ' + box.clientWidth);
                }
                if (table.right > window.innerWidth + 1) out.push(name + ' past the window');
            });
            const doc = document.documentElement;
            if (doc.scrollWidth > doc.clientWidth + 1) out.push('page: ' + doc.scrollWidth);
            return out;
        }"""
    )
    return found


def _problems(page: Page, name: str, width: str) -> list[Any]:
    """What axe-core and the width check find on the page (every page is checked before
    the test fails, so one run lists them all)."""
    page.screenshot(path=artifact(f"a11y-{name}-{width}.png"), full_page=True)
    found: list[Any] = [(name, width, v) for v in serious_violations(page)]
    found += [(name, width, h) for h in hidden_columns(page)]
    return found


@pytest.fixture
def admin_user(django_user_model: type[User]) -> User:
    return django_user_model.objects.create_superuser("admin", "admin@example.com", "pw-admin-1")


@pytest.fixture
def pages(world: World, admin_user: User) -> dict[str, str]:  # noqa: F811
    _races(world)
    # A bar the simulated routes can meet, so the overview has its widest rows: winners with
    # their why, runner-up, intervals and counts (the test simulator fails often).
    Task.objects.filter(pk=world.task.pk).update(min_pass_rate=None, max_error_rate=0.6)
    # An eval case for the JSON schema grader beside the numeric ones (no schema): the
    # editor shows each with its own fields.
    EvalCase.objects.create(
        task=world.task,
        name="shape",
        input="Reply with JSON",
        grader="json_schema",
        json_schema={"type": "object"},
    )
    fast = world.routes["fast-small"]
    return {
        "overview": "/",
        "task": f"/tasks/{world.task.slug}/",
        "route": f"/routes/{fast.pk}/?task={world.task.slug}",
        "regions": "/regions/",
        "log": "/log/",
        "races": "/races/",
        "status": "/status/",
        "digest-settings": "/digest/",
        "digest-preview": "/digest/preview/",
        "api-docs": "/api/v1/docs",
        "admin-provider": f"/admin/monitor/provider/{fast.provider.pk}/change/",
        "admin-route": f"/admin/monitor/route/{fast.pk}/change/",
        "admin-task": f"/admin/monitor/task/{world.task.pk}/change/",
    }


def test_every_page_passes_axe_with_all_rules_and_hides_no_column_at_1280_and_390_px(
    browser: Browser,  # noqa: F811
    server: str,  # noqa: F811
    pages: dict[str, str],
    admin_user: User,
) -> None:
    problems: list[Any] = []
    for width, viewport in WIDTHS.items():
        context = _context(browser, server, admin_user, viewport)
        try:
            for name, path in pages.items():
                page = context.new_page()  # a fresh tab each: nothing left over from the last
                _open(page, server + path)
                problems += _problems(page, name, width)
                page.close()
        finally:
            context.close()
        anonymous = _context(browser, server, None, viewport)
        try:
            page = anonymous.new_page()
            _open(page, server + "/accounts/login/")
            problems += _problems(page, "login", width)
        finally:
            anonymous.close()
    assert problems == [], "\n".join(str(p) for p in problems)


def test_the_task_form_edits_eval_cases_in_a_layout_that_fits_with_every_field_labelled(
    browser: Browser,  # noqa: F811
    server: str,  # noqa: F811
    pages: dict[str, str],
    admin_user: User,
) -> None:
    context = _context(browser, server, admin_user, WIDTHS["laptop"])
    try:
        page = context.new_page()
        _open(page, server + pages["admin-task"])
        cases = list(EvalCase.objects.order_by("pk"))
        assert len(cases) == 3
        for i, case in enumerate(cases):
            schema = page.locator(f'textarea[name="eval_cases-{i}-json_schema"]')
            # An empty schema is shown empty, not as `null`; a schema as its JSON.
            expected = "" if case.json_schema is None else '{"type": "object"}'
            assert schema.input_value() == expected, case.name
            # Every field of the case has a label naming it.
            for field in ("name", "input", "grader", "expected", "tolerance", "json_schema"):
                control = page.locator(f'[name="eval_cases-{i}-{field}"]')
                control_id = control.get_attribute("id")
                assert page.locator(f'label[for="{control_id}"]').count() == 1, (i, field)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= WIDTHS["laptop"]["width"], width
        # Saving unchanged keeps the empty schemas empty (not the JSON value null).
        page.click('input[name="_continue"]')
        page.wait_for_load_state("networkidle")
        assert page.locator(".errornote").count() == 0, page.inner_text("#content")[:2000]
        assert [c.json_schema for c in EvalCase.objects.order_by("pk")] == [
            None,
            None,
            {"type": "object"},
        ]
    finally:
        context.close()


def test_a_skip_link_leads_to_the_content(
    browser: Browser,  # noqa: F811
    server: str,  # noqa: F811
    pages: dict[str, str],
    admin_user: User,
) -> None:
    context = _context(browser, server, admin_user, WIDTHS["laptop"])
    try:
        page = context.new_page()
        _open(page, server + pages["task"])
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent.trim()") == "Skip to content"
        assert page.locator(".skip-link").is_visible()
        page.keyboard.press("Enter")
        assert page.evaluate("document.activeElement.id") == "main"
    finally:
        context.close()


def _focused(page: Page) -> dict[str, Any]:
    result: dict[str, Any] = page.evaluate(
        """() => ({tag: document.activeElement.tagName,
                   href: document.activeElement.getAttribute('href'),
                   active: document.activeElement.classList.contains('active'),
                   y: window.scrollY})"""
    )
    return result


def test_focus_and_scroll_survive_the_overview_refresh_and_the_filter_swaps(
    browser: Browser,  # noqa: F811
    server: str,  # noqa: F811
    pages: dict[str, str],
    admin_user: User,
    simulator: SimulatorProcess,
) -> None:
    # A short window, so the page scrolls.
    context = _context(browser, server, admin_user, {"width": 1280, "height": 420})
    try:
        page = context.new_page()
        _open(page, server + pages["overview"])
        link = page.locator("#overview-body td.route a").last
        link.focus()
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        before = _focused(page)
        assert before["tag"] == "A", before
        assert before["y"] > 0, before
        # The server refreshes the overview every second (fixture `server`). Where focus and
        # scroll stand is read when each refresh has settled (htmx:afterSettle, after the
        # page's own handlers): not whenever the test looks, which may fall inside a swap.
        page.evaluate(
            """() => { window.__settled = [];
                document.addEventListener('htmx:afterSettle', () => window.__settled.push({
                    tag: document.activeElement.tagName,
                    href: document.activeElement.getAttribute('href'),
                    active: document.activeElement.classList.contains('active'),
                    y: window.scrollY,
                    at: document.querySelector('#overview-body').dataset.renderedAt})); }"""
        )
        first = page.get_attribute("#overview-body", "data-rendered-at")
        page.wait_for_function(
            "(first) => window.__settled.some(s => s.at !== first)", arg=first, timeout=10_000
        )
        settled = page.evaluate("window.__settled")
        assert settled
        assert all({k: v for k, v in s.items() if k != "at"} == before for s in settled), settled

        # A filter chosen from the keyboard: focus stays on it, now the active one.
        _open(page, server + pages["task"])
        chip = page.locator('#task-body a.chip[data-region="us-east"]')
        chip.focus()
        page.keyboard.press("Enter")
        page.wait_for_selector('#task-body a.chip.active[data-region="us-east"]')
        page.wait_for_load_state("networkidle")
        now = _focused(page)
        assert now["tag"] == "A", now
        assert now["active"], now
        assert "region=us-east" in (now["href"] or ""), now
    finally:
        context.close()


def test_the_api_docs_render_the_description_under_the_pages_csp(
    browser: Browser,  # noqa: F811
    server: str,  # noqa: F811
    admin_user: User,
    db: None,
) -> None:
    context = browser.new_context(viewport=WIDTHS["laptop"])  # type: ignore[arg-type]
    client = Client()
    client.force_login(admin_user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": server}])
    errors: list[str] = []
    requests: list[str] = []
    try:
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        _open(page, server + "/api/v1/docs")
        paths = page.locator("#api-docs .opblock-summary-path").all_inner_texts()
        assert "/tasks/{slug}/route" in " ".join(paths), paths
        assert errors == []
        assert all(url.startswith(server) for url in requests), requests
    finally:
        context.close()
