from __future__ import annotations

import gc
import os
from pathlib import Path
from typing import cast

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "monitor.settings")
application = get_wsgi_application()


def warm() -> int:
    """Load now what a worker's first requests would otherwise load and keep for its lifetime:
    the URL patterns and our templates, compiled (Django's cached loader keeps every template
    it compiles: thousands of nodes and tokens). Returns how many templates were compiled."""
    from django.conf import settings
    from django.template import engines
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 (imports every view module)
    engine = engines["django"]
    compiled = 0
    for folder in cast(list[Path], settings.TEMPLATES[0]["DIRS"]):
        for path in sorted(Path(folder).rglob("*.html")):
            engine.get_template(path.relative_to(folder).as_posix())
            compiled += 1
    return compiled


# What is loaded by now (modules, functions, classes, settings, the templates: ~150,000
# objects) lives as long as the process: kept out of the collector's full passes, which
# otherwise walk all of it in the middle of a request (a full pass over the unfrozen heap of
# a process that read every page took 140 ms CPU; regions page reads of 119 and 131 ms with
# one, against 43 at the median). Collected first: garbage frozen would never be freed.
warm()
gc.collect()
gc.freeze()
# A young collection every 20,000 net allocations of tracked objects instead of 700. A page read
# makes tens of thousands (route 7 d: its hours' histograms, rows, template contexts); at 700,
# those still alive two young passes later were promoted to the old generation mid-read, and
# with the frozen heap left out, a few thousand promoted was enough to start a full pass in the
# middle of the next read (53 ms each, 4 in 80 route 7 d reads on 2026-11-28). At 20,000 a
# read's objects are mostly gone before a young pass looks at them: fewer promoted, fewer full
# passes, each over less. Memory: at most 20,000 young objects waiting for a pass (a few MB).
gc.set_threshold(20_000, 10, 10)
