from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import m2m_changed, post_delete, post_save


class MonitorConfig(AppConfig):
    name = "monitor"
    verbose_name = "Routewatch"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from monitor.models import EvalCase, Provider, Region, Route, Task
        from monitor.pages import overview

        # A configuration change shows on the overview at once, not at its next rebuild.
        for model in (Provider, Route, Region, Task, EvalCase):
            post_save.connect(overview.forget, sender=model, dispatch_uid=f"forget-{model}")
            post_delete.connect(overview.forget, sender=model, dispatch_uid=f"forget-d-{model}")
        for through in (Task.routes.through, Task.regions.through):
            m2m_changed.connect(overview.forget, sender=through, dispatch_uid=f"forget-{through}")
