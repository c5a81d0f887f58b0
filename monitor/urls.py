from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from monitor import views

admin.site.site_header = "Routewatch administration"
admin.site.site_title = "Routewatch admin"

urlpatterns = [
    path("", views.overview, name="rw-overview"),
    path("healthz", views.healthz, name="rw-healthz"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("", include("monitor.digest_urls")),
]
