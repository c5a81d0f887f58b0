"""URLs of alerts: the history page and the signed acknowledge/snooze links."""

from __future__ import annotations

from django.urls import URLPattern, path

from monitor.alerts import views as alert_views

urlpatterns: list[URLPattern] = [
    path("alerts/", alert_views.history, name="rw-alerts"),
    path("alerts/act/<str:token>/", alert_views.action, name="rw-alert-action"),
]
