"""The pages bench-load reads during the load (bench/bench_load.py): one after another, each
read's server time, SQL, CPU and waits for a CPU (Linux schedstat), by phase when the workers'
nice alternates.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

# The first table a query reads (its FROM), to name it in the report.
TABLE = re.compile(r'FROM\s+"?(\w+)"?', re.IGNORECASE)


class Pages(threading.Thread):
    """Reads every page, one after the other, until stopped; server time per page (ms)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.times: dict[str, list[float]] = {}
        self.sql: dict[str, list[float]] = {}  # of each read, the time its queries took (ms)
        # Of each read, the CPU time of the reading thread (ms): the rest of its server time is
        # its queries and waiting for a CPU.
        self.cpu: dict[str, list[float]] = {}
        # Of each read, the time the reading thread waited for a CPU while runnable, and the CPU
        # time and CPU wait of the PostgreSQL backend serving it (ms; Linux schedstat).
        self.wait: dict[str, list[float]] = {}
        self.pg_cpu: dict[str, list[float]] = {}
        self.pg_wait: dict[str, list[float]] = {}
        self.queries: dict[str, int] = {}  # queries of the page's last read
        # Of each page, each query's times (ms), by its table and place in the page.
        self.per_query: dict[str, dict[str, list[float]]] = {}
        self.failed = 0
        # --alternate-nice: the workers' nice value when each read started, and each read's
        # time by it (page -> nice -> ms).
        self.phase: int | None = None
        self.by_phase: dict[str, dict[int, list[float]]] = {}

    def urls(self) -> list[tuple[str, str]]:
        from monitor.models import Route, Task

        task = Task.objects.order_by("pk").first()
        route = Route.objects.order_by("pk").first()
        assert task is not None
        assert route is not None
        return [
            ("overview", "/"),
            ("task, 24 h", f"/tasks/{task.slug}/"),
            ("route, 24 h", f"/routes/{route.pk}/?task={task.slug}"),
            ("regions", "/regions/"),
            ("probe log", "/log/"),
            ("status", "/status/"),
        ]

    def once(self, client: Any, urls: list[tuple[str, str]]) -> None:
        from django.db import connection

        spent: list[float] = []
        labels: list[str] = []

        def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            t = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                spent.append((time.perf_counter() - t) * 1000)
                table = TABLE.search(sql)
                labels.append(f"#{len(labels) + 1} {table.group(1) if table else sql[:30]}")

        for name, url in urls:
            spent.clear()
            labels.clear()
            phase = self.phase
            connection.ensure_connection()
            backend = f"/proc/{connection.connection.info.backend_pid}/schedstat"
            with connection.execute_wrapper(timed):
                _, w0 = _schedstat("/proc/thread-self/schedstat")
                b0 = _schedstat(backend)
                t0, c0 = time.perf_counter(), time.thread_time()
                response = client.get(url)
                if getattr(response, "streaming", False):
                    b"".join(response.streaming_content)
                ms = (time.perf_counter() - t0) * 1000
                cpu_ms = (time.thread_time() - c0) * 1000
                _, w1 = _schedstat("/proc/thread-self/schedstat")
                b1 = _schedstat(backend)
            self.wait.setdefault(name, []).append(w1 - w0)
            self.pg_cpu.setdefault(name, []).append(b1[0] - b0[0])
            self.pg_wait.setdefault(name, []).append(b1[1] - b0[1])
            if response.status_code != 200:
                self.failed += 1
            self.times.setdefault(name, []).append(ms)
            self.sql.setdefault(name, []).append(sum(spent))
            self.cpu.setdefault(name, []).append(cpu_ms)
            if phase is not None and phase == self.phase:  # not across a switch
                self.by_phase.setdefault(name, {}).setdefault(phase, []).append(ms)
            self.queries[name] = len(spent)
            page = self.per_query.setdefault(name, {})
            for label, ms in zip(labels, spent, strict=True):
                page.setdefault(label, []).append(ms)

    def run(self) -> None:
        from django.contrib.auth.models import User
        from django.db import connection
        from django.test import Client

        user, _ = User.objects.get_or_create(username="bench-load", is_staff=True)
        client = Client(SERVER_NAME="localhost")
        client.force_login(user)
        urls = self.urls()
        try:
            while not self.stop.is_set():
                self.once(client, urls)
                self.stop.wait(0.5)
        finally:
            connection.close()


def _schedstat(path: str) -> tuple[float, float]:
    """(CPU time, time runnable but waiting for a CPU) so far of a thread or process, in ms."""
    try:
        with open(path) as f:
            ran, waited, _ = f.read().split()
    except (OSError, ValueError):
        return (0.0, 0.0)
    return (int(ran) / 1e6, int(waited) / 1e6)
