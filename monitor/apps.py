from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.db.models.signals import m2m_changed, post_delete, post_save


def without_jit(connection: BaseDatabaseWrapper, **_: Any) -> None:
    """Every connection of ours runs without PostgreSQL's JIT compiler. Our queries are short
    and index-driven, but their cost estimates grow with the data (a route's 7-day comparison
    rows: 71,000 after one day at 3,600 combinations), and past jit_above_cost (100,000) each
    execution compiles first: +25 ms for the route page's comparison rows on PostgreSQL 15,
    +200 ms past jit_optimize_above_cost (500,000), for a query of 120 ms
    (docs/scaling.md). Official PostgreSQL images have JIT on; the embedded server has no JIT.
    A session setting, so poolers that refuse startup options (PgBouncer) are fine."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET jit = off")


def config_changed(**kwargs: Any) -> None:
    """A provider, route, region, task, eval case or scenario step was saved or deleted, or a
    task's routes or regions changed: the configuration's version counts one more, in the same
    transaction, so every web process builds its pages' bodies again (monitor.pages.shared)."""
    from monitor.models import HEARTBEAT_CONFIG_VERSION, Heartbeat

    if kwargs.get("raw"):
        return  # loaddata writes its rows as they are
    if not str(kwargs.get("action", "post_")).startswith("post_"):
        return  # m2m_changed's pre_add, pre_remove, pre_clear: the post_ one follows
    Heartbeat.add(HEARTBEAT_CONFIG_VERSION)


class MonitorConfig(AppConfig):
    name = "monitor"
    verbose_name = "Routewatch"
    default_auto_field = "django.db.models.BigAutoField"

    def import_models(self) -> None:
        """The app's models (monitor.models), then the alerts' (monitor.alerts.models, same app
        label), which build on them: imported here, from the top, so monitor.models never
        imports a package above it."""
        super().import_models()
        import monitor.alerts.models  # noqa: F401

    def ready(self) -> None:
        from monitor.answer import board
        from monitor.logfilters import redact_every_handler
        from monitor.models import EvalCase, Provider, Region, Route, ScenarioStep, Task

        # Logging is configured by now (django.setup runs it before the apps are ready).
        redact_every_handler()

        connection_created.connect(without_jit, dispatch_uid="monitor-without-jit")
        # A configuration change shows at once: the overview's snapshot is dropped, and every
        # page body a web process keeps is built again (monitor.pages.shared).
        for receiver, name in ((board.forget, "forget"), (config_changed, "cfg")):
            for model in (Provider, Route, Region, Task, EvalCase, ScenarioStep):
                post_save.connect(receiver, sender=model, dispatch_uid=f"{name}-{model}")
                post_delete.connect(receiver, sender=model, dispatch_uid=f"{name}-d-{model}")
            for through in (Task.routes.through, Task.regions.through):
                m2m_changed.connect(receiver, sender=through, dispatch_uid=f"{name}-{through}")
