from __future__ import annotations

from django.apps import AppConfig


class MonitorConfig(AppConfig):
    name = "monitor"
    verbose_name = "Routewatch"
    default_auto_field = "django.db.models.BigAutoField"
