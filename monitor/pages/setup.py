"""A fresh deployment's overview: what is set up, what is missing, each with its admin link.

Live status, read on each refresh of the empty overview: providers, routes, regions with a
running worker, tasks and eval cases. A region's worker counts as running when results it
signed reached ingest in the last WORKER_FRESH (the `region:<id>` Heartbeat rows written by
monitor.tasks.ingest_results): workers hold no database credentials, so what they deliver is
the proof that they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.urls import reverse
from django.utils import timezone

from monitor.models import EvalCase, Heartbeat, Provider, Region, Route, Task
from monitor.pipeline.ingest.results import region_heartbeat

WORKER_FRESH = timedelta(minutes=10)


@dataclass(frozen=True)
class Step:
    key: str
    label: str
    count: int
    done: bool
    detail: str
    admin_url: str


def setup_checklist(now: datetime | None = None) -> list[Step]:
    now = now or timezone.now()
    providers = Provider.objects.filter(is_active=True)
    keyed = sum(1 for p in providers.only("api_key_encrypted") if p.has_api_key)
    routes = Route.objects.filter(is_active=True, provider__is_active=True).count()
    regions = list(Region.objects.filter(is_active=True).values_list("pk", flat=True))
    alive = set(
        Heartbeat.objects.filter(
            name__in=[region_heartbeat(pk) for pk in regions], last_seen__gte=now - WORKER_FRESH
        ).values_list("name", flat=True)
    )
    running = sum(1 for pk in regions if region_heartbeat(pk) in alive)
    tasks = Task.objects.filter(is_active=True).count()
    cases = EvalCase.objects.filter(is_active=True, task__is_active=True).count()
    n_providers = providers.count()

    def admin(model: str) -> str:
        return reverse(f"admin:monitor_{model}_changelist")

    return [
        Step(
            "providers",
            "Providers",
            n_providers,
            n_providers > 0,
            f"{keyed} of {n_providers} with an API key" if n_providers else "Add one from a preset",
            admin("provider"),
        ),
        Step(
            "routes",
            "Routes",
            routes,
            routes > 0,
            "a model at a provider, with its prices" if not routes else "active",
            admin("route"),
        ),
        Step(
            "regions",
            "Regions with a running worker",
            running,
            bool(regions) and running == len(regions),
            f"{running} of {len(regions)} regions delivered results in the last "
            f"{int(WORKER_FRESH.total_seconds() // 60)} min"
            if regions
            else "Add a region, then start a worker for its queue",
            admin("region"),
        ),
        Step(
            "tasks",
            "Tasks",
            tasks,
            tasks > 0,
            "what to probe, how often, and the bars routes must meet",
            admin("task"),
        ),
        Step(
            "eval-cases",
            "Eval cases",
            cases,
            cases > 0,
            "questions with graders: the quality bar's evidence",
            admin("evalcase"),
        ),
    ]
