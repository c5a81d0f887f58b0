from __future__ import annotations

import os
from pathlib import Path
from typing import cast

from django.core.wsgi import get_wsgi_application

from monitor import db_priority, heap

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


# The startup heap frozen, the collector's thresholds set (monitor.heap).
warm()
heap.settle()
# Its database sessions at its CPU priority, where PostgreSQL runs here (monitor.db_priority).
db_priority.install()
