"""/metrics as a Prometheus user gets it: promtool accepts it, counters only grow, histograms are
in seconds and cumulative, ratios agree with the rollups, and the scheduler, broker queues and
winners are there. Over data probed for real against the simulator (conftest.probed_world)."""

from __future__ import annotations

import dataclasses
import gzip
import math
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from monitor.answer import board
from monitor.models import (
    GRAIN_DAY,
    GRAIN_HOUR,
    Heartbeat,
    ProbeResult,
    Rollup,
    Route,
)
from monitor.pages import metrics
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.ingest import retention as ingest_retention
from monitor.pipeline.queues import known_queues
from monitor.stats import hist, rollups
from monitor.tasks import beat
from tests.monitor import factories as f
from tests.monitor.conftest import World, probe_and_ingest
from tests.promtool import promtool

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
COUNTER_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def scrape(client: Client, accept: str = "") -> str:
    headers = {"Accept": accept} if accept else {}
    response = client.get(reverse("rw-metrics"), headers=headers)
    assert response.status_code == 200
    return response.content.decode()


def samples(body: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def series(body: str, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return {k: v for (n, k), v in samples(body).items() if n == name and want <= k}


def one(body: str, name: str, **labels: str) -> float:
    found = series(body, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return next(iter(found.values()))


def _key(world: World, model: str, region: int = 0) -> dict[str, str]:
    return {
        "task": world.task.slug,
        "route": str(world.routes[model].pk),
        "region": world.regions[region].slug,
    }


def _all_time(world: World, model: str, region: int = 0) -> rollups.Stats:
    route, where = world.routes[model], world.regions[region]
    qs = Rollup.objects.filter(grain=GRAIN_DAY, route=route, region=where)
    return rollups.stats_by(qs, ["route_id"])[(route.pk,)]


@pytest.fixture
def reader(client: Client, teammate: User) -> Client:
    client.force_login(teammate)
    return client


def test_promtool_check_metrics_accepts_a_real_scrape(reader: Client, probed_world: World) -> None:
    # A model id that needs escaping in a label value; a tick and winners, so every family
    # has samples to check.
    odd = f.route(probed_world.routes["tiny"].provider, 'we"ird\\model\nname')
    probed_world.task.routes.add(odd)
    beat("tick")
    body = scrape(reader)
    result = promtool("check", "metrics", stdin=body.encode())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == ""
    info = series(body, "routewatch_route_info", route=str(odd.pk))
    assert [dict(k)["model"] for k in info] == ['we"ird\\model\nname']
    # The old hand-written text's faults are gone: no quantile label, no gauge named probes.
    assert 'quantile="' not in body
    assert "# TYPE routewatch_probes_total counter" in body


class _Frozen:
    """A collector that yields families read once, so two encoders see the same scrape."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def _odd_families() -> list[Metric]:
    """What the rollups never produce but the text format must encode alike: escapes in help
    texts and label values, names to escape, OpenMetrics-only samples, timestamps, and values
    whose text is special (infinities, NaN, negative zero, exponents)."""
    counter = CounterMetricFamily(
        "rw_odd", 'help with \\ and\na "quote"', labels=["b", "a"], created=1234.5
    )
    counter.add_metric(['x"y', "back\\slash\nnewline"], 3, timestamp=1700000000.25)
    counter.add_metric(["ü", "é"], 0.0)
    gauge = GaugeMetricFamily("rw.dotted", "a name to escape", labels=["le.x"])
    for value in (float("inf"), float("-inf"), float("nan"), -0.0, 0.0, 1e22, 12345678.9, 1):
        gauge.add_metric([repr(value)], value)
    gauge.add_metric(["one more -0"], -0.0)
    info = InfoMetricFamily("rw_build", "an info metric", value={"version": "1.2"})
    gh = GaugeHistogramMetricFamily(
        "rw_gh", "a gauge histogram", buckets=[("1.0", 2), ("+Inf", 3)], gsum_value=4.0
    )
    hist_family = HistogramMetricFamily(
        "rw_h", "a histogram", buckets=[("0.5", 1), ("+Inf", 2)], sum_value=1.5
    )
    untyped = Metric("rw_unknown", "untyped", "unknown")
    untyped.add_sample("rw_unknown", {}, 7.0)
    return [counter, gauge, info, gh, hist_family, untyped]


def test_the_text_format_is_prometheus_clients_own_byte_for_byte(
    reader: Client, probed_world: World
) -> None:
    """/metrics writes Prometheus text 0.0.4 itself (a scrape's CPU is mostly its encoding):
    the bytes of prometheus_client's generate_latest, over a real scrape's families and over
    the odd cases the library escapes."""
    beat("tick")
    odd = f.route(probed_world.routes["tiny"].provider, 'we"ird\\model\nname')
    probed_world.task.routes.add(odd)
    families = list(metrics.RollupCollector(timezone.now()).collect())
    assert sum(len(m.samples) for m in families) > 100
    for found in (families, _odd_families()):
        assert metrics.text_exposition(_Frozen(found)) == generate_latest(_Frozen(found))
    # The page uses it for the plain text, and leaves OpenMetrics to the library.
    assert scrape(reader).startswith("# HELP routewatch_")
    assert scrape(reader, "application/openmetrics-text; version=1.0.0").endswith("# EOF\n")


def test_it_speaks_openmetrics_to_a_scraper_that_asks_for_it(
    reader: Client, probed_world: World
) -> None:
    response = reader.get(
        reverse("rw-metrics"),
        headers={"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"},
    )
    assert response["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    body = response.content.decode()
    assert body.endswith("# EOF\n")
    families = {fam.name: fam.type for fam in openmetrics_families(body)}
    assert families["routewatch_probes"] == "counter"
    assert families["routewatch_request_duration_seconds"] == "histogram"
    assert families["routewatch_winner"] == "info"
    plain = reader.get(reverse("rw-metrics"))
    assert plain["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


def test_a_scrape_is_gzip_compressed_when_the_scraper_accepts_it(
    reader: Client, probed_world: World
) -> None:
    plain = reader.get(reverse("rw-metrics"))
    assert not plain.has_header("Content-Encoding")
    assert "Accept-Encoding" in plain["Vary"]  # caches keep the two apart
    # What Prometheus sends with every scrape.
    packed = reader.get(reverse("rw-metrics"), headers={"Accept-Encoding": "gzip"})
    assert packed.status_code == 200
    assert packed["Content-Encoding"] == "gzip"
    assert packed["Content-Type"] == plain["Content-Type"]
    body = gzip.decompress(packed.content).decode()
    assert samples(body).keys() == samples(plain.content.decode()).keys()
    assert len(packed.content) * 5 < len(plain.content), (len(packed.content), len(plain.content))
    # OpenMetrics too.
    om = reader.get(
        reverse("rw-metrics"),
        headers={
            "Accept": "application/openmetrics-text; version=1.0.0",
            "Accept-Encoding": "gzip",
        },
    )
    assert om["Content-Encoding"] == "gzip"
    assert gzip.decompress(om.content).decode().endswith("# EOF\n")


def test_counters_are_the_all_time_rollups(reader: Client, probed_world: World) -> None:
    body = scrape(reader)
    fast = _key(probed_world, "fast-small")
    stats = _all_time(probed_world, "fast-small")
    assert stats.count_ok > 0
    assert one(body, "routewatch_probes_total", **fast, outcome="ok") == stats.count_ok
    assert one(body, "routewatch_probes_total", **fast, outcome="error") == stats.count_error
    assert one(body, "routewatch_tokens_total", **fast, type="output") == stats.output_tokens
    assert one(body, "routewatch_tokens_total", **fast, type="input") == stats.input_tokens
    raw_cost = sum(
        (r.cost_usd or Decimal(0))
        for r in ProbeResult.objects.filter(
            route=probed_world.routes["fast-small"], region=probed_world.regions[0]
        )
    )
    assert one(body, "routewatch_spend_usd_total", **fast) == pytest.approx(float(raw_cost))
    assert raw_cost > 0
    # The rate-limited route fails with 429s: the provider's fault, counted by kind and blame.
    tiny = _key(probed_world, "tiny")
    tiny_stats = _all_time(probed_world, "tiny")
    limited = one(body, "routewatch_probe_errors_total", **tiny, kind="http_429")
    assert limited == tiny_stats.error_kinds["http_429"] > 0
    assert (
        dict(next(iter(series(body, "routewatch_probe_errors_total", **tiny, kind="http_429"))))[
            "blame"
        ]
        == "provider"
    )
    assert one(body, "routewatch_provider_errors_total", **tiny) == tiny_stats.provider_errors
    assert one(body, "routewatch_provider_attempts_total", **tiny) == tiny_stats.attempts


def _counter_samples(body: str) -> Samples:
    return {k: v for k, v in samples(body).items() if k[0].endswith(COUNTER_SUFFIXES)}


def test_counters_never_go_down_across_new_results_late_results_and_retention(
    reader: Client, probed_world: World, simulator
) -> None:
    before = _counter_samples(scrape(reader))
    fast = _key(probed_world, "fast-small")
    ok_before = before[("routewatch_probes_total", frozenset({**fast, "outcome": "ok"}.items()))]
    # New results half a minute after the first ones (new slots), and one late result for a
    # slot two days ago, which lands in an older day's rollup row.
    later = dataclasses.replace(probed_world, now=probed_world.now + timedelta(seconds=30))
    added = probe_and_ingest(later, simulator.base_url)
    assert added > 0
    task, route = probed_world.task, probed_world.routes["fast-small"]
    two_days_ago = timezone.now() - timedelta(days=2)
    assert ingest.ingest([f.payload(task, route, probed_world.regions[0], two_days_ago)]) == 1
    # Retention deletes raw results older than a day (the late one: row by row, or with its
    # day's partition when that day has one); rollups stay.
    ingest_retention.delete_old_results(days=1)
    assert not ProbeResult.objects.filter(started_at__lt=timezone.now() - timedelta(days=1))
    after = _counter_samples(scrape(reader))
    went_down = {k: (v, after.get(k)) for k, v in before.items() if after.get(k, -1) < v}
    assert went_down == {}
    added_ok = (
        ProbeResult.objects.filter(
            route=route, region=probed_world.regions[0], outcome="ok"
        ).count()
        + 1
    )  # + the late one, deleted from the raw table but not from the rollups
    ok_after = after[("routewatch_probes_total", frozenset({**fast, "outcome": "ok"}.items()))]
    assert ok_after == added_ok > ok_before


def test_latency_histograms_are_cumulative_seconds_with_an_estimated_sum(
    reader: Client, probed_world: World
) -> None:
    body = scrape(reader)
    fast = _key(probed_world, "fast-small")
    name = "routewatch_time_to_first_token_seconds"
    found = series(body, f"{name}_bucket", **fast)
    by_le = sorted(((float(dict(k)["le"]), v) for k, v in found.items()))
    assert [le for le, _ in by_le] == [*metrics.SECONDS_BOUNDS, math.inf]
    counts = [v for _, v in by_le]
    assert counts == sorted(counts)  # cumulative
    raw = [
        ms / 1000
        for ms in ProbeResult.objects.filter(
            route=probed_world.routes["fast-small"], region=probed_world.regions[0]
        ).values_list("ttft_ms", flat=True)
        if ms is not None
    ]
    assert counts[-1] == one(body, f"{name}_count", **fast) == len(raw)
    # The sum is estimated from the log buckets' middles: within their half width (2.5%).
    assert one(body, f"{name}_sum", **fast) == pytest.approx(sum(raw), rel=0.025)
    # Each bound's count is the exact count, give or take the probes in the one log bucket
    # that straddles it.
    for le, n in by_le[:-1]:
        exact = sum(1 for v in raw if v <= le)
        near = sum(1 for v in raw if le / hist.RATIO < v <= le * hist.RATIO)
        assert abs(n - exact) <= near, (le, n, exact)


def test_log_buckets_map_onto_le_bounds() -> None:
    values_ms = [10.0, 40.0, 95.0, 110.0, 450.0, 2_500.0, 500_000.0]
    counts: dict[int, int] = {}
    hist.add_into(counts, hist.build(values_ms, hist.MS))
    got, total = metrics.buckets(counts, hist.MS, 0.001, (0.05, 0.1, 1.0, 10.0))
    assert got == [("0.05", 2.0), ("0.1", 3.0), ("1.0", 5.0), ("10.0", 6.0), ("+Inf", 7.0)]
    assert total == pytest.approx(sum(values_ms) / 1000, rel=0.025)


def test_ratios_are_provider_attributed_over_the_overview_window(
    reader: Client, probed_world: World
) -> None:
    # Our own failure (a configuration error) never counts against the provider.
    task, fast = probed_world.task, probed_world.routes["fast-small"]
    eu = probed_world.regions[0]
    at = timezone.now() - timedelta(minutes=1)
    ingest.ingest([f.payload(task, fast, eu, at, outcome="error", error_kind="config")])
    body = scrape(reader)
    now = timezone.now()
    recent = rollups.stats_by(
        rollups.rows(since=now - board.WINDOW, until=now + timedelta(hours=1), grain=GRAIN_HOUR),
        ["route_id", "region_id"],
        histograms=False,
    )
    tiny = probed_world.routes["tiny"]
    ratio = one(body, "routewatch_provider_error_ratio", **_key(probed_world, "tiny"))
    assert ratio == pytest.approx(recent[(tiny.pk, eu.pk)].provider_error_rate)
    assert ratio > 0.5
    key = _key(probed_world, "fast-small")
    assert one(body, "routewatch_probe_errors_total", **key, kind="config", blame="config") == 1
    assert one(body, "routewatch_provider_error_ratio", **key) == pytest.approx(
        recent[(fast.pk, eu.pk)].provider_error_rate
    )
    assert recent[(fast.pk, eu.pk)].count_error >= 1
    pass_rate = recent[(fast.pk, eu.pk)].pass_rate
    assert pass_rate is not None
    assert one(body, "routewatch_quality_pass_ratio", **key) == pytest.approx(pass_rate)


def test_winners_are_an_info_metric_that_names_the_overview_winner(
    reader: Client, probed_world: World
) -> None:
    body = scrape(reader)
    cells = [(row.task.slug, c) for row in board.current().rows for c in row.cells]
    assert cells
    routes = {r.pk: r for r in Route.objects.select_related("provider")}
    for task_slug, cell in cells:
        present = one(body, "routewatch_winner_present", task=task_slug, region=cell.region_slug)
        info = series(body, "routewatch_winner_info", task=task_slug, region=cell.region_slug)
        if cell.route_id is None:
            assert (present, info) == (0, {})
            continue
        route = routes[cell.route_id]
        assert present == 1
        assert list(info) == [
            frozenset(
                {
                    "task": task_slug,
                    "region": cell.region_slug,
                    "route": str(route.pk),
                    "provider": route.provider.slug,
                    "model": route.model_id,
                }.items()
            )
        ]
    assert any(c.route_id for _, c in cells)


def test_the_scheduler_heartbeat_and_rejected_results_are_exported(
    reader: Client, probed_world: World
) -> None:
    body = scrape(reader)
    assert series(body, "routewatch_scheduler_last_tick_timestamp_seconds") == {}
    assert one(body, "routewatch_scheduler_ticks_total") == 0
    beat("tick")
    beat("tick")
    ingest.count_rejected(3)
    body = scrape(reader)
    tick = Heartbeat.objects.get(name="tick")
    assert one(body, "routewatch_scheduler_last_tick_timestamp_seconds") == pytest.approx(
        tick.last_seen.timestamp()
    )
    assert one(body, "routewatch_scheduler_ticks_total") == 2
    assert one(body, "routewatch_ingest_rejected_results_total") == 3


@pytest.fixture
def broker_queues(probed_world: World) -> Iterator[list[str]]:
    """The region and ingest queues, emptied before and after (nothing consumes them here)."""
    import redis
    from django.conf import settings

    client = redis.Redis.from_url(settings.REDIS_URL)
    queues = known_queues(g.queue_name for g in probed_world.regions)
    client.delete(*queues)
    yield queues
    client.delete(*queues)


def test_queue_depth_counts_the_messages_waiting_in_each_celery_queue(
    reader: Client, probed_world: World, broker_queues: list[str]
) -> None:
    from monitor.celery import app

    eu = probed_world.regions[0]
    for _ in range(3):
        app.send_task("monitor.tasks.run_probe_batch", args=[{}], queue=eu.queue_name)
    app.send_task("monitor.tasks.ingest_results", args=[{}], queue="ingest")
    body = scrape(reader)
    assert one(body, "routewatch_broker_up") == 1
    depths = {dict(k)["queue"]: v for k, v in series(body, "routewatch_queue_depth").items()}
    assert depths == {
        "schedule": 0,
        "default": 0,
        "ingest": 1,
        "probes.eu-west": 3,
        "probes.us-east": 0,
    }


def test_a_broker_that_does_not_answer_is_reported_not_fatal(
    reader: Client, probed_world: World
) -> None:
    with override_settings(REDIS_URL="redis://127.0.0.1:9/0"):
        body = scrape(reader)
    assert one(body, "routewatch_broker_up") == 0
    assert series(body, "routewatch_queue_depth") == {}
    assert series(body, "routewatch_probes_total")  # the rest is there


def test_labels_are_bounded_slugs_ids_and_kinds(reader: Client, probed_world: World) -> None:
    beat("tick")
    body = scrape(reader)
    names: set[str] = set()
    for (_, labels), _value in samples(body).items():
        names |= {k for k, _ in labels}
    assert names <= {
        "task",
        "route",
        "region",
        "outcome",
        "kind",
        "blame",
        "type",
        "le",
        "queue",
        "provider",
        "model",
        "window",  # 1h or 24h (routewatch_region_slots)
        "state",  # probed, missed or late
    }
    providers = {dict(k)["provider"] for k in series(body, "routewatch_route_info")}
    assert providers == {"fastchip", "claudish", "limited"}  # slugs, not display names
