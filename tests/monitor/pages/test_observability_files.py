"""The Grafana dashboard and the example alert rules in deploy/: Prometheus' own parser accepts
every expression (promtool), and every metric they name is one a real /metrics scrape exports."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from monitor.pipeline.region import liveness
from monitor.tasks import beat
from tests.monitor.conftest import World
from tests.promtool import promtool
from tests.support import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "routewatch.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

# Grafana's variables, as Prometheus would receive them.
_VARIABLES = {
    "window": "1h",
    "__rate_interval": "5m",
    "__interval": "1m",
    "task": ".*",
    "region": ".*",
}
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def substitute(expr: str) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: _VARIABLES.get(m.group(1), m.group(0)), expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    text = substitute(expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', "", text)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\boffset\s+\S+", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query)
        assert m, query
        exprs.append(m.group(1))
    return exprs


def _alert_queries() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def test_the_name_reader_finds_metrics_and_skips_functions_labels_and_variables() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, route) (rate(rw_a_bucket{task=~"$task",'
        'kind="or"}[$window]))) * on (route) group_left (provider, model) rw_b_info '
        "> 1e3 and time() - rw_c offset 5m unless rw_d"
    )
    assert metric_names(expr) == {"rw_a_bucket", "rw_b_info", "rw_c", "rw_d"}


def test_promtool_accepts_the_example_alert_rules() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 12 rules found" in result.stdout


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    # Each query as a recording rule: promtool parses it with Prometheus' own PromQL parser.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard_query_{i}", "expr": substitute(expr)}
                    for i, expr in enumerate(_dashboard_queries())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def exported(client: Client, teammate: User, probed_world: World) -> set[str]:
    """The sample names of a real scrape in which every family has samples."""
    beat("tick")
    for region in probed_world.regions:  # each region's worker alive, as its beacon says
        liveness.publish(
            {
                "region": region.slug,
                "worker": "test:1",
                "seen_at": time.time(),
                "in_flight": 1,
                "holding": 1,
                "capacity": 2000,
                "threads": 500,
                "started": 1,
                "late": 0,
                "peak": 1,
            }
        )
    client.force_login(teammate)
    body = client.get(reverse("rw-metrics")).content.decode()
    names: set[str] = set()
    for family in text_string_to_metric_families(body):
        if family.name in ONLY_WITH_SCENARIOS:
            # No scenario task in this world: its family is declared, its names are known.
            names |= {f"{family.name}{suffix}" for suffix in ("_bucket", "_count", "_sum")}
            continue
        if family.name in ONLY_WITH_LIVE_SLOTS | ONLY_WITH_ALERTS:
            # Probes of no schedule here (ad-hoc): no start lags yet; no alert rule either.
            names.add(family.name)
            continue
        assert family.samples, f"{family.name} has no samples in this scrape"
        names |= {s.name for s in family.samples}
    return names


# Families that have samples only once a scenario task has run (monitor.pipeline.beat.scenarios).
ONLY_WITH_SCENARIOS = {"routewatch_app_e2e_seconds"}
# Families that have samples only once live slots were probed (monitor.stats.health).
ONLY_WITH_LIVE_SLOTS = {
    "routewatch_region_start_lag_p50_seconds",
    "routewatch_region_start_lag_p99_seconds",
}
# Families that have samples only once an alert rule found something (monitor.alerts).
ONLY_WITH_ALERTS = {"routewatch_alerts", "routewatch_alert_notifications"}


def test_the_dashboard_and_the_alerts_only_name_exported_metrics(exported: set[str]) -> None:
    queries: list[tuple[str, Any]] = [("dashboard", q) for q in _dashboard_queries()]
    queries += [("alerts", q) for q in _alert_queries()]
    used = {name: where for where, q in queries for name in metric_names(q)}
    assert len(used) >= 15
    unknown = {name: where for name, where in used.items() if name not in exported}
    assert unknown == {}
    # And the dashboard shows the figures the issue asks for.
    for name in (
        "routewatch_winner_info",
        "routewatch_time_to_first_token_seconds_bucket",
        "routewatch_provider_errors_total",
        "routewatch_quality_pass_ratio",
        "routewatch_cache_hit_ratio",
        "routewatch_spend_usd_total",
        "routewatch_queue_depth",
        "routewatch_scheduler_last_tick_timestamp_seconds",
    ):
        assert name in used, name
