"""A web worker's long-lived heap is frozen out of the collector's full passes once loaded
(monitor.wsgi): its templates compiled and URL patterns loaded first, so the pages' first
reads add little for a full pass to walk in the middle of a later request."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from django.db import connection

from monitor import heap
from tests import support

WORKER = """
import gc, json
import monitor.wsgi
from django.template import engines
from django.template.loaders.cached import Loader
from django.urls import get_resolver

loader = engines["django"].engine.template_loaders[0]
loader = getattr(loader, "loaders", [loader])[0]  # inside template_partials' loader
assert isinstance(loader, Loader), loader
cached = sorted(loader.get_template_cache)
frozen, unfrozen = gc.get_freeze_count(), len(gc.get_objects())
# What the first requests would load: nothing new once warmed.
monitor.wsgi.warm()
threshold = gc.get_threshold()


def full_passes_in_reads(young):
    # 40 reads, each holding 15,000 tracked objects (a route page's rows, histograms and
    # contexts) until it ends; the full passes the collector starts meanwhile.
    gc.collect()
    gc.set_threshold(young, threshold[1], threshold[2])
    passes = []
    hook = lambda phase, info: passes.append(1) if phase == "start" and info["generation"] == 2 else None
    gc.callbacks.append(hook)
    for _ in range(40):
        read = [{"hour": i, "pairs": [i, i + 1]} for i in range(7_500)]
        del read
    gc.callbacks.remove(hook)
    return len(passes)


print(json.dumps({
    "cached": cached, "again": len(loader.get_template_cache), "frozen": frozen,
    "unfrozen": unfrozen, "urls_loaded": "url_patterns" in get_resolver().__dict__,
    "threshold": threshold, "passes": full_passes_in_reads(threshold[0]),
    "passes_at_700": full_passes_in_reads(700),
}))
"""


def _worker() -> Any:
    env = {
        **support.child_env(connection.settings_dict),
        "DJANGO_SETTINGS_MODULE": "monitor.settings",
    }
    done = subprocess.run(
        [sys.executable, "-c", WORKER],
        env=env,
        cwd=support.ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_worker_compiles_every_template_and_freezes_it_with_what_it_loaded() -> None:
    found = _worker()
    ours = sorted(
        p.relative_to(support.ROOT / "templates").as_posix()
        for p in (support.ROOT / "templates").rglob("*.html")
    )
    assert ours
    assert set(ours) <= set(found["cached"])
    assert found["again"] == len(found["cached"])
    assert found["urls_loaded"] is True
    # The startup heap (Django, the project, the templates) is frozen; what is left for a full
    # pass to walk right after the start is a small fraction of it.
    assert found["frozen"] > 100_000
    assert found["unfrozen"] < found["frozen"] // 20


def test_a_worker_collects_young_objects_rarely_enough_that_a_read_starts_no_full_pass() -> None:
    """At CPython's 700, a read's objects still in use are promoted mid-read and start full
    passes (monitor.heap); at the web process's threshold, far fewer."""
    found = _worker()
    assert found["threshold"][0] == heap.YOUNG_THRESHOLD
    assert found["passes_at_700"] >= 5
    assert found["passes"] * 5 <= found["passes_at_700"], found
