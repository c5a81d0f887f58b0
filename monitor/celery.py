from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import threading
from pathlib import Path
from typing import Any

from celery import Celery, bootsteps
from celery.signals import celeryd_init, task_postrun, task_prerun, worker_init
from celery.worker.consumer import Consumer

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "monitor.settings")

app = Celery("monitor")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


class ConsumerStarted(bootsteps.StartStopStep):
    """Tells the consumer-liveness watch (monitor.pipeline.region.liveness.Consumer) each time the
    worker's consumer lost its broker connection and each time it has a new one (Celery stops
    its consumer's steps, reconnects, and starts them again): a consumer that is coming back
    is given its time to take a message before it counts as stalled."""

    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, parent: Any) -> None:
        self._mark()

    def stop(self, parent: Any) -> None:
        self._mark()

    @staticmethod
    def _mark() -> None:
        from monitor.tasks import CONSUMER

        CONSUMER.restarted()


app.steps["consumer"].add(ConsumerStarted)

# A consumer that lost its broker tries again after 1 s, then 1 s more each time, and never
# waits more than this between two attempts (each attempt itself is bounded by the broker's
# socket_connect_timeout, RW_BROKER_SOCKET_TIMEOUT_SECONDS).
RECONNECT_INTERVAL_MAX_S = 3.0


class BoundedRetryConsumer(Consumer):
    """Celery's consumer, reconnecting at most RECONNECT_INTERVAL_MAX_S apart (settings'
    CELERY_WORKER_CONSUMER names it). Celery's own calls kombu's ensure_connection with
    kombu's defaults, whatever the transport options say: 2 s, then 2 s more each time, up to
    30 s. After a WAN outage of a minute a worker then waited up to 10 s (and after longer
    ones up to 30 s) before its next attempt, on top of the outage: the region's resume time
    grew with the outage (tests/monitor/pipeline/test_remote_region.py)."""

    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=1.0,
            interval_step=1.0,
            interval_max=RECONNECT_INTERVAL_MAX_S,
        )
        return super().ensure_connected(conn)


# A worker whose Celery gave up ("Unrecoverable error", e.g. kombu's AttributeError while its
# broker connection was being replaced, seen when the broker restarts: celery#10205) is meant
# to stop, but its shutdown can hang on the broken connection and the process never exits,
# so no supervisor starts it again: it exits this long after the error, whatever its
# shutdown is doing (compose's restart policy, systemd or `make run` start it again).
UNRECOVERABLE_EXIT_S = 15.0


class _ExitAfterUnrecoverable(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.CRITICAL)
        self.armed = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.armed or not str(record.msg).startswith("Unrecoverable error"):
            return
        self.armed = True
        timer = threading.Timer(UNRECOVERABLE_EXIT_S, os._exit, args=(70,))
        timer.daemon = True
        timer.start()


@task_prerun.connect
@task_postrun.connect
def _close_old_connections(sender: Any = None, **_: Any) -> None:
    """A task's database connections live as a web request's do: closed around each task only
    when past CONN_MAX_AGE, or unusable after an error (CONN_HEALTH_CHECKS), as Django does at
    every request (settings' CELERY_DB_REUSE_MAX says why Celery's own closing is off). A
    database that restarted costs the task that met it one retry (monitor.tasks), not every
    task after it. A task run eagerly (in its caller, maybe inside its transaction) is left
    alone, as Celery's fixup leaves it."""
    from django.db import close_old_connections

    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    close_old_connections()


@worker_init.connect
def _exit_after_unrecoverable(**_: Any) -> None:
    logging.getLogger("celery").addHandler(_ExitAfterUnrecoverable())


@worker_init.connect
def _freeze_startup_objects(**_: Any) -> None:
    """Move what the worker loaded at start (Django, Celery, the modules, settings) out of the
    collector's reach: a full collection then walks only what probes and tasks made since,
    not the whole startup heap (one full collection a 200-stream run was 3-5% of the engine's
    CPU, py-spy). The threads pool runs every task in this process, so it holds for them."""
    gc.freeze()


AUTOGROUP = Path("/proc/self/autogroup")


def lower_cpu_priority(wanted: int) -> None:
    """Run this process, and the processes and threads it starts after, at nice `wanted`, where
    it is lower than now: an unprivileged process may only lower its priority, and one started
    lower already (`nice -n 15 celery ...`) keeps its own.

    On Linux with autogroups (the default on most distributions' kernels) every session is a
    scheduling group, and a group's share of the CPUs against other sessions is set by the
    group's own nice, not its processes'. A worker leading its own session (`setsid`, a
    supervisor's child, a systemd service) lowers its group's nice too; one sharing a session
    with other programs leaves the group alone. In containers the cgroup's CPU weight decides
    instead (docker-compose.yml's cpu_shares)."""
    if not hasattr(os, "getpriority"):
        return
    if os.getpriority(os.PRIO_PROCESS, 0) < wanted:
        os.setpriority(os.PRIO_PROCESS, 0, wanted)
    if os.getsid(0) != os.getpid():
        return
    with contextlib.suppress(OSError, ValueError, IndexError):
        if int(AUTOGROUP.read_text().split()[-1]) < wanted:
            AUTOGROUP.write_text(str(wanted))


@celeryd_init.connect
def _lower_worker_priority(**_: Any) -> None:
    """Workers (ingest, scheduler; region workers at RW_REGION_WORKER_NICE, 0 by default: their
    start lag counts every wait for a CPU) give the web the CPU first on a shared machine:
    measured with `make bench-load --alternate-nice 0,10`, page p95 under load falls by more
    than half; the price is a few ms on probes' TTFT p99 there (docs/scaling.md)."""
    from django.conf import settings

    region = bool(getattr(settings, "RW_REGION", ""))
    lower_cpu_priority(int(settings.REGION_WORKER_NICE if region else settings.WORKER_NICE))
