"""Writing probe results: exactly one row per slot, and the rollups that follow from them.

Region workers send results over the broker as JSON dicts whose keys are ProbeResult field
names (foreign keys as `task_id`, `route_id`, `region_id`). `ingest` COPYs a batch into a
temporary table, then INSERTs it with ON CONFLICT DO NOTHING on the slot key: a redelivered
message, or a result that arrives after its slot was recorded missed, changes nothing. Only the
rows really inserted (RETURNING) are folded into the rollups, in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from monitor.models import (
    OUTCOME_MISSED,
    SLOT_DISPATCHED,
    SLOT_DONE,
    SLOT_MISSED,
    ProbeResult,
    ProbeSlot,
    RaceRun,
    Route,
)
from monitor.stats import rollups
from monitor.stats.rollups import ResultRow

log = logging.getLogger(__name__)

TEXT_LIMIT = 4000
DETAIL_LIMIT = 500

_FIELDS = [f for f in ProbeResult._meta.concrete_fields if f.name != "id"]
COLUMNS = [f.column for f in _FIELDS]
# A field's own default ("" for text), except callables such as timezone.now (set per row).
_CALLABLE_DEFAULTS = {f.attname for f in _FIELDS if f.has_default() and callable(f.default)}
_DEFAULTS: dict[str, Any] = {
    f.attname: (None if f.attname in _CALLABLE_DEFAULTS else f.get_default()) for f in _FIELDS
}
_TEXT_LIMITS = {"text": TEXT_LIMIT, "error_detail": DETAIL_LIMIT}
_DATETIMES = {"slot_at", "started_at"}
_FLOATS = {f.attname for f in _FIELDS if f.get_internal_type() == "FloatField"}
_INTS = {
    f.attname
    for f in _FIELDS
    if f.get_internal_type()
    in ("IntegerField", "PositiveIntegerField", "BigIntegerField", "ForeignKey")
}

# What the rollups need from each inserted row (RETURNING these columns).
_ROLLED = list(ResultRow._fields)


class BadPayload(ValueError):
    """A result payload that cannot be stored (named field, reason)."""


def _bounded(value: Any, limit: int) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _coerce(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in _DATETIMES and isinstance(value, str):
        return datetime.fromisoformat(value)
    if name in _FLOATS:
        return float(value)
    if name in _INTS:
        return int(value)
    return value


def row_from_payload(
    payload: Mapping[str, Any], prices: Mapping[int, Route], now: datetime
) -> tuple[Any, ...]:
    values = dict(_DEFAULTS)
    values["started_at"] = now
    for name, value in payload.items():
        if name in values:
            try:
                values[name] = _coerce(name, value)
            except (TypeError, ValueError):
                raise BadPayload(f"{name}: cannot store {type(value).__name__} value") from None
    for name, limit in _TEXT_LIMITS.items():
        values[name] = _bounded(values[name], limit)
    for name in ("error_kind", "http_version", "token_source", "text", "error_detail"):
        values[name] = values[name] or ""
    if values["route_id"] is None or values["region_id"] is None:
        raise BadPayload("route_id and region_id are required")
    route = prices.get(values["route_id"])
    if values["cost_usd"] is None and route is not None:
        values["cost_usd"] = route.cost_usd(
            values["input_tokens"] or 0, values["output_tokens"] or 0
        )
    return tuple(values[f.attname] for f in _FIELDS)


def insert_rows(rows: Sequence[tuple[Any, ...]]) -> list[ResultRow]:
    """COPY rows into a temp table, INSERT what does not conflict; returns what was inserted.
    Must run inside a transaction (the temp table empties itself at commit)."""
    if not rows:
        return []
    columns = ", ".join(connection.ops.quote_name(c) for c in COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE IF NOT EXISTS rw_ingest ON COMMIT DELETE ROWS AS "
            f"SELECT {columns} FROM monitor_proberesult WITH NO DATA"
        )
        cursor.execute("TRUNCATE rw_ingest")
        with cursor.cursor.copy(f"COPY rw_ingest ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(
            f"INSERT INTO monitor_proberesult ({columns}) SELECT {columns} FROM rw_ingest "
            f"ON CONFLICT DO NOTHING RETURNING {', '.join(_ROLLED)}"
        )
        return [ResultRow(*r) for r in cursor.fetchall()]


def _set_slot_status(results: Sequence[ResultRow], status: str, *, only_open: bool) -> None:
    keys = [(r.task_id, r.route_id, r.region_id, r.slot_at) for r in results if r.slot_at]
    if not keys:
        return
    row = "(%s::bigint, %s::bigint, %s::bigint, %s::timestamptz)"
    sql = (
        "UPDATE monitor_probeslot AS s SET status = %s FROM (VALUES "
        + ", ".join([row] * len(keys))
        + ") AS k(task_id, route_id, region_id, slot_at) "
        "WHERE s.task_id = k.task_id AND s.route_id = k.route_id "
        "AND s.region_id = k.region_id AND s.slot_at = k.slot_at"
        + (" AND s.status = %s" if only_open else "")
    )
    params: list[Any] = [status]
    for key in keys:
        params.extend(key)
    if only_open:
        params.append(SLOT_DISPATCHED)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def ingest(payloads: Sequence[Mapping[str, Any]]) -> int:
    """Store results from region workers; returns how many new rows were written.

    A payload that cannot be stored is logged and skipped; the rest of the batch is kept."""
    route_ids = {p.get("route_id") for p in payloads}
    prices = {r.pk: r for r in Route.objects.filter(pk__in=[i for i in route_ids if i])}
    now = timezone.now()
    rows = []
    for payload in payloads:
        try:
            rows.append(row_from_payload(payload, prices, now))
        except BadPayload as exc:
            log.warning("skipped a result payload: %s", exc)
    with transaction.atomic():
        inserted = insert_rows(rows)
        _set_slot_status(inserted, SLOT_DONE, only_open=True)
        rollups.apply(inserted)
    return len(inserted)


def sweep_missed(now: datetime | None = None, limit: int = 5000) -> int:
    """Record every dispatched slot past its deadline as a `missed` result, exactly once."""
    now = now or timezone.now()
    with transaction.atomic():
        expired = list(
            ProbeSlot.objects.select_for_update(skip_locked=True)
            .filter(status=SLOT_DISPATCHED, deadline_at__lt=now)
            .order_by("deadline_at")[:limit]
        )
        if not expired:
            return 0
        rows = [
            row_from_payload(
                {
                    "task_id": slot.task_id,
                    "route_id": slot.route_id,
                    "region_id": slot.region_id,
                    "slot_at": slot.slot_at,
                    "started_at": slot.slot_at,
                    "outcome": OUTCOME_MISSED,
                    "error_kind": "missed",
                    "error_detail": "no result arrived by the slot's deadline",
                },
                {},
                now,
            )
            for slot in expired
        ]
        inserted = insert_rows(rows)
        # Slots whose real result beat us to the row are done, not missed.
        ProbeSlot.objects.filter(pk__in=[s.pk for s in expired]).update(status=SLOT_DONE)
        _set_slot_status(inserted, SLOT_MISSED, only_open=False)
        rollups.apply(inserted)
    return len(inserted)


def delete_old_results(days: int, batch: int = 20_000) -> int:
    """Retention: delete raw results (and closed slots and races) older than `days`; rollups
    stay."""
    cutoff = timezone.now() - timedelta(days=days)
    total = 0
    while True:
        ids = list(
            ProbeResult.objects.filter(started_at__lt=cutoff).values_list("id", flat=True)[:batch]
        )
        if not ids:
            break
        total += ProbeResult.objects.filter(id__in=ids).delete()[0]
    ProbeSlot.objects.filter(slot_at__lt=cutoff).exclude(status=SLOT_DISPATCHED).delete()
    RaceRun.objects.filter(slot_at__lt=cutoff).exclude(status=SLOT_DISPATCHED).delete()
    return total
