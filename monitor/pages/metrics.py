"""/metrics: the Prometheus exposition, written by prometheus_client from the rollups.

Each scrape builds a fresh CollectorRegistry holding one `RollupCollector` (no process-wide
registry is touched, so two scrapes never see each other's state) and encodes it in the format
the scraper asks for: Prometheus text 0.0.4 by default (written by `text_exposition`, the bytes
of prometheus_client's generate_latest at a third of its CPU), OpenMetrics on request (by the
library).

Counters (`*_total`) are all-time sums of the daily rollup rows per (task, route, region).
Ingest adds every result to its day's row in the same transaction that stores it (the day of
the current hour included), so a sum over all daily rows is complete and only ever grows: a
late result adds to an older day, and retention (monitor.pipeline.ingest.delete_old_results)
deletes raw results but never rollups. A series goes away, rather than going down, when its
task, route or region is deleted (the rollups go with it). Should rollups ever be pruned, these
counters would need a cumulative table of their own; tests/monitor/pages/test_metrics.py fails if
retention touches them.

Latency histograms are the same all-time rollups: the rollups' log buckets (5% wide,
monitor.stats.hist) are mapped onto fixed `le` bounds by each bucket's representative value,
and `_sum` is estimated from those representatives (the rollups keep no exact sums).

Ratios (`*_ratio`) are gauges over the overview's window (the last 24 h, what chooses the
winner); the counters they come from are exported alongside, so PromQL can compute them over
any window. Labels are bounded: slugs, route ids, error kinds from probes.errors.Kind, queue
names; a route's provider and model are on `routewatch_route_info` (join on `route`).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import cast

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from monitor.alerts import metrics as alert_metrics
from monitor.answer import board
from monitor.models import GRAIN_DAY, GRAIN_HOUR, HEARTBEAT_TICK, Heartbeat, Region, Route, Task
from monitor.pages import monitoring
from monitor.pipeline import queues
from monitor.pipeline.ingest.results import REJECTED_COUNTER
from monitor.stats import hist, rollups
from monitor.stats.rollups import Stats
from probes.errors import Kind

log = logging.getLogger(__name__)

# `le` bounds of the latency histograms, seconds; of the speed histogram, tokens per second.
SECONDS_BOUNDS = (
    0.025,
    0.05,
    0.1,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
TPS_BOUNDS = (5.0, 10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0, 500.0, 1000.0, 2000.0)

# The Celery queues besides the regions' probes.<slug>: beat's own tasks, and results.
TICK_HEARTBEAT = HEARTBEAT_TICK  # monitor.tasks.tick

_KEY = ("task", "route", "region")
_ESTIMATED = (
    " The rollups' 5% log buckets are mapped onto these bounds by each bucket's middle value;"
    " _sum is estimated from those middle values."
)


@dataclass(frozen=True)
class _Histogram:
    name: str
    help: str
    column: str  # the Stats counts dict: ttft_counts, ...
    scale: hist.Scale
    factor: float  # rollup unit -> exported unit
    bounds: Sequence[float]


_HISTOGRAMS = (
    _Histogram(
        "routewatch_time_to_first_token_seconds",
        "Time from sending the request to the first streamed token (reasoning included), "
        "successful probes." + _ESTIMATED,
        "ttft_counts",
        hist.MS,
        0.001,
        SECONDS_BOUNDS,
    ),
    _Histogram(
        "routewatch_time_to_first_answer_token_seconds",
        "Time from sending the request to the first answer token (after any reasoning), "
        "successful probes." + _ESTIMATED,
        "ttfat_counts",
        hist.MS,
        0.001,
        SECONDS_BOUNDS,
    ),
    _Histogram(
        "routewatch_request_duration_seconds",
        "End-to-end time of a probe, request sent to stream ended, successful probes." + _ESTIMATED,
        "e2e_counts",
        hist.MS,
        0.001,
        SECONDS_BOUNDS,
    ),
    _Histogram(
        "routewatch_app_e2e_seconds",
        "Application end-to-end time of a scenario task's run (every call and the validation of "
        "the final answer), successful scenarios." + _ESTIMATED,
        "app_e2e_counts",
        hist.MS,
        0.001,
        SECONDS_BOUNDS,
    ),
    _Histogram(
        "routewatch_output_speed_tokens_per_second",
        "Streamed output tokens per second after the first token, successful probes." + _ESTIMATED,
        "tps_counts",
        hist.TPS,
        1.0,
        TPS_BOUNDS,
    ),
)


def buckets(
    counts: dict[int, int], scale: hist.Scale, factor: float, bounds: Sequence[float]
) -> tuple[list[tuple[str, float]], float]:
    """Cumulative (le, count) buckets of a rollup histogram, ending with +Inf, and the sum
    estimated from the buckets' representatives (in the exported unit)."""
    per_bound = [0] * (len(bounds) + 1)
    total = 0.0
    for index in sorted(counts):
        n = counts[index]
        value = scale.representative(index) * factor
        total += value * n
        per_bound[bisect.bisect_left(bounds, value)] += n
    out: list[tuple[str, float]] = []
    seen = 0
    for bound, n in zip([*bounds, float("inf")], per_bound, strict=True):
        seen += n
        out.append(("+Inf" if math.isinf(bound) else repr(bound), float(seen)))
    return out, total


def _timestamp(when: datetime | None) -> float | None:
    return when.timestamp() if when is not None else None


# Before any rollup row (the counters' start).
ALL_TIME = datetime(2000, 1, 1, tzinfo=UTC)


class RollupCollector(Collector):
    """Reads the rollups, winners, heartbeats and queue depths once per `collect()`."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def collect(self) -> Iterable[Metric]:
        tasks = dict(Task.objects.values_list("pk", "slug"))
        regions = list(Region.objects.all())
        region_slugs = {g.pk: g.slug for g in regions}
        routes = {r.pk: r for r in Route.objects.select_related("provider")}

        def labels(key: tuple[int | None, ...]) -> list[str] | None:
            task_id, route_id, region_id = key
            if task_id not in tasks or route_id not in routes or region_id not in region_slugs:
                return None  # deleted meanwhile
            return [tasks[task_id], str(route_id), region_slugs[region_id]]

        # Every daily row; the settled days kept between scrapes (read again after a late
        # write into one, rollups.LATE_WRITES): a year of them took 1.1-1.4 s to sum.
        all_time = {
            k: (labels(k), s)
            for k, s in rollups.stats_over(
                since=ALL_TIME,
                until=self.now + timedelta(hours=1),
                grain=GRAIN_DAY,
                key_fields=["task_id", "route_id", "region_id"],
                all_regions=False,
                keep_settled=True,
            ).items()
        }
        since = self.now - board.WINDOW
        recent = {
            k: (labels(k), s)
            for k, s in rollups.stats_by(
                rollups.rows(since=since, until=self.now + timedelta(hours=1), grain=GRAIN_HOUR),
                ["task_id", "route_id", "region_id"],
                histograms=False,
            ).items()
        }
        ordered = sorted(((lv, s) for lv, s in all_time.values() if lv is not None))
        yield from _counters(ordered)
        yield from _histograms(ordered)
        yield from _ratios(sorted((lv, s) for lv, s in recent.values() if lv is not None))
        yield _route_info(routes)
        yield from _winners(self.now, routes)
        yield from _heartbeats()
        yield from _queues([g.queue_name for g in regions])
        yield from _schedules(self.now)
        yield from alert_metrics.families()


def _counters(series: list[tuple[list[str], Stats]]) -> Iterator[Metric]:
    """The counter families. Long for its declarations (each family with its help text, as a
    scraper shows it), then one pass over the series filling them."""
    probes = CounterMetricFamily(
        "routewatch_probes",
        "Probes recorded, by outcome: ok, error (the probe failed), missed (no result came "
        "back by the slot's deadline).",
        labels=[*_KEY, "outcome"],
    )
    errors = CounterMetricFamily(
        "routewatch_probe_errors",
        "Failed probes by error kind (probes.errors.Kind) and the party it blames: provider, "
        "network, config, engine, monitor.",
        labels=[*_KEY, "kind", "blame"],
    )
    provider_errors = CounterMetricFamily(
        "routewatch_provider_errors",
        "Failures that count against the provider (blame provider or network): the numerator "
        "of availability.",
        labels=list(_KEY),
    )
    attempts = CounterMetricFamily(
        "routewatch_provider_attempts",
        "Probes that tell about the provider's availability: successes plus the failures "
        "that count against it (the denominator of availability).",
        labels=list(_KEY),
    )
    graded = CounterMetricFamily(
        "routewatch_quality_graded", "Probes graded against an eval case.", labels=list(_KEY)
    )
    passed = CounterMetricFamily(
        "routewatch_quality_passed", "Graded probes whose answer passed.", labels=list(_KEY)
    )
    cache_reports = CounterMetricFamily(
        "routewatch_cache_reports",
        "Probes for which the provider reported its cached input tokens (0 included).",
        labels=list(_KEY),
    )
    cache_hits = CounterMetricFamily(
        "routewatch_cache_hits",
        "Probes for which the provider reported more than 0 cached input tokens.",
        labels=list(_KEY),
    )
    tokens = CounterMetricFamily(
        "routewatch_tokens",
        "Tokens billed by the provider, by type: input (cached included) or output "
        "(reasoning included).",
        labels=[*_KEY, "type"],
    )
    cached_tokens = CounterMetricFamily(
        "routewatch_cached_input_tokens",
        "Input tokens the provider reported served from its cache.",
        labels=list(_KEY),
    )
    spend = CounterMetricFamily(
        "routewatch_spend_usd",
        "Cost of the probes in US dollars, from their tokens and the route's prices.",
        labels=list(_KEY),
    )
    last_probe = GaugeMetricFamily(
        "routewatch_last_probe_timestamp_seconds",
        "Unix time of the latest probe that ran (ok or error; not missed).",
        labels=list(_KEY),
    )
    last_ok = GaugeMetricFamily(
        "routewatch_last_success_timestamp_seconds",
        "Unix time of the latest successful probe.",
        labels=list(_KEY),
    )
    for lv, s in series:
        probes.add_metric([*lv, "ok"], s.count_ok)
        probes.add_metric([*lv, "error"], s.count_error)
        probes.add_metric([*lv, "missed"], s.count_missed)
        for kind, n in sorted(_known_kinds(s.error_kinds).items()):
            errors.add_metric([*lv, kind.value, kind.blame.value], n)
        provider_errors.add_metric(lv, s.provider_errors)
        attempts.add_metric(lv, s.attempts)
        graded.add_metric(lv, s.graded)
        passed.add_metric(lv, s.passed)
        cache_reports.add_metric(lv, s.cache_reported)
        cache_hits.add_metric(lv, s.cache_hits)
        tokens.add_metric([*lv, "input"], s.input_tokens)
        tokens.add_metric([*lv, "output"], s.output_tokens)
        cached_tokens.add_metric(lv, s.cached_tokens)
        spend.add_metric(lv, float(s.cost_usd))
        if (at := _timestamp(s.last_probe_at)) is not None:
            last_probe.add_metric(lv, at)
        if (at := _timestamp(s.last_ok_at)) is not None:
            last_ok.add_metric(lv, at)
    yield from (probes, errors, provider_errors, attempts, graded, passed)
    yield from (cache_reports, cache_hits, tokens, cached_tokens, spend, last_probe, last_ok)


def _known_kinds(error_kinds: dict[str, int]) -> dict[Kind, int]:
    """Error kinds as Kind members; a stored kind we no longer know is left out (a label
    value must come from a bounded set), and logged."""
    out: dict[Kind, int] = {}
    for name, n in error_kinds.items():
        try:
            kind = Kind(name)
        except ValueError:
            log.warning("metrics: unknown error kind %r left out", name[:40])
            continue
        out[kind] = out.get(kind, 0) + n
    return out


def _histograms(series: list[tuple[list[str], Stats]]) -> Iterator[Metric]:
    for h in _HISTOGRAMS:
        family = HistogramMetricFamily(h.name, h.help, labels=list(_KEY))
        for lv, s in series:
            counts: dict[int, int] = getattr(s, h.column)
            if counts:
                bucket_list, total = buckets(counts, h.scale, h.factor, h.bounds)
                family.add_metric(lv, bucket_list, total)
        yield family


def _ratios(series: list[tuple[list[str], Stats]]) -> Iterator[Metric]:
    hours = int(board.WINDOW.total_seconds() // 3600)
    window = f"over the last {hours} h (the overview's window)"
    error_ratio = GaugeMetricFamily(
        "routewatch_provider_error_ratio",
        f"Failures that count against the provider out of its attempts, {window}; from "
        "routewatch_provider_errors_total / routewatch_provider_attempts_total.",
        labels=list(_KEY),
    )
    pass_ratio = GaugeMetricFamily(
        "routewatch_quality_pass_ratio",
        f"Graded probes that passed, {window}.",
        labels=list(_KEY),
    )
    cache_ratio = GaugeMetricFamily(
        "routewatch_cache_hit_ratio",
        f"Probes with cached input tokens out of those where the provider reported them, {window}.",
        labels=list(_KEY),
    )
    for lv, s in series:
        for family, value in (
            (error_ratio, s.provider_error_rate),
            (pass_ratio, s.pass_rate),
            (cache_ratio, s.cache_hit_rate),
        ):
            if value is not None:  # no attempts, nothing graded, never reported: no sample
                family.add_metric(lv, value)
    yield from (error_ratio, pass_ratio, cache_ratio)


def _route_info(routes: dict[int, Route]) -> Metric:
    info = InfoMetricFamily(
        "routewatch_route",
        "A route's provider (slug) and model id; join on `route` for readable labels.",
        labels=["route"],
    )
    for pk in sorted(routes):
        route = routes[pk]
        info.add_metric([str(pk)], {"provider": route.provider.slug, "model": route.model_id})
    return info


def _winners(now: datetime, routes: dict[int, Route]) -> Iterator[Metric]:
    info = InfoMetricFamily(
        "routewatch_winner",
        "The fastest qualifying route of each task and region, as the overview shows it.",
        labels=["task", "region"],
    )
    present = GaugeMetricFamily(
        "routewatch_winner_present",
        "1 when a route qualifies for the task in the region, 0 when none does.",
        labels=["task", "region"],
    )
    since = GaugeMetricFamily(
        "routewatch_winner_since_timestamp_seconds",
        "Unix time since which the current winner has been the winner.",
        labels=["task", "region"],
    )
    for row in board.current(now).rows:
        for cell in row.cells:
            key = [row.task.slug, cell.region_slug]
            route = routes.get(cell.route_id) if cell.route_id is not None else None
            present.add_metric(key, 1 if route is not None else 0)
            if route is None:
                continue
            info.add_metric(
                key,
                {
                    "route": str(route.pk),
                    "provider": route.provider.slug,
                    "model": route.model_id,
                },
            )
            if (at := _timestamp(cell.winner_since)) is not None:
                since.add_metric(key, at)
    yield from (info, present, since)


def _heartbeats() -> Iterator[Metric]:
    beats = {
        h.name: h for h in Heartbeat.objects.filter(name__in=[TICK_HEARTBEAT, REJECTED_COUNTER])
    }
    last_tick = GaugeMetricFamily(
        "routewatch_scheduler_last_tick_timestamp_seconds",
        "Unix time of the scheduler's (beat's) latest tick.",
    )
    ticks = CounterMetricFamily("routewatch_scheduler_ticks", "Ticks the scheduler has run.")
    tick = beats.get(TICK_HEARTBEAT)
    if tick is not None:
        last_tick.add_metric([], tick.last_seen.timestamp())
    ticks.add_metric([], tick.count if tick else 0)
    rejected = CounterMetricFamily(
        "routewatch_ingest_rejected_results",
        "Results (and race results) ingest refused: malformed, unsigned, or for no open slot.",
    )
    refused = beats.get(REJECTED_COUNTER)
    rejected.add_metric([], refused.count if refused else 0)
    yield from (last_tick, ticks, rejected)


def _queues(region_queues: Sequence[str]) -> Iterator[Metric]:
    """Queue depths, unacknowledged and dead-lettered messages (monitor.pipeline.queues, the
    figures the Status page shows); routewatch_broker_up 0 when Redis does not answer."""
    figures = queues.broker_figures(region_queues)
    up = GaugeMetricFamily(
        "routewatch_broker_up", "1 when the broker (Redis) answered this scrape, 0 when not."
    )
    up.add_metric([], 0 if figures is None else 1)
    depth = GaugeMetricFamily(
        "routewatch_queue_depth",
        "Messages waiting in a Celery queue: probes.<region> (probe batches), ingest "
        "(results), default (the scheduler's own tasks).",
        labels=["queue"],
    )
    unacked = GaugeMetricFamily(
        "routewatch_unacked_messages", "Messages taken by a worker, not yet acknowledged."
    )
    letters = GaugeMetricFamily(
        "routewatch_dead_letters", "Ingest messages parked after their retries (Status page)."
    )
    if figures is not None:
        for queue, n in figures["depths"].items():
            depth.add_metric([queue], n)
        unacked.add_metric([], figures["unacked"])
        letters.add_metric([], figures["dead_letters"])
    yield from (up, depth, unacked, letters)


def _schedules(now: datetime) -> Iterator[Metric]:
    """Monitoring health per region (monitor.pages.monitoring, the Status page's table): is
    each region keeping its schedule, and do its workers live."""
    slots = GaugeMetricFamily(
        "routewatch_region_slots",
        "Live slots of a region over a trailing window (1h, 24h) by state: probed (the probe "
        "ran, ok or error), missed (no result by the deadline, or not started: too late), late "
        "(of the missed, those not started because past the start-lag bound).",
        labels=["region", "window", "state"],
    )
    lag_p50, lag_p99 = (
        GaugeMetricFamily(
            f"routewatch_region_start_lag_{q}_seconds",
            f"The {q} of planned start to actual start of a region's probes over the last "
            "hour (absent with too few probes).",
            labels=["region"],
        )
        for q in ("p50", "p99")
    )
    open_slots = GaugeMetricFamily(
        "routewatch_region_open_slots",
        "Slots sent to a region and not yet closed (no result yet, deadline not passed).",
        labels=["region"],
    )
    live = GaugeMetricFamily(
        "routewatch_region_workers_live",
        "Region workers whose liveness beacon is current (absent when the broker is down).",
        labels=["region"],
    )
    in_flight = GaugeMetricFamily(
        "routewatch_region_probes_in_flight",
        "Probes (and scenarios) a region's live workers are running now.",
        labels=["region"],
    )
    capacity = GaugeMetricFamily(
        "routewatch_region_probe_capacity",
        "The bound on probes in flight of a region's live workers (RW_PROBES_IN_FLIGHT each).",
        labels=["region"],
    )
    seen = GaugeMetricFamily(
        "routewatch_region_worker_last_seen_timestamp_seconds",
        "Unix time a worker of the region last wrote its beacon (the worker's clock).",
        labels=["region"],
    )
    for h in monitoring.regions_health(now):
        slug = h.region.slug
        for window, schedule in (("1h", h.hour), ("24h", h.day)):
            slots.add_metric([slug, window, "probed"], schedule.probed)
            slots.add_metric([slug, window, "missed"], schedule.missed)
            slots.add_metric([slug, window, "late"], schedule.late)
        for family, value in ((lag_p50, h.hour.lag_p50), (lag_p99, h.hour.lag_p99)):
            if value is not None:
                family.add_metric([slug], value / 1000)
        open_slots.add_metric([slug], h.open_slots)
        if h.workers is not None:
            live.add_metric([slug], len(h.workers))
            in_flight.add_metric([slug], h.in_flight)
            capacity.add_metric([slug], h.capacity)
        if (at := h.worker_seen_at) is not None:
            seen.add_metric([slug], at.timestamp())
    yield from (slots, lag_p50, lag_p99, open_slots, live, in_flight, capacity, seen)


def exposition(accept: str, now: datetime) -> tuple[bytes, str]:
    """The scrape's body and content type, in the format the Accept header asks for."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RollupCollector(now))
    encoder, content_type = choose_encoder(accept)
    if encoder is generate_latest:  # text 0.0.4, what Prometheus asks for by default
        return text_exposition(registry), content_type
    return encoder(registry), content_type


# prometheus_client's own text of a sample's value (+Inf, NaN, Go's exponents); typed here.
_go_float = cast(Callable[[float], str], floatToGoString)
# Prometheus text 0.0.4: sample lines are escaped with underscores (generate_latest's default).
_UNDERSCORES = openmetrics.UNDERSCORES
# OpenMetrics-only samples generate_latest moves into gauges of their own after a family.
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")


def text_exposition(collector: Collector) -> bytes:
    """prometheus_client's generate_latest(collector), byte for byte, at a fraction of its
    CPU: a scrape has ~15,000 samples whose few label names and values generate_latest
    validates and escapes again on every line (80% of a scrape's CPU on the 30-day data set).
    Here each distinct name and value is escaped once, by the library's own functions.
    tests/monitor/pages/test_metrics.py holds the two equal."""
    metric_names: dict[str, str] = {}
    label_names: dict[str, str] = {}
    label_values: dict[str, str] = {}
    numbers: dict[float, str] = {}  # bucket counts repeat: most values are small integers

    def metric_name(name: str) -> str:
        escaped = metric_names.get(name)
        if escaped is None:
            escaped = metric_names[name] = openmetrics.escape_metric_name(name, _UNDERSCORES)
        return escaped

    def label(name: str, value: str) -> str:
        key = label_names.get(name)
        if key is None:
            key = label_names[name] = openmetrics.escape_label_name(name, _UNDERSCORES)
        escaped = label_values.get(value)
        if escaped is None:
            # As generate_latest: label values may hold any UTF-8; \\, newline and " escaped.
            escaped = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
            label_values[value] = escaped
        return f'{key}="{escaped}"'

    def line(sample: Sample) -> str:
        labels = sample.labels
        text = (
            "{" + ",".join([label(k, v) for k, v in sorted(labels.items())]) + "}" if labels else ""
        )
        stamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
        value = numbers.get(sample.value)
        if value is None:
            value = _go_float(sample.value)
            if sample.value:  # not 0.0 and -0.0 under one key
                numbers[sample.value] = value
        return f"{metric_name(sample.name)}{text} {value}{stamp}\n"

    def header(name: str, documentation: str, kind: str) -> str:
        doc = documentation.replace("\\", r"\\").replace("\n", r"\n")
        escaped = metric_name(name)
        return f"# HELP {escaped} {doc}\n# TYPE {escaped} {kind}\n"

    output: list[str] = []
    for metric in collector.collect():
        name, kind = metric.name, metric.type
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name, kind = name + "_info", "gauge"
        elif kind == "stateset":
            kind = "gauge"
        elif kind == "gaugehistogram":
            kind = "histogram"
        elif kind == "unknown":
            kind = "untyped"
        output.append(header(name, metric.documentation, kind))
        moved: dict[str, list[str]] = {}
        for sample in metric.samples:
            suffix = next((x for x in _OM_SUFFIXES if sample.name == metric.name + x), None)
            if suffix is None:
                output.append(line(sample))
            else:
                moved.setdefault(suffix, []).append(line(sample))
        for suffix, lines in sorted(moved.items()):
            output.append(header(metric.name + suffix, metric.documentation, "gauge"))
            output.extend(lines)
    return "".join(output).encode("utf-8")
