"""monitor.pages.shared: a page's body is built once and read by every viewer for
PAGE_SHARE_SECONDS, then built again in the background while readers get the last one, never
past PAGE_SHARE_MAX_AGE_SECONDS; a configuration change shows at once; each reader's own frame
(their name, their CSRF token) is never shared. The suite runs with sharing off
(PAGE_SHARE_SECONDS=0): these tests turn it on."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from monitor.models import Task
from monitor.pages import shared
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f

pytestmark = pytest.mark.django_db(transaction=True)  # the background build reads committed rows

PERIOD_S = 1.0


@pytest.fixture
def sharing(settings: Any) -> Iterator[None]:
    settings.PAGE_SHARE_SECONDS = PERIOD_S
    settings.PAGE_SHARE_MAX_AGE_SECONDS = 600
    shared.forget()
    yield
    shared.settle()
    shared.forget()


@pytest.fixture
def world() -> Task:
    p = f.provider()
    r = f.route(p, "model-a")
    g = f.region("eu-west")
    t = f.task("qa", [r], [g])
    _probe(t, 3)
    return t


def _probe(t: Task, n: int) -> None:
    route, region = t.routes.get(), t.regions.get()
    now = timezone.now()
    ingest.ingest([f.payload(t, route, region, now - timedelta(seconds=i)) for i in range(n)])


def _rows(html: str) -> list[str]:
    return re.findall(r'data-result="(\d+)"', html)


def _log_body(html: str) -> str:
    return html[html.index('<section id="log-body">') :].split("</section>")[0]


def _read(client: Client, url: str) -> tuple[str, list[str]]:
    """A page and the SQL its read ran."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return response.content.decode(), [q["sql"] for q in queries.captured_queries]


def _read_results(sql: list[str]) -> bool:
    return any("monitor_proberesult" in q for q in sql)


def test_every_viewer_reads_one_build_and_gets_their_own_frame(
    sharing: None, world: Task, owner: User, teammate: User
) -> None:
    first, second = Client(), Client()
    first.force_login(owner)
    second.force_login(teammate)
    mine, built = _read(first, reverse("rw-log"))
    theirs, read = _read(second, reverse("rw-log"))
    assert _read_results(built)
    assert not _read_results(read), "the second viewer's read built the body again"
    # Nor its filter form: the lists of tasks, routes and regions are read by the first only.
    assert any('FROM "monitor_route"' in q for q in built)
    assert not any('FROM "monitor_route"' in q for q in read)
    assert _log_body(theirs) == _log_body(mine)
    assert len(_rows(theirs)) == 3
    # Each reader's frame is their own: the name beside the log-out button.
    assert "<span>owner</span>" in mine
    assert "<span>teammate</span>" not in mine
    assert "<span>teammate</span>" in theirs
    assert "<span>owner</span>" not in theirs
    # Another query is another body: built for it.
    errors, sql = _read(second, reverse("rw-log") + "?outcome=error")
    assert _read_results(sql)
    assert _rows(errors) == []


def test_a_body_past_its_period_is_served_once_more_while_it_is_built_again(
    sharing: None, world: Task, teammate: User
) -> None:
    client = Client()
    client.force_login(teammate)
    before, _ = _read(client, reverse("rw-log"))
    assert len(_rows(before)) == 3
    _probe(world, 2)
    shared_copy, _ = _read(client, reverse("rw-log"))
    assert _rows(shared_copy) == _rows(before), "within its period the body is the shared one"
    time.sleep(PERIOD_S + 0.2)
    stale, sql = _read(client, reverse("rw-log"))
    assert _rows(stale) == _rows(before), "past its period: the last body, at once"
    assert not _read_results(sql)
    shared.settle()  # the build it asked for, in the background
    rebuilt, sql = _read(client, reverse("rw-log"))
    assert len(_rows(rebuilt)) == 5
    assert not _read_results(sql), "the background build was served, not built again"


def test_a_body_past_its_longest_age_is_built_for_the_read(
    sharing: None, settings: Any, world: Task, teammate: User
) -> None:
    settings.PAGE_SHARE_MAX_AGE_SECONDS = PERIOD_S
    client = Client()
    client.force_login(teammate)
    assert len(_rows(_read(client, reverse("rw-log"))[0])) == 3
    _probe(world, 2)
    time.sleep(PERIOD_S + 0.2)
    page, sql = _read(client, reverse("rw-log"))
    assert len(_rows(page)) == 5
    assert _read_results(sql)


def test_a_configuration_change_shows_at_once(sharing: None, world: Task, teammate: User) -> None:
    client = Client()
    client.force_login(teammate)
    url = reverse("rw-task", args=[world.slug])
    assert "Quality bar: none." in " ".join(_read(client, url)[0].split())
    world.min_pass_rate = 0.9
    world.save()
    page = " ".join(_read(client, url)[0].split())
    assert "Quality bar: pass rate ≥ 90%." in page
    # The same for a region added to the task: the matrix names it at once.
    world.regions.add(f.region("ap-south"))
    assert 'data-region="ap-south"' in _read(client, reverse("rw-regions"))[0]


def test_no_page_shares_what_belongs_to_its_first_reader(
    sharing: None, world: Task, django_user_model: type[User], teammate: User
) -> None:
    """Every shared page read first by a staff user, then by a teammate: the teammate's page
    carries nothing of the first reader's (their name, a CSRF token, staff-only parts)."""
    staff = django_user_model.objects.create_user("staffer", "s@example.com", "pw-staff-1")
    staff.is_staff = True
    staff.save()
    first, second = Client(), Client()
    first.force_login(staff)
    second.force_login(teammate)
    route = world.routes.get()
    urls = [
        reverse("rw-overview"),
        reverse("rw-task", args=[world.slug]),
        reverse("rw-route", args=[route.pk]),
        reverse("rw-regions"),
        reverse("rw-log"),
        reverse("rw-status"),
    ]
    for url in urls:
        staff_page, _ = _read(first, url)
        assert "<span>staffer</span>" in staff_page
        page, sql = _read(second, url)
        assert not any("monitor_rollup" in q or "monitor_proberesult" in q for q in sql), url
        assert "staffer" not in page, url
        assert page.count("csrfmiddlewaretoken") == 1, url  # its own log-out form's only
        assert 'href="/admin/"' not in page, url  # the staff link is the frame's
