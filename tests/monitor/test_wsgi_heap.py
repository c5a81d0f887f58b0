"""A web worker's long-lived heap is frozen out of the collector's full passes once loaded
(monitor.wsgi): its templates compiled and URL patterns loaded first, so the pages' first
reads add little for a full pass to walk in the middle of a later request."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from django.db import connection

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
print(json.dumps({
    "cached": cached, "again": len(loader.get_template_cache), "frozen": frozen,
    "unfrozen": unfrozen, "urls_loaded": "url_patterns" in get_resolver().__dict__,
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
