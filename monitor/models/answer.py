"""The answer kept: the overview's snapshot (monitor.answer.board) and the history of each
task's winner per region (monitor.answer.selection)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from monitor.models.providers import Region, Route
from monitor.models.tasks import Task


class OverviewSnapshot(models.Model):
    """A computed page kept ready to read (monitor.answer.board): the same for every reader."""

    key = models.CharField(max_length=50, primary_key=True)
    built_at = models.DateTimeField()
    data = models.JSONField()
    # How long its build took: beat's next rebuild waits for as long (monitor.answer.board).
    build_s = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"{self.key} @ {self.built_at}"


class WinnerChange(models.Model):
    """When and why the fastest qualifying route of a task in a region changed (route None:
    no route qualifies). The latest row per (task, region) is the incumbent, which a
    challenger replaces only when faster with confidence (monitor.answer.selection)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="winner_changes")
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="winner_changes")
    route = models.ForeignKey(
        Route, on_delete=models.CASCADE, null=True, blank=True, related_name="winner_changes"
    )
    previous = models.ForeignKey(
        Route, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    at = models.DateTimeField(default=timezone.now)
    reason = models.CharField(max_length=300)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["task", "region", "-at"], name="winner_task_region_at")]

    def __str__(self) -> str:
        return f"{self.task} @ {self.region}: {self.route or 'none'} since {self.at:%Y-%m-%d %H:%M}"
