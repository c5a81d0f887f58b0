"""Celery tasks of the weekly digest (imported by monitor.tasks so Celery registers them)."""

from __future__ import annotations
