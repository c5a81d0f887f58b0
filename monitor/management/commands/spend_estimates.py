"""`manage.py spend_estimates`: each active task's routes, what a probe is estimated to cost
(monitor.stats.spend: its recent measured usage, the worst case where none) beside what its
measured probes really cost on average over the same window, and the worst case."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand
from django.db.models import Sum
from django.utils import timezone

from monitor.models import GRAIN_HOUR, GeneratedSpan, Rollup, Task
from monitor.stats import rollups, spend


class Command(BaseCommand):
    help = "Print each route's probe cost estimate against its real mean cost per probe."

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        usage = spend.measured_usage(now)
        since = now - spend.USAGE_WINDOW
        span = GeneratedSpan.objects.first()
        rows = Rollup.objects.filter(grain=GRAIN_HOUR, region__isnull=True, bucket_start__gte=since)
        if span is not None:  # as measured_usage: hours after the generated history's last
            rows = rows.filter(bucket_start__gt=rollups.bucket_start(span.last, GRAIN_HOUR))
        real = {
            (r["task_id"], r["route_id"]): (r["cost"] or Decimal(0), r["ok"] or 0)
            for r in rows.values("task_id", "route_id").annotate(
                cost=Sum("cost_usd"), ok=Sum("count_ok")
            )
        }
        self.stdout.write(
            "task / route: estimate, real mean per successful probe (probes), worst case"
        )
        for task in Task.objects.filter(is_active=True).prefetch_related(
            "routes__provider", "steps"
        ):
            for route in task.routes.all():
                estimate = spend.probe_estimate_usd(task, route, usage)
                cost, ok = real.get((task.pk, route.pk), (Decimal(0), 0))
                mean = f"${cost / ok:.5f} ({ok})" if ok else "none measured"
                ratio = f", {estimate / (cost / ok):.2f}x" if ok and cost else ""
                self.stdout.write(
                    f"  {task.slug} / {route}: ${estimate:.5f}, {mean}{ratio},"
                    f" worst ${spend.worst_case_usd(task, route):.5f}"
                )
