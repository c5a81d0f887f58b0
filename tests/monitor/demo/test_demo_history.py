"""Demo history: a fresh demo shows every page at once, plainly marked, and never on real data."""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from monitor import demo_history
from monitor.management.commands.load_demo import DEMO_CONFIG
from monitor.models import (
    OUTCOME_OK,
    GeneratedSpan,
    ProbeResult,
    RaceRun,
    Region,
    Rollup,
    Route,
    ScenarioResult,
    Task,
)
from monitor.pages.common import HIDE_GENERATED_COOKIE
from monitor.pages.common import demo_history as page_demo_history
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.ingest import retention as ingest_retention
from simulator.config import load
from tests.support import unfold_series

pytestmark = pytest.mark.django_db

RTT = {"us-east": 20.0, "eu-west": 90.0, "ap-south": 220.0}
BANNER = "This dashboard includes generated demo history"


def _load_demo(history: bool = True) -> str:
    from io import StringIO

    out = StringIO()
    args = ["load_demo", "--simulator", "http://127.0.0.1:8100"]
    if history:
        args += ["--history", *[f"--region-rtt={k}={v}" for k, v in RTT.items()]]
    call_command(*args, stdout=out)
    return out.getvalue()


LOADED: dict[str, datetime] = {}  # when the module's demo finished loading


@pytest.fixture(scope="module")
def demo(django_db_setup: None, django_db_blocker: Any) -> Iterator[float]:
    """The demo configuration and its generated week, loaded once for the module (each test
    runs in a transaction rolled back after it, so none sees another's changes); returns the
    seconds it took. The database is emptied after the module, as a transactional test's."""
    try:
        with django_db_blocker.unblock():
            started = time.monotonic()
            output = _load_demo()
            elapsed = time.monotonic() - started
            LOADED["at"] = timezone.now()
        assert "generated results" in output
        yield elapsed
    finally:
        with django_db_blocker.unblock():
            call_command("flush", interactive=False, verbosity=0)


def _pages(route: Route) -> dict[str, str]:
    return {
        "overview": reverse("rw-overview"),
        "task": reverse("rw-task", args=["support-answer"]),
        "route": reverse("rw-route", args=[route.pk]) + "?task=support-answer",
        "regions": reverse("rw-regions"),
        "log": reverse("rw-log"),
        "races": reverse("rw-races") + "?task=support-answer",
        "digest": reverse("rw-digest-preview"),
    }


def test_a_fresh_demo_gets_a_week_of_history_and_every_page_shows_it_marked(
    demo: float, client: Client, teammate: User, capsys: pytest.CaptureFixture[str]
) -> None:
    # Its time is a figure, not a check (about 50 s for the week on an idle 2-core machine).
    with capsys.disabled():
        print(f"\ndemo history: a week generated in {demo:.1f} s")
    results = ProbeResult.objects.all()
    assert results.count() > 40_000
    assert not results.filter(generated=False).exists()
    first = results.order_by("started_at").first()
    last = results.order_by("-started_at").first()
    assert first is not None
    assert last is not None
    assert last.started_at - first.started_at > timedelta(days=6, hours=23)
    # It runs up to now: the overview's winners are fresh until live probes take over.
    assert timezone.now() - last.started_at < timedelta(minutes=15)
    # Through the real ingest path: rollups, reference flags, races.
    assert Rollup.objects.filter(grain="hour", region__isnull=True).count() > 1000
    probes = results.filter(scenario__isnull=True)  # a scenario's calls rank nothing
    assert probes.filter(reference=True).count() * 3 > probes.count()
    assert RaceRun.objects.filter(generated=True, status="done", winner__isnull=False).exists()
    assert not RaceRun.objects.filter(generated=False).exists()

    client.force_login(teammate)
    route = Route.objects.get(model_id="wafer-llama-70b")
    for name, url in _pages(route).items():
        response = client.get(url)
        assert response.status_code == 200, name
        body = response.content.decode()
        if name == "digest":
            assert "Includes generated demo history" in body, name
        else:
            assert BANNER in body, name
            assert "Hide generated history" in body, name
        assert "No probes yet" not in body, name
    overview = client.get(reverse("rw-overview")).content.decode()
    # Winners with figures at once (a cell may have none when no route meets its bars).
    winners = re.findall(r'<td class="route"><a href="/routes/(\d+)/', overview)
    assert len(winners) >= 4, overview
    log = client.get(reverse("rw-log")).content.decode()
    assert log.count('class="tag generated"') >= 40
    races = client.get(reverse("rw-races"), {"task": "support-answer"}).content.decode()
    assert "No races" not in races
    series = client.get(_pages(route)["route"]).content.decode()
    found = re.search(
        r'<template id="series-data"><script type="application/json">(.*?)</script>', series, re.S
    )
    assert found is not None
    data = unfold_series(json.loads(found[1]))
    assert sum(v is not None for v in data["ttft_ms"]["p50"][-25:-1]) >= 20


def test_generated_figures_follow_the_simulators_profiles(demo: float) -> None:
    """wafer-llama-70b at 10k input tokens, fresh prefix, no faults: TTFT = queue (lognormal,
    median 200 ms) + 10,000 / 7,000 tok/s + the region's round trip; speed about 1,820 tok/s."""
    profile = load(DEMO_CONFIG).providers["waferscale"].models["wafer-llama-70b"]
    task = Task.objects.get(slug="document-summary")
    for region in Region.objects.all():
        rows = ProbeResult.objects.filter(
            task=task,
            route__model_id="wafer-llama-70b",
            region=region,
            prefix_mode="fresh",
            outcome=OUTCOME_OK,
        )
        ttft = statistics.median(r.ttft_ms for r in rows if r.ttft_ms is not None)
        expected = (
            profile.queue_ms + 10_000 / profile.prefill_tokens_per_s * 1000 + RTT[region.slug]
        )
        assert ttft == pytest.approx(expected, rel=0.05), region.slug
        tps = statistics.median(r.tps for r in rows if r.tps is not None)
        assert tps == pytest.approx(profile.decode_tokens_per_s, rel=0.03)
    # The reasoning model: its first answer token comes after its hidden reasoning.
    frontier = ProbeResult.objects.filter(
        route__model_id="frontier-reasoner", outcome=OUTCOME_OK, ttfat_ms__isnull=False
    ).first()
    assert frontier is not None
    assert frontier.ttfat_ms is not None
    assert frontier.ttfat_ms > 2800 / 60 * 1000 * 0.7
    # Faults at their configured rates show as errors of the engine's kinds (single probes:
    # a scenario's calls also meet its deadline).
    errors = ProbeResult.objects.filter(
        route__model_id="frontier-reasoner", outcome="error", scenario__isnull=True
    )
    kinds = set(errors.values_list("error_kind", flat=True))
    assert kinds <= {"http_5xx", "stream_error"}
    assert kinds


def _search() -> tuple[Any, Any]:
    """The generated history's span searched in the results (what pages did before)."""
    generated = ProbeResult.objects.filter(generated=True).order_by("started_at")
    return (
        generated.values_list("started_at", flat=True).first(),
        generated.reverse().values_list("started_at", flat=True).first(),
    )


def test_pages_read_its_span_from_one_row_kept_with_the_results(demo: float) -> None:
    """GeneratedSpan is written by ingest with the generated rows, and read again by retention
    after it drops some: always the span a search of the results finds. Pages read the row,
    not the results (a search planned over every daily partition)."""
    span = GeneratedSpan.objects.get()
    assert (span.start, span.last) == _search()
    with CaptureQueriesContext(connection) as queries:
        info = page_demo_history(None)
    assert info is not None
    assert (info.start, info.last) == (span.start, span.last)
    assert len(queries) == 1
    assert "monitor_proberesult" not in queries[0]["sql"]

    # Retention drops the history's oldest days: the span starts later, where the rows do.
    ingest_retention.delete_old_results(days=3)
    start, last = _search()
    assert start is not None
    assert start > span.start
    kept = GeneratedSpan.objects.get()
    assert (kept.start, kept.last) == (start, last)
    assert last == span.last
    # Without generated rows the row goes, and with it every page's banner.
    ProbeResult.objects.filter(generated=True).delete()
    assert GeneratedSpan.refresh() is None
    assert not GeneratedSpan.objects.exists()
    assert page_demo_history(None) is None


def test_it_is_added_once(demo: float) -> None:
    before = ProbeResult.objects.count()
    output = _load_demo()
    assert "Demo history not added" in output
    assert ProbeResult.objects.count() == before


def test_hiding_it_leaves_only_measured_results_on_the_pages(
    demo: float, client: Client, teammate: User
) -> None:
    client.force_login(teammate)
    response = client.post(reverse("rw-demo-history"), {"hide": "1", "next": reverse("rw-log")})
    assert response.status_code == 302
    assert response["Location"] == reverse("rw-log")
    assert client.cookies[HIDE_GENERATED_COOKIE].value == "1"
    log = client.get(reverse("rw-log")).content.decode()
    assert "Generated demo history hidden" in log
    assert 'class="tag generated"' not in log
    overview = client.get(reverse("rw-overview")).content.decode()
    assert '<td class="route"><a href="/routes/' not in overview  # nothing measured yet
    races = client.get(reverse("rw-races")).content.decode()
    assert "Generated demo history hidden" in races
    # An outside address is never a redirect target; showing it again drops the cookie.
    response = client.post(reverse("rw-demo-history"), {"next": "https://evil.example/"})
    assert response["Location"] == "/"
    assert BANNER in client.get(reverse("rw-log")).content.decode()


def test_a_region_worker_cannot_mark_its_results_generated(demo: float) -> None:
    """Over the broker (from_region), `generated` is cleared: a measurement stays one."""
    from monitor.models import ProbeSlot

    task = Task.objects.get(slug="support-answer")
    route = task.routes.first()
    region = task.regions.first()
    assert route is not None
    assert region is not None
    now = timezone.now()
    ProbeSlot.objects.create(
        task=task, route=route, region=region, slot_at=now, deadline_at=now + timedelta(minutes=5)
    )
    written = ingest.ingest(
        [
            {
                "task_id": task.pk,
                "route_id": route.pk,
                "region_id": region.pk,
                "slot_at": now.isoformat(),
                "started_at": now.isoformat(),
                "outcome": OUTCOME_OK,
                "ttft_ms": 300.0,
                "generated": True,
            }
        ],
        from_region=region.pk,
    )
    assert written == 1
    assert ProbeResult.objects.get(slot_at=now).generated is False
    assert demo_history.has_real_data()


def test_a_scenario_task_gets_whole_runs_marked_and_hidden_like_the_rest(
    demo: float, client: Client, teammate: User
) -> None:
    """The agent loop's runs: app e2e per route in every region on the task page's panel (its
    rollups, as ingest folds a scenario), each run as long as its calls one after another,
    every row marked generated and gone from the panel when generated history is hidden."""
    task = Task.objects.get(slug="agent-loop-10")
    runs = ScenarioResult.objects.filter(task=task)
    assert runs.count() > 7 * 24 * task.routes.count() * 3 * 0.9
    assert not runs.filter(generated=False).exists()
    calls = ProbeResult.objects.filter(task=task)
    assert calls.count() == sum(runs.values_list("call_count", flat=True))
    assert not calls.filter(scenario__isnull=True).exists()
    assert not calls.filter(generated=False).exists()
    # Fresh until live probes take over: each route's last run in each region was recent when
    # the history was written (this test may run long after the module loaded it).
    for route in task.routes.all():
        for place in Region.objects.all():
            last = runs.filter(route=route, region=place).order_by("-started_at").first()
            assert last is not None
            assert LOADED["at"] - last.started_at < task.stale_after(), (route, place)

    client.force_login(teammate)
    reasoner = Route.objects.get(model_id="frontier-reasoner")
    hides_reasoning = set(
        calls.filter(hidden_reasoning_tokens__gt=0).values_list("route", flat=True).distinct()
    )
    assert reasoner.pk in hides_reasoning
    regions: list[Region | None] = [None, *Region.objects.order_by("pk")]
    for region in regions:
        params = {"region": region.slug} if region else {}
        page = client.get(reverse("rw-task", args=[task.slug]), params)
        assert page.status_code == 200
        lines = {line.route: line for line in page.context["page"].scenario.lines}
        assert set(lines) == set(task.routes.all())
        for route, line in lines.items():
            assert line.p50.point is not None, (route, region)
            if route.pk in hides_reasoning:
                continue  # the calculator counts billed reasoning at streaming speed
            # Its calls one after another: about what the calculator says from their medians
            # (more, as measured runs do: a queue's slow draws add up over ten calls).
            assert line.ratio is not None
            assert 0.9 < line.ratio < 1.6, (route, region, line.ratio)
    # Ten calls of about 55 s each: the reasoning route's runs last about 9 minutes, inside
    # the task's 900 s deadline, and end in an answer, as live ones do.
    slow = runs.filter(route=reasoner, outcome=OUTCOME_OK)
    assert slow.count() > runs.filter(route=reasoner).count() * 0.8
    assert not slow.filter(app_e2e_ms__lt=300_000).exists()
    # Every route of the scenario can finish its ten calls within the deadline: no run of any
    # route was stopped by it (at 300 s, 11 of 12 of the reasoning route's runs were, at step
    # 6), and most of each route's runs end in answers: the rest met its provider's faults
    # (Budget AI fails 5% of its calls, so 40% of its runs of ten).
    overran = runs.filter(error_detail__contains="within the scenario's deadline")
    assert list(overran.values_list("route__model_id", flat=True).distinct()) == []
    for route in task.routes.all():
        mine = runs.filter(route=route)
        assert mine.filter(outcome=OUTCOME_OK).count() > mine.count() * 0.5, route
    wafer = runs.filter(route__model_id="wafer-llama-70b", outcome=OUTCOME_OK).first()
    assert wafer is not None
    assert wafer.app_e2e_ms is not None
    assert wafer.calls_e2e_ms is not None
    assert wafer.call_count == 10
    assert wafer.calls_e2e_ms < wafer.app_e2e_ms < wafer.calls_e2e_ms + 100
    assert wafer.validation_pass is not None

    # The overview ranks it by app e2e at once, a winner in each region.
    overview = client.get(reverse("rw-overview")).content.decode()
    card = overview.split(f'data-task="{task.slug}"')[1].split("</article>")[0]
    assert card.count('<td class="route"><a href="/routes/') == 3, card

    # Hidden: pages read rollups from the hour after the history (the current hour's hold
    # both), and the probe log leaves out its calls.
    info = page_demo_history(None)
    assert info is not None
    with time_machine.travel(info.end + timedelta(minutes=10), tick=False):
        url = reverse("rw-task", args=[task.slug])
        shown = client.get(url).context["page"].scenario
        assert sum(line.p50.point is not None for line in shown.lines) == task.routes.count()
        client.post(reverse("rw-demo-history"), {"hide": "1"})
        hidden = client.get(url).context["page"].scenario
        assert all(line.p50.point is None for line in hidden.lines)
    assert 'class="tag generated"' not in client.get(reverse("rw-log")).content.decode()


def test_an_alert_rules_backtest_replays_the_demo_history_hour_by_hour(demo: float) -> None:
    """Its time is bench-pages' figure ("alert backtest", target 2 s), not asserted here."""
    from monitor.alerts import backtest
    from monitor.alerts.models import KIND_AVAILABILITY, KIND_LATENCY, AlertRule

    task = Task.objects.get(slug="support-answer")
    # A line every probe is past, over 4 hours: the reference option set is one of the task's
    # four, so an hour holds 1 or 2 of its probes, too few for a median's interval; 4 hours
    # hold enough for its lower bound, so every hour after the history began is a breach.
    latency = AlertRule.objects.create(
        task=task, kind=KIND_LATENCY, threshold_ms=1.0, min_regions=1, window_minutes=240
    )
    availability = AlertRule.objects.create(task=task, kind=KIND_AVAILABILITY)
    for rule in (latency, availability):
        result = backtest.run(rule, timezone.now())
        assert result.hours == 30 * 24
        assert re.fullmatch(r"would have fired \d+ times? in the last 30 days", result.headline)
    fired = backtest.run(latency, timezone.now()).firings
    # One firing per route: each breach begins once with the history and never clears.
    assert sorted(f.subject for f in fired) == sorted(f"route:{r.pk}" for r in task.routes.all())
    assert all("samples" in f.why and "1 ms" in f.why for f in fired)
