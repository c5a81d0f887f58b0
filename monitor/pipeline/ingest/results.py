"""Writing probe results: exactly one row per slot, and the rollups that follow from them.

Region workers send results over the broker as JSON objects whose keys are ProbeResult column
names (monitor.pipeline.messages.ResultPayload). `ingest` COPYs a batch into a temporary
table, then INSERTs it with ON CONFLICT DO NOTHING on the slot key: a redelivered message
changes nothing. A result that arrives after its slot was recorded missed, but was measured
inside the slot's deadline (ingest or the broker was down meanwhile), replaces the missed row,
which leaves the rollups; one measured after the deadline changes nothing. Only the rows really
inserted (RETURNING) are folded into the rollups, in the same transaction.

The database being unavailable (OperationalError, InterfaceError) is not a refusal: it
propagates, and the ingest task retries the message with backoff, then parks it in the
dead-letter list (monitor.tasks, monitor.pipeline.queues).

One bad result never costs the others (it used to: one count past 2**31-1 failed the COPY, and
with it every probe of that region's tick, on every tick):
- a payload that does not match the contract, or holds a value no column can take (a string
  for a number, an unparseable time), is rejected: logged without its values, counted in the
  `ingest-rejected` Heartbeat row (admin, Heartbeats), and not written at all;
- values of the right type but outside their column's range are made to fit first (see
  `_fit`): integers clamped or nulled, NaN and infinities nulled, text cut;
- should the bulk write still fail (a route deleted meanwhile, a constraint this module does
  not know), the batch is written again row by row, each in a savepoint: the row the database
  refuses is logged and counted, the others are stored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, cast

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    connection,
    transaction,
)
from django.db.models import F
from django.utils import timezone

from monitor.models import (
    BODY_JSON,
    OUTCOME_MISSED,
    PREFIX_STABLE,
    SLOT_DISPATCHED,
    SLOT_DONE,
    SLOT_MISSED,
    EvalCase,
    GeneratedSpan,
    Heartbeat,
    ProbeResult,
    ProbeSlot,
    Route,
    Task,
)
from monitor.pipeline import signing
from monitor.pipeline.ingest import genai_otlp
from monitor.pipeline.ingest.rows import COLUMNS, BadPayload, row_from_payload
from monitor.pipeline.messages import (
    ContractError,
    ResultPayload,
    result_key,
    result_payload_from_json,
)
from monitor.stats import health, rollup_writes
from monitor.stats.rollup_writes import ResultRow
from probes.errors import Kind

log = logging.getLogger(__name__)


# The Heartbeat row counting results (and race results) rejected at ingest.
REJECTED_COUNTER = "ingest-rejected"


# Errors that say the database is unavailable (connection lost, server restarting, a deadlock
# or a cancelled statement), not that it refuses a row: never counted as rejections, they
# propagate so the ingest task retries the whole message (monitor.tasks).
UNAVAILABLE = (OperationalError, InterfaceError)


_KEY = [COLUMNS.index(c) for c in ("task_id", "route_id", "region_id", "slot_at")]


_OUTCOME = COLUMNS.index("outcome")


_STARTED, _GENERATED = COLUMNS.index("started_at"), COLUMNS.index("generated")


_LAG = COLUMNS.index("start_lag_ms")


# What the rollups need from each inserted row (RETURNING these columns; app e2e is a
# scenario's, not a column).
_ROLLED = [f for f in ResultRow._fields if f != "app_e2e_ms"]


# A measured result replaces its slot's `missed` row when it was measured inside the slot's
# deadline (it ended by then: start plus its e2e time, or its start when it has none): it was
# only late to arrive (ingest or the broker down, results waiting in a spool). The deleted
# missed rows come back (RETURNING) to be taken out of the rollups. A result measured after the
# deadline changes nothing, and neither does a second copy of a result (ON CONFLICT).
_REPLACE_MISSED = """
DELETE FROM monitor_proberesult AS p USING rw_ingest AS i, monitor_probeslot AS s
WHERE p.outcome = %s AND i.outcome <> %s
  AND p.task_id = i.task_id AND p.route_id = i.route_id
  AND p.region_id = i.region_id AND p.slot_at = i.slot_at
  AND p.started_at >= %s AND p.started_at < %s
  AND s.task_id = i.task_id AND s.route_id = i.route_id
  AND s.region_id = i.region_id AND s.slot_at = i.slot_at
  AND i.started_at + coalesce(i.e2e_ms, 0) * interval '1 millisecond' <= s.deadline_at
RETURNING {returning}
"""


# Exactly one result per slot. The table is partitioned by started_at, so its unique key
# (result_one_per_slot) must hold started_at too and no longer stops a second, different row
# for a slot (a missed row stamped at the slot, a result measured after its deadline, a probe
# run twice). Ingest is the authority instead: the slots' ProbeSlot rows are locked first
# (_LOCK_SLOTS), then a row goes in only when no row of its slot exists (NOT EXISTS over the
# partitions of the days around the slot: a slot's result starts within a day of it), one per
# slot of the batch (DISTINCT ON, a measured row before a missed one). A second copy of a
# result (same started_at) is still stopped by the key too (ON CONFLICT). Ad-hoc rows (no
# slot) go in as they come.
_LOCK_SLOTS = """
SELECT 1 FROM monitor_probeslot AS s
WHERE (s.task_id, s.route_id, s.region_id, s.slot_at) IN (
  SELECT task_id, route_id, region_id, slot_at FROM rw_ingest WHERE slot_at IS NOT NULL)
ORDER BY s.id FOR UPDATE OF s
"""


_INSERT_NEW = """
INSERT INTO {table} ({columns})
SELECT {columns} FROM (
  SELECT DISTINCT ON (task_id, route_id, region_id, coalesce(slot_at::text, ctid::text)) *
  FROM rw_ingest
  ORDER BY task_id, route_id, region_id, coalesce(slot_at::text, ctid::text), outcome = 'missed'
) AS i
WHERE i.slot_at IS NULL OR NOT EXISTS (
  SELECT 1 FROM {table} AS p
  WHERE p.task_id = i.task_id AND p.route_id = i.route_id AND p.region_id = i.region_id
    AND p.slot_at = i.slot_at AND p.started_at >= %s AND p.started_at < %s
    AND p.started_at >= i.slot_at - interval '1 day' AND p.started_at < i.slot_at + interval '1 day')
ON CONFLICT DO NOTHING RETURNING {rolled}
"""


SLOT_SPREAD = timedelta(days=1)


def _slot_window(rows: Sequence[tuple[Any, ...]]) -> list[datetime]:
    """Constant bounds around the batch's slots, so the planner reads only those days'
    partitions (a slot's result starts within SLOT_SPREAD of it)."""
    slots = [row[_KEY[3]] for row in rows if isinstance(row[_KEY[3]], datetime)]
    if not slots:
        now = timezone.now()
        return [now, now]
    return [min(slots) - SLOT_SPREAD, max(slots) + SLOT_SPREAD]


def insert_rows(rows: Sequence[tuple[Any, ...]]) -> list[ResultRow]:
    """COPY rows into a temp table, INSERT what does not conflict; returns what was inserted.
    A measured result replaces a `missed` row of its slot (see _REPLACE_MISSED); the rollups
    lose that missed one here. Must run inside a transaction (the temp table empties itself at
    commit)."""
    if not rows:
        return []
    columns = ", ".join(connection.ops.quote_name(c) for c in COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE IF NOT EXISTS rw_ingest ON COMMIT DELETE ROWS AS "
            f"SELECT {columns} FROM monitor_proberesult WITH NO DATA"
        )
        cursor.execute("TRUNCATE rw_ingest")
        # psycopg's COPY, under Django's wrapper so its errors are Django's (write_rows).
        with (
            connection.wrap_database_errors,
            cursor.cursor.copy(f"COPY rw_ingest ({columns}) FROM STDIN") as copy,
        ):
            for row in rows:
                copy.write_row(row)
        measured = sum(1 for row in rows if row[_OUTCOME] != OUTCOME_MISSED)
        window = _slot_window(rows)
        rolled = ", ".join(_ROLLED)
        # The slots' rows, locked in one order: concurrent ingest workers and the sweep take
        # turns per slot (the sweep skips locked slots), so the check below is not racing.
        cursor.execute(_LOCK_SLOTS)
        inserted: list[ResultRow] = []
        # Twice at most: a sweep that commits its missed row between our DELETE and INSERT
        # makes the INSERT conflict; a second DELETE sees that row (a new statement, a new
        # snapshot) and the INSERT then stores the measurement.
        for _ in range(2 if measured else 1):
            if measured:
                returning = ", ".join(f"p.{c}" for c in _ROLLED)
                cursor.execute(
                    _REPLACE_MISSED.format(returning=returning),
                    [OUTCOME_MISSED, OUTCOME_MISSED, *window],
                )
                replaced = [ResultRow(*r) for r in cursor.fetchall()]
                if replaced:
                    rollup_writes.retract(replaced)
                    health.count(replaced, sign=-1)
            cursor.execute(
                _INSERT_NEW.format(
                    table=ProbeResult._meta.db_table, columns=columns, rolled=rolled
                ),
                window,
            )
            inserted.extend(ResultRow(*r) for r in cursor.fetchall())
            if len(inserted) == len(rows):
                break
        return inserted


def refusal(exc: DatabaseError) -> str:
    """Why the database refused a row, without the row's values (its messages quote them)."""
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    parts = [type(cause or exc).__name__]
    for label, attr in (("column", "column_name"), ("constraint", "constraint_name")):
        name = getattr(diag, attr, None)
        if name:
            parts.append(f"{label} {name}")
    return ", ".join(parts)


def _row_key(row: tuple[Any, ...]) -> str:
    task_id, route_id, region_id, slot_at = (row[i] for i in _KEY)
    shown = slot_at.isoformat() if isinstance(slot_at, datetime) else "-"
    return f"{task_id}/{route_id}/{region_id} {shown}"


def write_rows(rows: Sequence[tuple[Any, ...]]) -> tuple[list[ResultRow], int]:
    """Insert the rows; returns (rows inserted, rows the database refused). All at once when
    it can; if that fails, one by one, each in its own savepoint, so a refused row costs only
    itself. Must run inside a transaction with constraints checked immediately (`ingest`)."""
    try:
        with transaction.atomic():
            return insert_rows(rows), 0
    except UNAVAILABLE:
        raise  # the database is away, not refusing these rows: the caller retries them all
    except DatabaseError as exc:
        log.warning(
            "bulk write of %d results refused (%s); writing them one by one",
            len(rows),
            refusal(exc),
        )
    inserted: list[ResultRow] = []
    refused = 0
    for row in rows:
        try:
            with transaction.atomic():
                inserted.extend(insert_rows([row]))
        except UNAVAILABLE:
            raise
        except DatabaseError as exc:
            refused += 1
            log.warning(
                "rejected result %s: the database refused it (%s)", _row_key(row), refusal(exc)
            )
    return inserted, refused


def count_rejected(n: int) -> None:
    """Add n to the durable count of rejected results (shown in the admin's Heartbeat list)."""
    if n > 0:
        Heartbeat.add(REJECTED_COUNTER, n)


def _set_slot_status(results: Sequence[ResultRow], status: str, *, only_open: bool) -> None:
    keys = [(r.task_id, r.route_id, r.region_id, r.slot_at) for r in results if r.slot_at]
    if not keys:
        return
    sql = (
        "UPDATE monitor_probeslot AS s SET status = %s FROM unnest("
        "%s::bigint[], %s::bigint[], %s::bigint[], %s::timestamptz[]"
        ") AS k(task_id, route_id, region_id, slot_at) "
        "WHERE s.task_id = k.task_id AND s.route_id = k.route_id "
        "AND s.region_id = k.region_id AND s.slot_at = k.slot_at"
        + (" AND s.status = %s" if only_open else "")
    )
    params: list[Any] = [status, *(list(column) for column in zip(*keys, strict=True))]
    if only_open:
        params.append(SLOT_DISPATCHED)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _known_eval_cases(payloads: Iterable[Mapping[str, Any]]) -> set[int]:
    ids = {p.get("eval_case_id") for p in payloads} - {None}
    if not ids:
        return set()
    return set(EvalCase.objects.filter(pk__in=ids).values_list("pk", flat=True))


def mark_reference(
    payloads: Sequence[ResultPayload], routes: Mapping[int, Route]
) -> list[dict[str, Any]]:
    """Set each result's `reference`: probed with its task's reference option set, the probes
    that rank routes (Task.reference). Judged here, by the task's settings at ingest."""
    tasks = Task.objects.in_bulk({p["task_id"] for p in payloads if p.get("task_id")})
    marked = []
    for p in payloads:
        task, route = tasks.get(p.get("task_id") or 0), routes.get(p["route_id"])
        reference = (
            task is not None
            and route is not None
            and task.is_reference(
                route.provider,
                http2=bool(p.get("http2")),
                body_encoding=str(p.get("body_encoding") or BODY_JSON),
                cold=bool(p.get("cold")),
                prefix_mode=str(p.get("prefix_mode") or PREFIX_STABLE),
            )
        )
        marked.append({**p, "reference": reference})
    return marked


def admit(
    payloads: Sequence[ResultPayload], region_id: int, sealed_at: datetime
) -> tuple[list[ResultPayload], int]:
    """Of the results a region's worker sent, those for a slot of that region that exists and
    is still open (dispatched, or recorded missed while the result was on its way: a result
    sealed in time replaces `missed`), sealed by the slot's deadline (the signed issue time,
    which cannot run ahead of our clock: signing.open_results); returns them and how many
    were refused (each logged by key, without values)."""
    keys = set()
    for p in payloads:
        try:
            at = datetime.fromisoformat(p["slot_at"]) if p["slot_at"] else None
        except ValueError:
            at = None
        if at is not None:
            keys.add((p["task_id"], p["route_id"], p["region_id"], at))
    open_slots: dict[tuple[Any, ...], datetime] = {}
    if keys:
        rows = ProbeSlot.objects.filter(
            region_id=region_id,
            status__in=(SLOT_DISPATCHED, SLOT_MISSED),
            slot_at__in={k[3] for k in keys},
        ).values_list("task_id", "route_id", "region_id", "slot_at", "deadline_at")
        open_slots = {tuple(r[:4]): r[4] for r in rows}
    admitted, refused = [], 0
    for p in payloads:
        reason = ""
        if p["region_id"] != region_id:
            reason = "sent by another region's worker"
        else:
            try:
                at = datetime.fromisoformat(p["slot_at"]) if p["slot_at"] else None
            except ValueError:
                at = None
            deadline = open_slots.get((p["task_id"], p["route_id"], p["region_id"], at))
            if deadline is None:
                reason = "no open slot for it"
            elif sealed_at > deadline:
                reason = "sent after its slot's deadline"
        if reason:
            log.warning("rejected result %s: %s", result_key(p), reason)
            refused += 1
        else:
            admitted.append(p)
    return admitted, refused


def ingest_signed(envelope: object) -> int:
    """Results as a region worker sends them (signed, monitor.pipeline.signing): stored only
    for that region's open slots, sealed in time (`admit`); refused whole otherwise."""
    try:
        opened = signing.open_results(envelope, signing.KIND_RESULTS)
    except signing.Refused as exc:
        log.warning("refused a result message: %s", exc)
        count_rejected(1)
        return 0
    # The region's worker is running: what it signed arrived (the setup checklist reads this).
    seen_region(opened.region_id)
    return ingest(opened.body, from_region=opened.region_id, sealed_at=opened.sealed_at)


def region_heartbeat(region_id: int) -> str:
    """The Heartbeat row a region's worker keeps alive by delivering results."""
    return f"region:{region_id}"


def seen_region(region_id: int) -> None:
    now = timezone.now()
    name = region_heartbeat(region_id)
    if not Heartbeat.objects.filter(name=name).update(last_seen=now, count=F("count") + 1):
        Heartbeat.objects.get_or_create(name=name, defaults={"last_seen": now, "count": 1})


def ingest(
    message: object, *, from_region: int | None = None, sealed_at: datetime | None = None
) -> int:
    """Store results from region workers (a list of ResultPayload); returns how many new rows
    were written. What cannot be stored is logged, counted and skipped; the rest is kept.

    `from_region`: the region whose key signed the message (the broker path,
    monitor.tasks.ingest_results), with `sealed_at` when it signed them; then only results for
    that region's open slots are kept (`admit`). Without it (trusted callers in this process)
    every result is stored."""
    now = timezone.now()
    if not isinstance(message, list):
        log.warning("rejected a result message: expected a list, got %s", type(message).__name__)
        count_rejected(1)
        return 0
    rejected = 0
    payloads = []
    for item in message:
        try:
            payloads.append(result_payload_from_json(item))
        except ContractError as exc:
            log.warning("rejected result %s: %s", result_key(item), exc)
            rejected += 1
    if from_region is not None:
        payloads, refused_here = admit(payloads, from_region, sealed_at or now)
        rejected += refused_here
        # Demo history is made in this process only (monitor.demo_history): what a worker
        # sends is a measurement, and cannot hide itself behind the pages' generated filter.
        # Set on copies: the payloads belong to the signed message, which a retry (the
        # database failed after this) verifies again, and a parked copy must still verify.
        payloads = [cast(ResultPayload, {**p, "generated": False}) for p in payloads]
    prices = {
        r.pk: r
        for r in Route.objects.filter(pk__in={p["route_id"] for p in payloads}).select_related(
            "provider"
        )
    }
    rows_in = mark_reference(payloads, prices)
    # An eval case deleted since the probe was sent: the measurement still counts, ungraded
    # against a case that no longer exists (the foreign key would refuse the row).
    cases = _known_eval_cases(payloads)
    rows = []
    for payload in rows_in:
        case_id = payload.get("eval_case_id")
        if case_id is not None and case_id not in cases:
            payload = {**payload, "eval_case_id": None}
        try:
            rows.append(row_from_payload(payload, prices, now))
        except BadPayload as exc:
            log.warning("rejected result %s: %s", result_key(payload), exc)
            rejected += 1
    with transaction.atomic():
        # Foreign keys are checked at each statement, not at commit, so a row that refers to a
        # deleted route fails in its own savepoint (write_rows) instead of the whole commit.
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        inserted, refused = write_rows(rows)
        generated = [r[_STARTED] for r in rows if r[_GENERATED]]
        if generated:  # demo history (monitor.demo_history): the pages' one-row record of it
            GeneratedSpan.widen(min(generated), max(generated))
        # Open slots, and missed ones whose late result replaced the missed row; a probe the
        # worker did not start (too late) leaves its slot missed.
        _set_slot_status(
            [r for r in inserted if r.outcome != OUTCOME_MISSED], SLOT_DONE, only_open=False
        )
        _set_slot_status(
            [r for r in inserted if r.outcome == OUTCOME_MISSED], SLOT_MISSED, only_open=False
        )
        rollup_writes.apply(inserted)
        # The schedule's health counts live slots only, never generated history.
        live = {tuple(row[i] for i in _KEY): row[_LAG] for row in rows if not row[_GENERATED]}
        health.count(
            [r for r in inserted if (r.task_id, r.route_id, r.region_id, r.slot_at) in live],
            live,
        )
        count_rejected(rejected + refused)
        if inserted and genai_otlp.enabled():
            # Only what was stored, once stored (a rolled-back batch is redelivered).
            transaction.on_commit(partial(genai_otlp.record, inserted, rows_in, prices))
    return len(inserted)


SlotKey = tuple[int, int, int, datetime]  # (task_id, route_id, region_id, slot_at)


def take_back_missed(key: SlotKey) -> int:
    """A slot's `missed` row goes, and leaves the rollups: its late result, measured in time,
    replaces it (a scenario's, monitor.pipeline.beat.scenarios; single probes do this inside
    insert_rows). A missed row starts at its slot, so one partition is read. Must run inside a
    transaction holding the slot's lock."""
    task_id, route_id, region_id, slot_at = key
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {ProbeResult._meta.db_table} WHERE task_id = %s AND route_id = %s "
            "AND region_id = %s AND slot_at = %s AND started_at = %s AND outcome = %s "
            f"RETURNING {', '.join(_ROLLED)}",
            [task_id, route_id, region_id, slot_at, slot_at, OUTCOME_MISSED],
        )
        replaced = [ResultRow(*r) for r in cursor.fetchall()]
    if replaced:
        rollup_writes.retract(replaced)
        health.count(replaced, sign=-1)
    return len(replaced)


def record_missed(keys: Sequence[SlotKey], now: datetime, detail: str) -> int:
    """Record each slot's one result as `missed` (unless it already has one) and mark the slot
    missed; returns how many were recorded. Must run inside a transaction."""
    rows = [
        row_from_payload(
            {
                "task_id": task_id,
                "route_id": route_id,
                "region_id": region_id,
                "slot_at": slot_at,
                "started_at": slot_at,
                "outcome": OUTCOME_MISSED,
                "error_kind": Kind.MISSED,
                "error_detail": detail,
            },
            {},
            now,
        )
        for task_id, route_id, region_id, slot_at in keys
    ]
    inserted = insert_rows(rows)
    _set_slot_status(inserted, SLOT_MISSED, only_open=False)
    rollup_writes.apply(inserted)
    health.count(inserted)
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
        # Slots whose real result beat us to the row are done, not missed.
        ProbeSlot.objects.filter(pk__in=[s.pk for s in expired]).update(status=SLOT_DONE)
        return record_missed(
            [(s.task_id, s.route_id, s.region_id, s.slot_at) for s in expired],
            now,
            "no result arrived by the slot's deadline",
        )
