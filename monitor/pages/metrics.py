"""Prometheus text exposition (format 0.0.4) of recent figures per task, route and region.

Read from the hourly rollups of the current and the previous hour (so a scrape just after the
hour still has samples). Percentiles the histograms cannot give (too few samples) are left
out rather than exported as 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from monitor.models import GRAIN_HOUR, Region, Route, Task
from monitor.pipeline.queues import BrokerFigures
from monitor.stats import rollups

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
WINDOW = timedelta(hours=1)


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    return repr(float(value))


_FAMILIES = [
    ("routewatch_ttft_seconds", "Time to first token, seconds, recent percentiles."),
    ("routewatch_e2e_seconds", "API end-to-end time, seconds, recent percentiles."),
    ("routewatch_tokens_per_second", "Generation speed after the first token, recent percentiles."),
    ("routewatch_error_ratio", "Share of recent probes that failed or were missed."),
    ("routewatch_probes", "Probes in the window (ok, error and missed)."),
    ("routewatch_last_probe_timestamp_seconds", "Unix time of the latest probe."),
]


def lines(now: datetime) -> Iterator[str]:
    stats = rollups.stats_by(
        rollups.rows(since=now - WINDOW, until=now + timedelta(hours=1), grain=GRAIN_HOUR),
        ["task_id", "route_id", "region_id"],
    )
    tasks = {t.pk: t for t in Task.objects.all()}
    routes = {r.pk: r for r in Route.objects.select_related("provider")}
    regions = {g.pk: g for g in Region.objects.all()}
    samples: dict[str, list[str]] = {name: [] for name, _ in _FAMILIES}
    for (task_id, route_id, region_id), s in sorted(
        stats.items(), key=lambda kv: tuple(k or 0 for k in kv[0])
    ):
        task, route, region = (
            tasks.get(task_id or 0),
            routes.get(route_id or 0),
            regions.get(region_id or 0),
        )
        if task is None or route is None or region is None:
            continue
        base = {
            "task": task.slug,
            "route": str(route.pk),
            "provider": route.provider.name,
            "model": route.model_id,
            "region": region.slug,
        }
        for q in (50, 95):
            quantile = {"quantile": str(q / 100)}
            ttft, e2e, tps = s.ttft_ms(q), s.e2e_ms(q), s.tps(q)
            if ttft is not None:
                samples["routewatch_ttft_seconds"].append(
                    f"routewatch_ttft_seconds{_labels(**base, **quantile)} {_num(ttft / 1000)}"
                )
            if e2e is not None:
                samples["routewatch_e2e_seconds"].append(
                    f"routewatch_e2e_seconds{_labels(**base, **quantile)} {_num(e2e / 1000)}"
                )
            if tps is not None:
                samples["routewatch_tokens_per_second"].append(
                    f"routewatch_tokens_per_second{_labels(**base, **quantile)} {_num(tps)}"
                )
        if s.error_rate is not None:
            samples["routewatch_error_ratio"].append(
                f"routewatch_error_ratio{_labels(**base)} {_num(s.error_rate)}"
            )
        samples["routewatch_probes"].append(f"routewatch_probes{_labels(**base)} {s.count}")
        if s.last_probe_at is not None:
            samples["routewatch_last_probe_timestamp_seconds"].append(
                f"routewatch_last_probe_timestamp_seconds{_labels(**base)} "
                f"{_num(s.last_probe_at.timestamp())}"
            )
    for name, help_text in _FAMILIES:
        yield f"# HELP {name} {help_text}\n"
        yield f"# TYPE {name} gauge\n"
        for sample in samples[name]:
            yield sample + "\n"


def broker_lines(figures: BrokerFigures | None) -> Iterator[str]:
    """Queue depths, unacknowledged and dead-lettered messages (monitor.pipeline.queues);
    routewatch_broker_up 0 when Redis does not answer."""
    yield "# HELP routewatch_broker_up Whether the broker (Redis) answered this scrape.\n"
    yield "# TYPE routewatch_broker_up gauge\n"
    yield f"routewatch_broker_up {0 if figures is None else 1}\n"
    if figures is None:
        return
    yield "# HELP routewatch_queue_depth Messages waiting in a broker queue.\n"
    yield "# TYPE routewatch_queue_depth gauge\n"
    for queue, depth in figures["depths"].items():
        yield f"routewatch_queue_depth{_labels(queue=queue)} {depth}\n"
    yield "# HELP routewatch_unacked_messages Messages taken by a worker, not yet acknowledged.\n"
    yield "# TYPE routewatch_unacked_messages gauge\n"
    yield f"routewatch_unacked_messages {figures['unacked']}\n"
    yield "# HELP routewatch_dead_letters Ingest messages parked after their retries.\n"
    yield "# TYPE routewatch_dead_letters gauge\n"
    yield f"routewatch_dead_letters {figures['dead_letters']}\n"
