"""The task's own rules, used by every page and the digest: freshness and latency budgets;
and the rollup counters, declared once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import DecimalField, IntegerField

from monitor.models import (
    METRIC_E2E_P50,
    METRIC_E2E_P95,
    METRIC_TTFT_P95,
    STATUS_NEAR,
    STATUS_OK,
    STATUS_OVER,
    STATUS_UNKNOWN,
    Rollup,
    Task,
)
from monitor.stats import rollups

NOW = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def test_figures_go_stale_after_three_intervals_when_that_is_longer() -> None:
    task = Task(probe_interval_s=600, probe_timeout_s=180)
    assert task.stale_after() == timedelta(seconds=1800)


def test_figures_go_stale_after_an_interval_plus_the_deadline_and_a_minute_when_longer() -> None:
    task = Task(probe_interval_s=60, probe_timeout_s=180)
    assert task.stale_after() == timedelta(seconds=60 + 180 + 60)


def test_a_probe_exactly_at_the_bound_is_still_fresh_and_a_moment_later_is_not() -> None:
    task = Task(probe_interval_s=600, probe_timeout_s=180)
    bound = task.stale_after()
    assert task.is_fresh(NOW - bound, NOW)
    assert not task.is_fresh(NOW - bound - timedelta(microseconds=1), NOW)
    assert not task.is_fresh(None, NOW)


@pytest.mark.parametrize(
    ("value_ms", "status"),
    [
        (899.0, STATUS_OK),
        (900.0, STATUS_OK),  # 90% of the budget is still comfortably inside it
        (900.5, STATUS_NEAR),
        (1000.0, STATUS_NEAR),
        (1000.5, STATUS_OVER),
        (None, STATUS_UNKNOWN),
    ],
)
def test_a_figure_is_judged_against_its_metrics_budget(value_ms: float | None, status: str) -> None:
    task = Task(ttft_p95_budget_ms=1000, e2e_p95_budget_ms=None)
    assert task.budget_status(METRIC_TTFT_P95, value_ms) == status


def test_a_metric_without_a_budget_has_no_status() -> None:
    task = Task(ttft_p95_budget_ms=1000, e2e_p95_budget_ms=None)
    assert task.budget_status(METRIC_E2E_P95, 10.0) == STATUS_UNKNOWN
    assert task.budget_status(METRIC_E2E_P50, 10.0) == STATUS_UNKNOWN
    assert task.budget_ms(METRIC_TTFT_P95) == 1000


def test_the_rollup_counters_are_the_rollup_tables_summed_columns() -> None:
    numeric = [
        f.name
        for f in Rollup._meta.concrete_fields
        if isinstance(f, IntegerField | DecimalField) and not f.primary_key
    ]
    assert tuple(numeric) == rollups.COUNTERS
