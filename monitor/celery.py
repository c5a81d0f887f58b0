from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import celeryd_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "monitor.settings")

app = Celery("monitor")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@celeryd_init.connect
def lower_cpu_priority(**_: Any) -> None:
    """Run this worker, and the pool processes it forks, at RW_WORKER_NICE: where web and workers
    share a machine, the page someone waits on gets a CPU first (README, "Scaling"). Only ever
    lowers the priority (an unprivileged process cannot raise it); a worker started at a lower
    one already (`nice -n 15 celery ...`) keeps it."""
    from django.conf import settings

    wanted = int(settings.WORKER_NICE)
    if hasattr(os, "getpriority") and os.getpriority(os.PRIO_PROCESS, 0) < wanted:
        os.setpriority(os.PRIO_PROCESS, 0, wanted)
