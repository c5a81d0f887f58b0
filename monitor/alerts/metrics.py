"""Alert states for /metrics (monitor.pages.metrics adds these families to each scrape)."""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from monitor.alerts.models import (
    SEND_STATUSES,
    STATE_FIRING,
    STATE_PENDING,
    Alert,
    AlertNotification,
)


def families() -> Iterator[Metric]:
    alerts = GaugeMetricFamily(
        "routewatch_alerts",
        "Open alerts by task, rule (id), rule kind and state (pending: breached, not yet for "
        "the rule's minimum duration; firing: notified). Resolved alerts are not counted.",
        labels=["task", "rule", "kind", "state"],
    )
    rows = (
        Alert.objects.filter(state__in=[STATE_PENDING, STATE_FIRING])
        .values("rule__task__slug", "rule_id", "rule__kind", "state")
        .annotate(n=Count("pk"))
        .order_by("rule__task__slug", "rule_id", "state")
    )
    for row in rows:
        alerts.add_metric(
            [row["rule__task__slug"], str(row["rule_id"]), row["rule__kind"], row["state"]],
            row["n"],
        )
    deliveries = GaugeMetricFamily(
        "routewatch_alert_notifications",
        "Alert notifications by channel kind and status (pending: not yet sent or being "
        "retried; sent; failed: given up after its retries).",
        labels=["channel_kind", "status"],
    )
    counts = {
        (r["channel__kind"], r["status"]): r["n"]
        for r in AlertNotification.objects.values("channel__kind", "status").annotate(n=Count("pk"))
    }
    kinds = sorted({k for k, _ in counts})
    for kind in kinds:
        for status, _ in SEND_STATUSES:
            deliveries.add_metric([kind, status], counts.get((kind, status), 0))
    yield from (alerts, deliveries)
