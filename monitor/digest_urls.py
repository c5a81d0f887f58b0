"""URLs of the weekly digest (subscription settings, preview, unsubscribe)."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
