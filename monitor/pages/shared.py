"""A page's body built once for every viewer: its figures read from the rollups and rendered.

The costly part of a dashboard page is its body (the overview's rows, the regions matrix, the
task's ranking, the route's charts, the probe log's filter form and rows, the Status page's
whole body), and it is the same for every reader who asks with the same URL. Built for each
read, six pages watched under load took 150-250 ms at p95 on a 2-core machine, mostly their own
CPU and their wait for one. So a web process keeps each body it built, by what decides its
content, and hands it to the next readers:

- younger than PAGE_SHARE_SECONDS: served as it is;
- older, but younger than PAGE_SHARE_MAX_AGE_SECONDS: served, and built again in the
  background (one build at a time per process; a reader never waits for it);
- older still, or never built: built for this read, as without sharing.

So a body is at most PAGE_SHARE_MAX_AGE_SECONDS old, and says when it was built ("figures as
of"). What decides a body's content is its key: the template part, the path and query, the
reader's choice to hide generated history, and the configuration's version (a counter every
saved or deleted provider, route, region, task, eval case or scenario step adds to, in the
same transaction, so an edit shows at once, in every web process). Nothing in a body depends on
who reads it: the user's name, links for staff and CSRF tokens are rendered per read, outside
it. PAGE_SHARE_SECONDS=0 turns sharing off: every read builds its body (the test suite runs so,
and bench-pages, which measures the build).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from monitor.models import HEARTBEAT_CONFIG_VERSION, Heartbeat
from monitor.pages.http import HtmxHttpRequest

log = logging.getLogger(__name__)

# Bodies a process keeps (least recently read dropped first): ~20-40 KB each.
KEEP = 256

# A body's builder: given the time of the build, the context its template part renders.
Build = Callable[[datetime], dict[str, Any]]
Key = tuple[Any, ...]

_lock = threading.Lock()
_bodies: OrderedDict[Key, tuple[str, float]] = OrderedDict()  # key -> (html, monotonic built)
_building: set[Key] = set()
_builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rw-page-body")


def body(request: HtmxHttpRequest, part: str, build: Build, *, hidden: object = None) -> SafeString:
    """The rendered `part` ("front/x.html#name") for this request, shared as described above.
    `build` must read nothing from the request but what the key holds (path, query, `hidden`)."""
    fresh = float(settings.PAGE_SHARE_SECONDS)
    if fresh <= 0:
        return _render(part, build)
    key: Key = (
        part,
        request.path,
        tuple(sorted((name, tuple(values)) for name, values in request.GET.lists())),
        str(hidden),
        _config_version(),
    )
    with _lock:
        kept = _bodies.get(key)
        if kept is not None:
            _bodies.move_to_end(key)
    if kept is not None:
        html, built = kept
        age = time.monotonic() - built
        if age < fresh:
            return mark_safe(html)  # noqa: S308 (our template's output)
        if age < max(fresh, float(settings.PAGE_SHARE_MAX_AGE_SECONDS)):
            _build_later(key, part, build)
            return mark_safe(html)  # noqa: S308 (our template's output)
    html = _render(part, build)
    _keep(key, html)
    return html


def forget() -> None:
    """Drop every kept body (tests; a process's data changed under it)."""
    with _lock:
        _bodies.clear()


def settle(timeout: float = 60) -> None:
    """Wait for the background builds asked for so far; then close their thread's database
    connections (tests, before their database goes)."""
    _builder.submit(connections.close_all).result(timeout)


def _render(part: str, build: Build) -> SafeString:
    return mark_safe(render_to_string(part, build(timezone.now())))  # noqa: S308


def _keep(key: Key, html: str) -> None:
    with _lock:
        _bodies[key] = (html, time.monotonic())
        _bodies.move_to_end(key)
        while len(_bodies) > KEEP:
            _bodies.popitem(last=False)


def _build_later(key: Key, part: str, build: Build) -> None:
    with _lock:
        if key in _building:
            return
        _building.add(key)
    _builder.submit(_build_in_background, key, part, build)


def _build_in_background(key: Key, part: str, build: Build) -> None:
    # A thread of its own outside any request: Django's request signals never close its
    # connection, so it drops one that broke or outlived CONN_MAX_AGE itself.
    close_old_connections()
    try:
        _keep(key, _render(part, build))
    except Exception:
        # The last body stays until it is too old; then a reader builds it, and sees the error.
        log.exception("building a page body in the background failed: %s", key[:2])
    finally:
        with _lock:
            _building.discard(key)
        close_old_connections()


def _config_version() -> int:
    found = Heartbeat.objects.filter(name=HEARTBEAT_CONFIG_VERSION).values_list("count", flat=True)
    return found.first() or 0
