"""Which (task, route, region) slots are due, and one message per region batch.

Each (task, route, region) probes every `task.probe_interval_s` seconds, at a phase of its own
inside the interval (a stable hash), so probes spread out instead of firing together. A slot
is created by INSERT ... ON CONFLICT DO NOTHING on its key, and only the beat that created it
dispatches it: two beats ticking at once still send each slot once. Slots the scheduler could
not create while it was down are created late and, once past their deadline, recorded missed
by the sweep, never silently absent (up to MAX_CATCH_UP back).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Sum
from django.utils import timezone

from monitor.models import (
    CONN_COLD,
    GRAIN_DAY,
    HTTP_2,
    SLOT_DONE,
    EvalCase,
    ProbeSlot,
    RaceRun,
    Region,
    Rollup,
    Route,
    Task,
)

log = logging.getLogger(__name__)

MAX_CATCH_UP = timedelta(hours=6)
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Slot:
    task: Task
    route: Route
    region: Region
    slot_at: datetime

    @property
    def deadline_at(self) -> datetime:
        return self.slot_at + timedelta(seconds=self.task.probe_timeout_s) + grace()


def grace() -> timedelta:
    return timedelta(seconds=settings.SLOT_GRACE_SECONDS)


def phase_s(task_id: int, route_id: int, region_id: int, interval_s: int) -> float:
    digest = hashlib.blake2b(f"{task_id}:{route_id}:{region_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (interval_s * 1000) / 1000.0


def slot_number(slot_at: datetime, phase: float, interval_s: int) -> int:
    return round(((slot_at - EPOCH).total_seconds() - phase) / interval_s)


def slot_times(
    now: datetime, interval_s: int, phase: float, after: datetime | None
) -> list[datetime]:
    """Slot times in (after, now] (or just the current one when there is no `after`)."""
    elapsed = (now - EPOCH).total_seconds() - phase
    current = EPOCH + timedelta(seconds=phase + (elapsed // interval_s) * interval_s)
    if after is None:
        return [current]
    earliest = max(after, now - MAX_CATCH_UP)
    times = []
    t = current
    while t > earliest:
        times.append(t)
        t -= timedelta(seconds=interval_s)
    return sorted(times)


def month_spend_by_task(now: datetime) -> dict[int, Decimal]:
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    rows = (
        Rollup.objects.filter(grain=GRAIN_DAY, region__isnull=True, bucket_start__gte=start)
        .values("task_id")
        .annotate(spent=Sum("cost_usd"))
    )
    spent: dict[int, Decimal] = defaultdict(Decimal)
    for r in rows:
        spent[r["task_id"]] += r["spent"] or Decimal("0")
    # Races are paid for too, every lane of them.
    races = (
        RaceRun.objects.filter(slot_at__gte=start, status=SLOT_DONE)
        .values("task_id")
        .annotate(spent=Sum("cost_usd"))
    )
    for r in races:
        spent[r["task_id"]] += r["spent"] or Decimal("0")
    return dict(spent)


def spend_capped(task: Task, route: Route, spent: Decimal) -> bool:
    """Would one more probe of this route take the task past its monthly cap?"""
    if task.monthly_spend_cap_usd is None:
        return False
    next_probe = route.cost_usd(task.input_tokens, task.max_tokens)
    return spent + next_probe > task.monthly_spend_cap_usd


def starts_later(slot_at: datetime, now: datetime) -> bool:
    """Leave out a new schedule's first slot when it is too late for it: past its grace, it
    could not get its whole probe deadline and would be recorded missed for a late start.
    Only when ticks come at least once per grace, so that the next slot is sure to be caught
    in time; with rarer ticks it is created anyway (late slots then show as missed, rather
    than a schedule that never starts)."""
    return settings.TICK_SECONDS <= settings.SLOT_GRACE_SECONDS and now > slot_at + grace()


def due_slots(now: datetime) -> list[Slot]:
    tasks = Task.objects.filter(is_active=True).prefetch_related("routes__provider", "regions")
    latest = {
        (r["task_id"], r["route_id"], r["region_id"]): r["last"]
        for r in ProbeSlot.objects.values("task_id", "route_id", "region_id").annotate(
            last=Max("slot_at")
        )
    }
    spent = month_spend_by_task(now)
    slots: list[Slot] = []
    for task in tasks:
        for route in task.routes.all():
            if not (route.is_active and route.provider.is_active):
                continue
            if spend_capped(task, route, spent.get(task.pk, Decimal("0"))):
                continue
            for region in task.regions.all():
                if not region.is_active:
                    continue
                phase = phase_s(task.pk, route.pk, region.pk, task.probe_interval_s)
                after = latest.get((task.pk, route.pk, region.pk))
                for at in slot_times(now, task.probe_interval_s, phase, after):
                    if after is None and starts_later(at, now):
                        continue
                    slots.append(Slot(task, route, region, at))
    return slots


def claim(slots: list[Slot]) -> list[Slot]:
    """Create the slots; return only those this call created (another beat may have)."""
    if not slots:
        return []
    row = "(%s, %s, %s, %s, %s, 'dispatched', now())"
    sql = (
        "INSERT INTO monitor_probeslot (task_id, route_id, region_id, slot_at, deadline_at, "
        "status, created_at) VALUES "
        + ", ".join([row] * len(slots))
        + " ON CONFLICT DO NOTHING RETURNING task_id, route_id, region_id, slot_at"
    )
    params: list[Any] = []
    for s in slots:
        params.extend([s.task.pk, s.route.pk, s.region.pk, s.slot_at, s.deadline_at])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        created = {tuple(r) for r in cursor.fetchall()}
    return [s for s in slots if (s.task.pk, s.route.pk, s.region.pk, s.slot_at) in created]


def probe_message(slot: Slot, eval_cases: list[EvalCase], n: int | None = None) -> dict[str, Any]:
    """What a region worker needs for one probe. JSON only; the API key travels encrypted
    (the worker holds FIELD_ENCRYPTION_KEYS, not database credentials).

    The slot's number picks the option combination and the eval case, so successive slots
    cycle through them; a race passes one `n` for all its lanes (the same request to each)."""
    task, route, region = slot.task, slot.route, slot.region
    if n is None:
        phase = phase_s(task.pk, route.pk, region.pk, task.probe_interval_s)
        n = slot_number(slot.slot_at, phase, task.probe_interval_s)
    variants = list(
        itertools.product(
            task.http_versions, task.body_encodings, task.connection_modes, task.prefix_modes
        )
    )
    http_version, body, connection_mode, prefix = variants[n % len(variants)]
    case = eval_cases[n % len(eval_cases)] if eval_cases else None
    provider = route.provider
    return {
        "slot": {
            "task_id": task.pk,
            "route_id": route.pk,
            "region_id": region.pk,
            "slot_at": slot.slot_at.isoformat(),
        },
        "provider": {
            "slug": provider.slug,
            "base_url": provider.base_url,
            "wire_format": provider.wire_format,
            "api_key_token": provider.api_key_encrypted,
            "extra_headers": provider.extra_headers,
        },
        "model": route.model_id,
        "system_prompt": task.system_prompt,
        "user_prompt": task.user_template.replace("{input}", case.input if case else ""),
        "input_tokens": task.input_tokens,
        "max_tokens": task.max_tokens,
        "http2": http_version == HTTP_2,
        "body_encoding": body,
        "cold": connection_mode == CONN_COLD,
        "prefix_mode": prefix,
        "timeout_s": task.probe_timeout_s,
        "eval": None
        if case is None
        else {
            "id": case.pk,
            "grader": case.grader,
            "expected": case.expected,
            "json_schema": case.json_schema,
            "tolerance": case.tolerance,
        },
    }


def tick(now: datetime | None = None) -> dict[str, int]:
    """Claim due slots and send one batch per region, then the due races. Returns slots sent
    per region slug, and the number of races sent under "races"."""
    from monitor.tasks import run_probe_batch

    now = now or timezone.now()
    with transaction.atomic():
        claimed = claim(due_slots(now))
    cases: dict[int, list[EvalCase]] = defaultdict(list)
    for case in EvalCase.objects.filter(is_active=True, task__is_active=True).order_by("pk"):
        cases[case.task_id].append(case)
    by_region: dict[Region, list[Slot]] = defaultdict(list)
    for slot in claimed:
        by_region[slot.region].append(slot)
    sent: dict[str, int] = {}
    for region, slots in by_region.items():
        messages = [probe_message(s, cases[s.task.pk]) for s in slots]
        # A worker that picks the batch up after this could not finish before the deadlines.
        expires = max(min(s.slot_at for s in slots), now) + grace()
        run_probe_batch.apply_async(
            args=({"region": region.slug, "probes": messages},),
            queue=region.queue_name,
            expires=expires,
        )
        sent[region.slug] = len(slots)
    from monitor.pipeline import races

    sent["races"] = races.dispatch(now, month_spend_by_task(now), cases)
    return sent
