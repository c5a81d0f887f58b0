"""URLs of the weekly digest (subscription settings, preview, unsubscribe)."""

from __future__ import annotations

from django.urls import URLPattern, path

from monitor.digest import views as digest_views

urlpatterns: list[URLPattern] = [
    path("digest/", digest_views.settings_page, name="rw-digest-settings"),
    path("digest/preview/", digest_views.preview, name="rw-digest-preview"),
    path("digest/unsubscribe/<str:token>/", digest_views.unsubscribe, name="rw-digest-unsubscribe"),
]
