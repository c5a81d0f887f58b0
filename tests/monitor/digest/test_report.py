"""The digest's content from real rollups: why the fastest route changed, and what did not."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import User
from django.test import Client

from monitor import scenario_presets
from monitor.digest import report as digest
from monitor.digest import sending
from monitor.models import Subscription, Task
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f
from tests.monitor.digest.conftest import WEEK_END, Scenario

PERIOD = digest.period_ending(WEEK_END)


def _probes(t, r, g, start, n, **kw):
    return [f.payload(t, r, g, start + timedelta(minutes=i), **kw) for i in range(n)]


def test_a_winner_that_drops_below_the_quality_bar_is_reported_as_quality_dropped(db: None) -> None:
    p = f.provider()
    fast, slow = f.route(p, "fast-model"), f.route(p, "slow-model")
    eu = f.region("eu-west")
    t = f.task("extract", [fast, slow], [eu], min_pass_rate=0.8)
    this, last = WEEK_END - timedelta(days=1), WEEK_END - timedelta(days=8)
    ingest.ingest(
        [
            *_probes(t, fast, eu, last, 20, e2e_ms=1000, quality_pass=True),
            *_probes(t, slow, eu, last, 20, e2e_ms=3000, quality_pass=True),
            # This week fast-model passes half its graded probes: under the 80% bar.
            *_probes(t, fast, eu, this, 10, e2e_ms=1000, quality_pass=True),
            *_probes(t, fast, eu, this + timedelta(hours=1), 10, e2e_ms=1000, quality_pass=False),
            *_probes(t, slow, eu, this, 20, e2e_ms=3000, quality_pass=True),
        ]
    )
    [report] = digest.build_report(Task.objects.filter(pk=t.pk), PERIOD)
    [region] = report.regions
    assert region.winner == slow
    assert region.last_winner == fast
    assert region.verdict == digest.VERDICT_CHANGED
    assert region.why == digest.WHY_QUALITY
    assert region.detail == (
        "Acme / fast-model passed 10 of 20 graded probes (30%-70%, 95%) under the 80% bar."
    )
    assert report.regressions == []  # latency did not move


def test_an_unchanged_winner_is_reported_as_unchanged_with_steady_figures(db: None) -> None:
    p = f.provider()
    fast = f.route(p, "fast-model")
    eu = f.region("eu-west")
    t = f.task("extract", [fast], [eu], e2e_p95_budget_ms=1000)
    this, last = WEEK_END - timedelta(days=1), WEEK_END - timedelta(days=8)
    ingest.ingest(
        [
            *_probes(t, fast, eu, last, 20, ttft_ms=300, e2e_ms=900),
            *_probes(t, fast, eu, this, 20, ttft_ms=300, e2e_ms=950),
        ]
    )
    [report] = digest.build_report(Task.objects.filter(pk=t.pk), PERIOD)
    [region] = report.regions
    assert region.verdict == digest.VERDICT_SAME
    assert [c.direction for c in region.changes] == ["steady", "steady", "slower", "slower"]
    assert region.e2e_budget == "near budget"  # 950 ms against 1000 ms
    # The task sets no TTFT budget: the interactive class's default (2 s) applies.
    assert region.ttft_budget == "within budget"


def test_the_digest_names_each_tasks_ranking_metric_and_the_window_of_its_winners(
    db: None, owner: User
) -> None:
    p = f.provider()
    r = f.route(p, "agent-model")
    eu = f.region("eu-west")
    # A scenario task: ranked by app e2e whatever its latency_metric says (none).
    t = f.task("agent", [r], [eu], latency_metric="", latency_class="async")
    scenario_presets.apply(t, "agent-loop")
    plain = f.task("extract", [r], [eu], latency_metric="", latency_class="interactive")
    report = digest.build_report(Task.objects.filter(pk__in=[t.pk, plain.pk]), PERIOD)
    labels = {d.task.slug: d.metric_label for d in report}
    assert labels == {"agent": "app e2e p50 (scenario tasks)", "extract": "TTFT p95"}
    subscription = Subscription(user=owner)
    message = sending.digest_message(subscription, PERIOD, report)
    text = str(message.body)
    html = str(message.alternatives[0][0])
    for body in (text, html):
        assert "the latency class's default" not in body
        assert "app e2e p50 (scenario tasks)" in body
        # Which window each winner is for: the digest's week, not the overview's 24 h.
        assert "this digest's week" in body
        assert "the overview judges the last 24 h" in body


def test_results_outside_the_fortnight_are_not_counted(scenario: Scenario) -> None:
    outside = WEEK_END + timedelta(minutes=5)  # after the week's end: next week's digest
    ingest.ingest(
        [
            f.payload(scenario.task, scenario.fast, scenario.eu, outside, outcome="error"),
            f.payload(scenario.task, scenario.fast, scenario.eu, WEEK_END - timedelta(days=15)),
        ]
    )
    [report] = digest.build_report(Task.objects.filter(pk=scenario.task.pk), PERIOD)
    assert (report.this_week.count, report.last_week.count) == (80, 60)
    assert report.error_rate_this == "22.5%"


def test_subscription_admin_lists_filters_and_searches(
    client: Client, scenario: Scenario, admin_user: User, owner: User
) -> None:
    from tests.monitor.digest.conftest import subscribe

    subscribe(owner)
    client.force_login(admin_user)
    url = "/admin/monitor/subscription/"
    response = client.get(url, {"q": "owner@example"})
    assert response.status_code == 200
    assert b"owner" in response.content
    assert client.get(url, {"is_active__exact": "1"}).status_code == 200
    assert b"0 results" in client.get(url, {"q": "nobody-by-that-name"}).content
    assert client.get(f"{url}add/").status_code == 200
