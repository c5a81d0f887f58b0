"""What rules find, on rows written through the real ingest path: the interval's lower bound
past the line, K of N regions agreeing, one "region path down" instead of one per provider."""

from __future__ import annotations

from datetime import timedelta

from monitor.alerts import evaluation
from monitor.alerts.models import KIND_AVAILABILITY, KIND_NO_WINNER, KIND_RATE_LIMIT, AlertRule
from monitor.models import WinnerChange
from tests.monitor import factories as f
from tests.monitor.alerts.conftest import NOW, Setup, latency_rule, probes, write


def test_a_route_slow_in_two_regions_of_three_is_one_finding_naming_both(setup: Setup) -> None:
    s = setup
    us, eu, ap = s.regions
    write(
        probes(s, s.fast, us, NOW, 30, e2e_ms=6000)
        + probes(s, s.fast, eu, NOW, 30, e2e_ms=6500)
        + probes(s, s.fast, ap, NOW, 30, e2e_ms=1000)
        + probes(s, s.other, us, NOW, 30, e2e_ms=1500)
    )
    rule = latency_rule(s)

    [finding] = evaluation.evaluate(rule, NOW)

    assert finding.subject == f"route:{s.fast.pk}"
    assert finding.facts["regions"] == ["eu-west", "us-east"]
    assert finding.facts["regions_total"] == 3
    assert finding.facts["samples"] == 30
    assert finding.facts["threshold"] == 3000
    low = finding.facts["low"]
    assert low is not None
    assert low > 3000
    assert "30 samples" in finding.facts["why"]
    assert finding.facts["link"] == f"/routes/{s.fast.pk}/?task=support"


def test_one_region_alone_does_not_fire_a_rule_that_needs_two(setup: Setup) -> None:
    s = setup
    us, eu, _ = s.regions
    write(probes(s, s.fast, us, NOW, 30, e2e_ms=6000) + probes(s, s.fast, eu, NOW, 30, e2e_ms=900))
    assert evaluation.evaluate(latency_rule(s), NOW) == []
    assert len(evaluation.evaluate(latency_rule(s, min_regions=1), NOW)) == 1


def test_a_figure_past_the_line_whose_interval_is_not_wholly_past_it_does_not_fire(
    setup: Setup,
) -> None:
    s = setup
    us, eu, _ = s.regions
    # Medians of 3,400 ms with four of nine probes at 2,500: past 3,000 ms, but not surely.
    mixed = [3400.0] * 5 + [2500.0] * 4
    for region in (us, eu):
        write(
            [
                f.payload(s.task, s.fast, region, NOW - timedelta(minutes=i + 1), e2e_ms=ms)
                for i, ms in enumerate(mixed)
            ]
        )
    rule = latency_rule(s)
    assert evaluation.evaluate(rule, NOW) == []
    # The same figures with more samples are sure.
    for region in (us, eu):
        write(probes(s, s.fast, region, NOW - timedelta(minutes=10), 30, e2e_ms=3400))
    assert len(evaluation.evaluate(rule, NOW)) == 1


def test_a_ratio_to_the_routes_own_figure_last_week_fires_on_the_same_route_getting_slower(
    setup: Setup,
) -> None:
    s = setup
    us, eu, _ = s.regions
    week = timedelta(days=7)
    for region in (us, eu):
        write(probes(s, s.fast, region, NOW - week, 30, e2e_ms=1000))
        write(probes(s, s.fast, region, NOW, 30, e2e_ms=1800))
    rule = latency_rule(s, threshold_ms=None, baseline_ratio=1.5)

    [finding] = evaluation.evaluate(rule, NOW)

    assert finding.facts["threshold_label"] == "1.5x its figure the same hours last week"
    threshold = finding.facts["threshold"]
    assert threshold is not None
    assert 1400 < threshold < 1600
    rule.baseline_ratio = 2.0
    assert evaluation.evaluate(rule, NOW) == []


def test_every_route_failing_in_one_region_is_one_region_path_down_not_one_per_provider(
    setup: Setup,
) -> None:
    s = setup
    us, eu, ap = s.regions
    for route in (s.fast, s.other):
        write(probes(s, route, ap, NOW, 20, outcome="error", error_kind="connect"))
        write(probes(s, route, us, NOW, 20) + probes(s, route, eu, NOW, 20))
    rule = AlertRule.objects.create(task=s.task, kind=KIND_AVAILABILITY, min_regions=1)

    [finding] = evaluation.evaluate(rule, NOW)

    assert finding.subject == f"region:{ap.pk}"
    assert finding.summary.startswith("region path down: ap-south")
    assert "the path from this region is down" in finding.facts["why"]


def test_one_provider_failing_in_two_regions_is_that_routes_availability_alert(
    setup: Setup,
) -> None:
    s = setup
    us, eu, ap = s.regions
    write(probes(s, s.other, us, NOW, 20, outcome="error", error_kind="http_5xx"))
    write(probes(s, s.other, eu, NOW, 20, outcome="error", error_kind="http_5xx"))
    write(probes(s, s.other, ap, NOW, 20) + probes(s, s.fast, us, NOW, 20))
    write(probes(s, s.fast, eu, NOW, 20) + probes(s, s.fast, ap, NOW, 20))
    rule = AlertRule.objects.create(task=s.task, kind=KIND_AVAILABILITY)

    [finding] = evaluation.evaluate(rule, NOW)

    assert finding.subject == f"route:{s.other.pk}"
    assert finding.facts["regions"] == ["eu-west", "us-east"]
    assert "surely above the 2.0% ceiling" in finding.facts["why"]


def test_no_route_qualifying_in_k_regions_is_one_decision_finding(setup: Setup) -> None:
    s = setup
    us, eu, _ = s.regions
    for region in (us, eu):
        WinnerChange.objects.create(
            task=s.task, region=region, route=None, previous=s.fast, at=NOW, reason="all fail"
        )
    rule = AlertRule.objects.create(task=s.task, kind=KIND_NO_WINNER)

    [finding] = evaluation.evaluate(rule, NOW)

    assert finding.subject == "task"
    assert finding.facts["regions"] == ["eu-west", "us-east"]
    assert "all fail" in finding.facts["why"]


def test_a_route_rate_limited_in_two_regions_is_one_finding_saying_how_many_must_agree(
    setup: Setup,
) -> None:
    s = setup
    us, eu, ap = s.regions
    for region in (us, eu):
        write(probes(s, s.other, region, NOW, 20, outcome="error", error_kind="http_429"))
    write(probes(s, s.other, ap, NOW, 20) + probes(s, s.fast, us, NOW, 20))
    rule = AlertRule.objects.create(task=s.task, kind=KIND_RATE_LIMIT)

    [finding] = evaluation.evaluate(rule, NOW)

    assert finding.subject == f"route:{s.other.pk}"
    assert finding.facts["regions"] == ["eu-west", "us-east"]
    assert (finding.facts["regions_total"], finding.facts["regions_needed"]) == (3, 2)
    assert "were refused with HTTP 429" in finding.facts["why"]
    # One region alone is not enough.
    rule.min_regions = 3
    assert evaluation.evaluate(rule, NOW) == []


def test_a_window_of_ten_minutes_reads_the_last_ten_not_the_fast_start_of_the_hour(
    setup: Setup,
) -> None:
    # What made `make run` wait seven minutes: forty fast probes earlier in the hour, then
    # ten slow ones, one every 30 s. The last ten minutes are slow only, whatever came before.
    s = setup
    us, eu, _ = s.regions
    now = NOW + timedelta(minutes=45)
    for region in (us, eu):
        write(
            [
                f.payload(s.task, s.fast, region, NOW + timedelta(seconds=30 * i), e2e_ms=500)
                for i in range(60)
            ]
        )
        write(
            [
                f.payload(s.task, s.fast, region, now - timedelta(seconds=30 * i + 5), e2e_ms=6000)
                for i in range(20)
            ]
        )
    rule = latency_rule(s, window_minutes=10)
    [finding] = evaluation.evaluate(rule, now)
    assert finding.facts["samples"] == 20
    assert finding.facts["regions"] == ["eu-west", "us-east"]
    # A window that reaches back into the fast probes holds them again: not sure any more.
    assert evaluation.evaluate(latency_rule(s, window_minutes=30), now) == []


def test_a_latency_rules_default_window_holds_the_probes_its_lower_bound_needs(
    setup: Setup,
) -> None:
    s = setup
    s.task.latency_class = "interactive"
    for interval_s, metric, minutes in (
        (60, "e2e_p50", 10),  # the demo's interactive tasks: ten probes
        (60, "e2e_p95", 20),
        (300, "e2e_p50", 50),
        (10, "e2e_p50", 2),  # whole minutes, under the form's floor of 10
    ):
        s.task.probe_interval_s = interval_s
        rule = AlertRule(task=s.task, kind="latency", metric=metric)
        assert rule.window() == timedelta(minutes=minutes)
    # Other kinds keep the latency class's window.
    assert AlertRule(task=s.task, kind=KIND_AVAILABILITY).window() == timedelta(minutes=60)
