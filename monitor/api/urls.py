"""The read API for applications, version 1 (included under /api/v1/ by monitor.urls)."""

from __future__ import annotations

from django.urls import path

from monitor.api import views

urlpatterns = [
    path("tasks/", views.task_list, name="rw-api-tasks"),
    path("tasks/<slug:slug>/route", views.task_route, name="rw-api-task-route"),
    path("routes/", views.route_list, name="rw-api-routes"),
    path("openapi.json", views.openapi_description, name="rw-api-openapi"),
    path("docs", views.docs, name="rw-api-docs"),
]
