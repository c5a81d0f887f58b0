"""The preview page: the logged-in user's own digest in the browser, and its screenshot."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from monitor.digest import sending
from monitor.models import Task
from tests.browser import artifact, chromium
from tests.monitor.digest.conftest import NOW, WEEK_END, Inbox, Scenario, html_of, subscribe

URL = "/digest/preview/"


def test_the_url_name_is_rw_digest_preview() -> None:
    assert reverse("rw-digest-preview") == URL


def test_the_preview_needs_a_login(client: Client, db: None) -> None:
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_the_preview_shows_the_users_digest_for_the_week_up_to_now(
    client: Client, scenario: Scenario, owner: User
) -> None:
    subscribe(owner)
    client.force_login(owner)
    with time_machine.travel(WEEK_END + timedelta(minutes=10), tick=False):
        response = client.get(URL)
    assert response.status_code == 200
    body = response.content.decode()
    assert "Preview: the week up to now" in body
    assert "Summarise" in body
    assert "22.5%" in body
    assert "$0.1120" in body
    assert "Unsubscribe" in body


def test_the_preview_shows_only_the_tasks_the_user_chose(
    client: Client, scenario: Scenario, owner: User
) -> None:
    other = Task.objects.create(name="Classify tickets", slug="classify", user_template="x")
    sub = subscribe(owner)
    sub.tasks.set([other])
    client.force_login(owner)
    body = client.get(URL).content.decode()
    assert "Classify tickets" in body
    assert "Summarise" not in body


def test_the_preview_works_before_the_user_has_subscribed(
    client: Client, scenario: Scenario, outsider: User
) -> None:
    client.force_login(outsider)
    body = client.get(URL).content.decode()
    assert "Summarise" in body  # no choice yet: every task
    assert "/digest/unsubscribe/" not in body  # nothing to unsubscribe from


def test_the_plain_text_preview_is_text(client: Client, scenario: Scenario, owner: User) -> None:
    client.force_login(owner)
    with time_machine.travel(WEEK_END + timedelta(minutes=10), tick=False):
        response = client.get(URL, {"format": "text"})
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert "== Summarise ==" in text
    assert "Probe spend: $0.1120 (last week $0.0840)" in text
    assert "<table" not in text


@pytest.mark.browser
def test_the_html_digest_renders_in_chromium_with_its_figures(
    smtp: Inbox, scenario: Scenario, owner: User
) -> None:
    subscribe(owner)
    sending.send_due(NOW)
    html = html_of(smtp.to("owner@example.com")[0])
    # What mail clients need: no scripts, no stylesheets or external images, no classes.
    assert not re.search(r"<script|<link|<img|<style|class=", html)

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 760, "height": 900})
        page.set_content(html)
        page.screenshot(path=artifact("digest.png"), full_page=True)
        visible = page.inner_text("body")
        width = page.evaluate("document.body.scrollWidth")
        heading_color = page.eval_on_selector(
            "text=Routewatch weekly digest", "e => getComputedStyle(e).color"
        )
    assert "Summarise" in visible
    assert "Acme / fast-model" in visible
    assert "changed: faster route appeared" in visible
    assert "22.5% of 80 probes" in visible
    assert "$0.1120" in visible
    assert "Regressions past 20%" in visible
    assert width <= 760  # no horizontal scrolling at a phone-ish width
    assert heading_color == "rgb(255, 255, 255)"  # inline styles applied: white on dark


def test_a_task_without_probes_is_no_good_news(
    client: Client, scenario: Scenario, owner: User
) -> None:
    quiet = Task.objects.create(name="Classify tickets", slug="classify", user_template="x")
    quiet.routes.set([scenario.fast])
    quiet.regions.set([scenario.eu])
    sub = subscribe(owner)
    sub.tasks.set([quiet])
    client.force_login(owner)
    with time_machine.travel(WEEK_END + timedelta(minutes=10), tick=False):
        html = client.get(URL).content.decode()
        text = client.get(URL, {"format": "text"}).content.decode()
    for body in (html, text):
        assert "Classify tickets" in body
        assert "No regressions" not in body
        assert "No probes this week: nothing to compare, so no verdict on regressions." in body
    # A task with probes both weeks still says so when nothing regressed.
    sub.tasks.set([scenario.task])
    with time_machine.travel(WEEK_END + timedelta(minutes=10), tick=False):
        text = client.get(URL, {"format": "text"}).content.decode()
    assert "No probes this week" not in text
