from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from monitor import logins
from monitor.pages import views

admin.site.site_header = "Routewatch administration"
admin.site.site_title = "Routewatch admin"

urlpatterns = [
    path("", views.overview, name="rw-overview"),
    path("healthz", views.healthz, name="rw-healthz"),
    path("tasks/<slug:slug>/", views.task_detail, name="rw-task"),
    path("routes/<int:pk>/", views.route_detail, name="rw-route"),
    path("regions/", views.regions, name="rw-regions"),
    path("log/", views.probe_log, name="rw-log"),
    path("races/", views.races, name="rw-races"),
    path("demo-history/", views.demo_history, name="rw-demo-history"),
    path("export/results.<str:fmt>", views.export, name="rw-export"),
    path("metrics", views.metrics, name="rw-metrics"),
    path("status/", views.status, name="rw-status"),
    path("status/replay-dead-letters", views.replay_dead_letters, name="rw-replay-dead-letters"),
    # Both login doors throttle by client address (monitor.logins) before axes' lockout.
    path("accounts/login/", logins.throttled(auth_views.LoginView.as_view()), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/login/", logins.throttled(admin.site.login)),
    path("admin/", admin.site.urls),
    path("api/v1/", include("monitor.api.urls")),
    path("", include("monitor.digest.urls")),
    path("", include("monitor.alerts.urls")),
]
