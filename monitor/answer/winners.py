"""The incumbent: who wins each (task, region) now, since when and why.

Selection (monitor.answer.selection) keeps the incumbent unless it stops qualifying or a
challenger is faster with confidence, so the winner does not flip back and forth between routes
within noise of each other. The incumbent is the latest WinnerChange row of its (task, region);
`record` adds a row each time a choice names another winner, with the reason it gave.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from django.db import connection, transaction

from monitor.answer.selection import Choice
from monitor.models import WinnerChange

Key = tuple[int, int]  # (task id, region id)


def latest(task_ids: Sequence[int] | None = None) -> dict[Key, WinnerChange]:
    """The latest change of every (task, region), or only of `task_ids`' tasks."""
    qs = WinnerChange.objects.order_by("task_id", "region_id", "-at", "-pk").distinct(
        "task_id", "region_id"
    )
    if task_ids is not None:
        qs = qs.filter(task_id__in=task_ids)
    return {(w.task_id, w.region_id): w for w in qs}


def incumbents(task_ids: Sequence[int] | None = None) -> dict[Key, int | None]:
    """The current winner's route id per (task, region); None when none qualified last."""
    return {key: w.route_id for key, w in latest(task_ids).items()}


def record(choices: Iterable[tuple[Key, Choice]], now: datetime) -> int:
    """Record each choice whose winner differs from its (task, region)'s latest; returns how
    many changed. Serialised (an advisory lock), so two refreshes never record one change
    twice."""
    changed = 0
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('rw_winners'))")
        current = latest()
        for (task_id, region_id), choice in choices:
            route_id = choice.winner.route.pk if choice.winner else None
            last = current.get((task_id, region_id))
            if last is not None and last.route_id == route_id:
                continue
            if last is None and route_id is None:
                continue  # never had a winner: nothing changed
            WinnerChange.objects.create(
                task_id=task_id,
                region_id=region_id,
                route_id=route_id,
                previous_id=last.route_id if last else None,
                at=now,
                reason=(choice.change or choice.reason or "the winner changed")[:300],
            )
            changed += 1
    return changed
