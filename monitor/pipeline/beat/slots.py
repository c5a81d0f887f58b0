"""Slot arithmetic, and the message a region worker gets for one slot.

Each (task, route, region) probes every `task.probe_interval_s` seconds at a phase of its own
inside the interval (a stable hash), so probes spread out instead of firing together; a race
does the same per (task, region), with route 0 in the hash. A slot's number (whole intervals
since EPOCH) picks its option combination and eval case (`assignment`), independently.
Which slots are due and who claims them is monitor.pipeline.beat.scheduling's business.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings

from monitor.models import (
    BODY_JSON,
    CONN_COLD,
    HTTP_1_1,
    HTTP_2,
    EvalCase,
    Provider,
    Region,
    Route,
    Task,
)
from monitor.pipeline.messages import (
    EvalSpec,
    ProbeMessage,
    RequestSettings,
)

# How far back a scheduler that was down creates the slots it missed (they are then recorded
# missed, never silently absent).
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


def starts_later(slot_at: datetime, now: datetime) -> bool:
    """Leave out a new schedule's first slot when it is too late for it: past its grace, it
    could not get its whole probe deadline and would be recorded missed for a late start.
    Only when ticks come at least once per grace, so that the next slot is sure to be caught
    in time; with rarer ticks it is created anyway (late slots then show as missed, rather
    than a schedule that never starts)."""
    return settings.TICK_SECONDS <= settings.SLOT_GRACE_SECONDS and now > slot_at + grace()


def in_time(slot_at: datetime, now: datetime) -> bool:
    """Can a probe sent now still finish by the slot's deadline? Only while the slot is within
    its grace: past that, its whole probe deadline no longer fits before the slot's deadline
    (a scheduler that was down creates such slots late; they are recorded missed, not sent)."""
    return now <= slot_at + grace()


def expires_at(first_slot_at: datetime) -> datetime:
    """When a message stops being worth running: a worker that picks it up later could not
    finish before the deadlines of the slots it carries (a slot's deadline is its time, its
    probe timeout and the grace: a probe started after its slot's grace no longer fits).
    Counted from the first slot, not from when the message is sent: a tick that runs late (a
    busy scheduler) sends slots already well into their grace, and a message counted from
    then let a worker that took it late probe them after all, and ingest refused the results
    as sent after their deadlines: probes run, paid for and lost (issue 31's WAN test)."""
    return first_slot_at + grace()


def request_settings(route: Route) -> RequestSettings:
    """The route's request settings for the worker; the secret headers travel as their
    encrypted token, like `api_key_token`, never in the clear."""
    return {
        "token_limit_param": route.token_limit_param,
        "reasoning_effort": route.reasoning_effort or None,
        "thinking_budget_tokens": route.thinking_budget_tokens,
        "service_tier": route.service_tier or None,
        "temperature": route.temperature,
        "extra_body": dict(route.extra_body or {}),
        "secret_headers_token": route.secret_headers_encrypted,
        "api_version": route.api_version or None,
    }


def options_for(task: Task, provider: Provider) -> list[tuple[str, str, str, str]]:
    """The task's option combinations this provider can take, in a stable order.

    An HTTP/2 or msgpack probe goes only to a provider that supports it: elsewhere it would
    fail for a reason that is ours and count against the provider. When none of the task's
    choices fit, the probe uses what every provider takes (HTTP/1.1, JSON); the route page
    names what was not sent."""
    http_versions = [v for v in task.http_versions if provider.supports(http2=v == HTTP_2)]
    bodies = [b for b in task.body_encodings if provider.supports(body_encoding=b)]
    return list(
        itertools.product(
            http_versions or [HTTP_1_1],
            bodies or [BODY_JSON],
            task.connection_modes,
            task.prefix_modes,
        )
    )


Variant = tuple[str, str, str, str]


def assignment(
    n: int, variants: list[Variant], reference: Variant, cases: int
) -> tuple[Variant, int]:
    """Slot number n's option combination and eval case (index), assigned independently.

    Every other slot probes the reference set (what ranks routes, so it gathers samples at
    half the probe rate however many options the task compares); the slots between cycle
    through the other combinations. Within each, the eval cases cycle once per full turn of
    the combinations, so over 2 x (combinations - 1) x cases slots every combination meets
    every case equally often, and no option is tied to one question."""
    others = [v for v in variants if v != reference]
    if reference not in variants or not others:
        pool = variants if reference not in variants else [reference]
        return pool[n % len(pool)], (n // len(pool)) % cases if cases else 0
    m = n // 2
    if n % 2 == 0:
        return reference, m % cases if cases else 0
    return others[m % len(others)], (m // len(others)) % cases if cases else 0


def _eval_spec(case: EvalCase) -> EvalSpec:
    return {
        "id": case.pk,
        "grader": case.grader,
        "expected": case.expected,
        # Only the JSON schema grader needs one, and only it is checked to be an object.
        "json_schema": case.json_schema if isinstance(case.json_schema, dict) else None,
        "tolerance": case.tolerance,
    }


def probe_message(slot: Slot, eval_cases: list[EvalCase], n: int | None = None) -> ProbeMessage:
    """What a region worker needs for one probe. JSON only; the API key travels encrypted
    (the worker holds FIELD_ENCRYPTION_KEYS, not database credentials).

    The slot's number picks the option combination and the eval case independently
    (`assignment`), so successive slots cycle through them; a race passes one `n` for all its lanes (the same request to each)."""
    task, route, region = slot.task, slot.route, slot.region
    if n is None:
        phase = phase_s(task.pk, route.pk, region.pk, task.probe_interval_s)
        n = slot_number(slot.slot_at, phase, task.probe_interval_s)
    provider = route.provider
    variant, case_index = assignment(
        n, options_for(task, provider), task.reference(provider), len(eval_cases)
    )
    http_version, body, connection_mode, prefix = variant
    case = eval_cases[case_index] if eval_cases else None
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
            "aws_region": provider.aws_region,
        },
        "model": route.model_id,
        "system_prompt": task.system_prompt,
        "user_prompt": task.user_template.replace("{input}", case.input if case else ""),
        "input_tokens": task.input_tokens,
        "max_tokens": route.token_limit(task.max_tokens),
        "http2": http_version == HTTP_2,
        "body_encoding": body,
        "cold": connection_mode == CONN_COLD,
        "prefix_mode": prefix,
        "timeout_s": task.probe_timeout_s,
        "eval": None if case is None else _eval_spec(case),
        "request": request_settings(route),
    }
