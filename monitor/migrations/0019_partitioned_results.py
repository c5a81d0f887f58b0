"""Raw results partitioned by day on started_at (PostgreSQL declarative partitioning), online.

A populated table is never copied and never locked for long:
1. outside any transaction, the indexes the partitioned table needs are built CONCURRENTLY on
   the old table (writes go on), and a CHECK constraint that every row is older than a bound T
   is added NOT VALID, then VALIDATEd (SHARE UPDATE EXCLUSIVE: writes go on);
2. the new partitioned table is built empty beside it (its indexes, foreign keys, a sequence);
3. one short transaction (lock_timeout, retried) renames the old table to
   monitor_proberesult_legacy, renames the new one into place and ATTACHes the old one as the
   partition for [MINVALUE, T): the validated CHECK spares the attach its scan, and the indexes
   built in step 1 are adopted, not built. Daily partitions from T on and a default partition
   follow (monitor.partitions keeps creating them ahead, from beat).

An empty table (a new install, the test database) is simply dropped and replaced.

The slot key becomes (task, route, region, slot_at, started_at): a unique constraint on a
partitioned table must hold its partition key. Exactly one result per slot is kept by ingest
(monitor.pipeline.ingest.insert_rows: slot rows locked, then inserted only when their slot has
no row yet), no longer by this constraint alone.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import migrations, models

TABLE = "monitor_proberesult"
NEW = "rw_proberesult_new"
LEGACY = "monitor_proberesult_legacy"
SEQUENCE = "monitor_proberesult_id_seq"
DEFAULT_PART = "monitor_proberesult_default"
# Daily partitions created ahead by the migration (beat keeps the window: monitor.partitions).
AHEAD_DAYS = 3


def _q(cursor: Any, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    cursor.execute(sql, params or [])
    return list(cursor.fetchall()) if cursor.description else []


def _indexes(cursor: Any, table: str) -> list[tuple[str, str, str | None]]:
    """(index name, definition, constraint type or None) of each index on `table`."""
    return [
        (name, definition, contype)
        for name, definition, contype in _q(
            cursor,
            "SELECT i.relname, pg_get_indexdef(i.oid), c.contype "
            "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid AND c.conrelid = x.indrelid "
            "WHERE x.indrelid = %s::regclass ORDER BY i.relname",
            [table],
        )
    ]


def _foreign_keys(cursor: Any, table: str) -> list[tuple[str, str]]:
    return [
        (name, definition)
        for name, definition in _q(
            cursor,
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = %s::regclass AND contype = 'f' ORDER BY conname",
            [table],
        )
    ]


def _day(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _daily(cursor: Any, start: datetime, days: int) -> None:
    for n in range(days):
        lo = start + timedelta(days=n)
        name = f"{TABLE}_p{lo:%Y%m%d}"
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {name} PARTITION OF {TABLE} FOR VALUES FROM (%s) TO (%s)",
            [lo, lo + timedelta(days=1)],
        )


def _build_parent(cursor: Any) -> None:
    """The empty partitioned table beside the old one: same columns and defaults, the old
    table's indexes and foreign keys (under temporary names), the slot key and primary key
    holding started_at, ids from a sequence of its own."""
    cursor.execute(f"DROP TABLE IF EXISTS {NEW}")
    cursor.execute(
        f"CREATE TABLE {NEW} (LIKE {TABLE} INCLUDING DEFAULTS) PARTITION BY RANGE (started_at)"
    )
    cursor.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE}_p")
    cursor.execute(f"ALTER TABLE {NEW} ALTER COLUMN id SET DEFAULT nextval('{SEQUENCE}_p')")
    cursor.execute(f"ALTER TABLE {NEW} ADD CONSTRAINT rw_new_pkey PRIMARY KEY (id, started_at)")
    cursor.execute(
        f"ALTER TABLE {NEW} ADD CONSTRAINT rw_new_one_per_slot "
        "UNIQUE (task_id, route_id, region_id, slot_at, started_at)"
    )
    for name, definition, contype in _indexes(cursor, TABLE):
        if contype is None and not name.startswith("rw_legacy_"):
            # "CREATE INDEX name ON public.monitor_proberesult USING ..." on the new table
            head, _, tail = definition.partition(" USING ")
            cursor.execute(f"CREATE INDEX rw_new_{name} ON {NEW} USING {tail}")
    for name, definition in _foreign_keys(cursor, TABLE):
        cursor.execute(f"ALTER TABLE {NEW} ADD CONSTRAINT rw_new_{name} {definition}")


def _swap(cursor: Any, bound: datetime | None) -> None:
    """Put the new table in the old one's place (one short transaction): the old table becomes
    the partition for everything before `bound`, or is dropped when `bound` is None."""
    cursor.execute("SET LOCAL lock_timeout = '5s'")
    cursor.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
    ((top,),) = _q(cursor, f"SELECT coalesce(max(id), 0) FROM {TABLE}")
    cursor.execute(f"SELECT setval('{SEQUENCE}_p', %s + 1, false)", [top])
    old_indexes = _indexes(cursor, TABLE)
    old_fks = _foreign_keys(cursor, TABLE)
    if bound is None:
        cursor.execute(f"DROP TABLE {TABLE}")
    else:
        cursor.execute(f"ALTER TABLE {TABLE} RENAME TO {LEGACY}")
        cursor.execute(f"ALTER TABLE {LEGACY} ALTER COLUMN id DROP IDENTITY IF EXISTS")
        cursor.execute(f"ALTER TABLE {LEGACY} ALTER COLUMN id SET DEFAULT nextval('{SEQUENCE}_p')")
        # Its primary key becomes (id, started_at) (the index was built concurrently), as the
        # partitioned table's must; the slot key with started_at likewise.
        for name, _definition, contype in old_indexes:
            if contype == "p":
                cursor.execute(f"ALTER TABLE {LEGACY} DROP CONSTRAINT {name}")
        cursor.execute(
            f"ALTER TABLE {LEGACY} ADD CONSTRAINT rw_legacy_pkey "
            "PRIMARY KEY USING INDEX rw_legacy_id_started"
        )
        cursor.execute(
            f"ALTER TABLE {LEGACY} ADD CONSTRAINT rw_legacy_one_per_slot_started "
            "UNIQUE USING INDEX rw_legacy_slot_started"
        )
        for name, _definition, contype in old_indexes:
            if contype != "p" and not name.startswith("rw_legacy_"):
                cursor.execute(f"ALTER INDEX {name} RENAME TO rw_legacy_{name}")
        for name, _definition in old_fks:
            cursor.execute(f"ALTER TABLE {LEGACY} RENAME CONSTRAINT {name} TO rw_legacy_{name}")
    cursor.execute(f"ALTER TABLE {NEW} RENAME TO {TABLE}")
    cursor.execute(f"ALTER SEQUENCE {SEQUENCE}_p RENAME TO {SEQUENCE}")
    cursor.execute(f"ALTER SEQUENCE {SEQUENCE} OWNED BY {TABLE}.id")
    cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN id SET DEFAULT nextval('{SEQUENCE}')")
    if bound is not None:
        cursor.execute(f"ALTER TABLE {LEGACY} ALTER COLUMN id SET DEFAULT nextval('{SEQUENCE}')")
    cursor.execute(f"ALTER TABLE {TABLE} RENAME CONSTRAINT rw_new_pkey TO {TABLE}_pkey")
    cursor.execute(
        f"ALTER TABLE {TABLE} RENAME CONSTRAINT rw_new_one_per_slot TO result_one_per_slot"
    )
    for name, _definition, contype in old_indexes:
        if contype is None and not name.startswith("rw_legacy_"):
            cursor.execute(f"ALTER INDEX rw_new_{name} RENAME TO {name}")
    for name, _definition in old_fks:
        cursor.execute(f"ALTER TABLE {TABLE} RENAME CONSTRAINT rw_new_{name} TO {name}")
    if bound is not None:
        cursor.execute(
            f"ALTER TABLE {TABLE} ATTACH PARTITION {LEGACY} FOR VALUES FROM (MINVALUE) TO (%s)",
            [bound],
        )
    cursor.execute(f"CREATE TABLE {DEFAULT_PART} PARTITION OF {TABLE} DEFAULT")


def forward(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        populated = bool(_q(cursor, f"SELECT 1 FROM {TABLE} LIMIT 1"))
        bound = None
        if populated:
            # Everything up to the end of tomorrow (and any row stamped later) stays in the old
            # table: rows written while this runs must still fit its CHECK.
            ((latest,),) = _q(cursor, f"SELECT max(started_at) FROM {TABLE}")
            bound = max(_day(datetime.now(UTC)), _day(latest)) + timedelta(days=2)
            for name, columns in (
                ("rw_legacy_slot_started", "task_id, route_id, region_id, slot_at, started_at"),
                ("rw_legacy_id_started", "id, started_at"),
            ):
                cursor.execute(f"DROP INDEX IF EXISTS {name}")  # a failed CONCURRENTLY's leftover
                cursor.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {name} ON {TABLE} ({columns})")
            cursor.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS rw_legacy_range")
            cursor.execute(
                f"ALTER TABLE {TABLE} ADD CONSTRAINT rw_legacy_range "
                "CHECK (started_at IS NOT NULL AND started_at < %s) NOT VALID",
                [bound],
            )
            cursor.execute(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT rw_legacy_range")
        _build_parent(cursor)
        for attempt in range(20):
            try:
                with connection.cursor() as swap, _atomic(connection):
                    _swap(swap, bound)
                break
            except Exception as exc:  # lock_timeout: someone held the table; try again
                if "lock timeout" not in str(exc) or attempt == 19:
                    raise
                time.sleep(1)
        _daily(cursor, bound or _day(datetime.now(UTC)) - timedelta(days=1), AHEAD_DAYS + 1)


def _atomic(connection: Any) -> Any:
    from django.db import transaction

    return transaction.atomic(using=connection.alias)


def backward(apps: Any, schema_editor: Any) -> None:
    """Back to one plain table (not online: every row is copied)."""
    connection = schema_editor.connection
    old_model = apps.get_model("monitor", "ProbeResult")
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE rw_back AS SELECT * FROM {TABLE}")
        cursor.execute(f"DROP TABLE {TABLE} CASCADE")
        cursor.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")
    schema_editor.create_model(old_model)
    with connection.cursor() as cursor:
        columns = ", ".join(
            schema_editor.quote_name(f.column) for f in old_model._meta.concrete_fields
        )
        cursor.execute(
            f"INSERT INTO {TABLE} ({columns}) OVERRIDING SYSTEM VALUE SELECT {columns} FROM rw_back"
        )
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence('{TABLE}', 'id'), "
            f"coalesce((SELECT max(id) FROM {TABLE}), 0) + 1, false)"
        )
        cursor.execute("DROP TABLE rw_back")


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY and VALIDATE must run outside one long transaction.
    atomic = False

    dependencies = [("monitor", "0018_demo_history")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="proberesult", name="result_one_per_slot"),
                migrations.AddConstraint(
                    model_name="proberesult",
                    constraint=models.UniqueConstraint(
                        fields=["task", "route", "region", "slot_at", "started_at"],
                        name="result_one_per_slot",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forward, backward)],
        ),
    ]
