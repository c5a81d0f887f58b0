"""Raw results partitioned by day: the online migration keeps every row, retention drops only
whole expired days, and ingest still writes exactly one result per slot."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from monitor import partitions
from monitor.models import ProbeResult, ProbeSlot
from monitor.pipeline import messages
from monitor.pipeline.beat import slots
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.region import worker
from simulator.testing import SimulatorProcess
from tests.monitor import factories as f
from tests.sim_fixtures import OPENAI_KEY, sim  # noqa: F401 (fixture)

BEFORE = [("monitor", "0018_demo_history")]
AFTER = [("monitor", "0019_partitioned_results")]
CHECKSUM = "SELECT count(*), md5(string_agg(r::text, '|' ORDER BY r.id)) FROM monitor_proberesult r"


def _migrate(target: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)


def _latest() -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)
    return [node for node in executor.loader.graph.leaf_nodes() if node[0] == "monitor"]


def _relkind(table: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE relname = %s", [table])
        return str(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_every_row_of_a_populated_table() -> None:
    _migrate(BEFORE)
    try:
        assert _relkind("monitor_proberesult") == "r"
        # The rows are made with the models as they were then: today's have columns that
        # later migrations add.
        then = MigrationExecutor(connection).loader.project_state(BEFORE).apps
        p = then.get_model("monitor", "Provider").objects.create(
            name="Acme", slug="acme", base_url="http://127.0.0.1:9/acme/v1"
        )
        routes = [
            then.get_model("monitor", "Route").objects.create(provider=p, model_id=f"m{i}")
            for i in range(3)
        ]
        regions = [
            then.get_model("monitor", "Region").objects.create(name=slug.upper(), slug=slug)
            for slug in ("eu-west", "us-east")
        ]
        t = then.get_model("monitor", "Task").objects.create(
            name="Qa", slug="qa", user_template="Q: {input}"
        )
        t.routes.set(routes)
        t.regions.set(regions)
        now = datetime.now(UTC)
        with connection.cursor() as cursor:
            # 30 days x 24 hours x 6 series, some missed, some ad hoc (no slot), with text.
            cursor.execute(
                """
                INSERT INTO monitor_proberesult (task_id, route_id, region_id, slot_at,
                  started_at, http2, body_encoding, cold, prefix_mode, reference, http_version,
                  token_source, tps_token_source, served_model, request_id, service_tier,
                  outcome, error_kind, error_detail, text, ttft_ms, e2e_ms, output_tokens)
                SELECT %s, r.id, g.id, CASE WHEN h %% 7 = 0 THEN NULL ELSE ts END,
                  ts + interval '3 seconds', false, 'json', false, 'stable', h %% 2 = 0, '1.1',
                  '', '', 'm', 'req-' || h, '', CASE WHEN h %% 11 = 0 THEN 'missed' ELSE 'ok' END,
                  '', '', 'answer ' || h, 100 + h %% 50, 900.5, h %% 300
                FROM generate_series(0, 30 * 24 - 1) AS h,
                  LATERAL (SELECT %s - h * interval '1 hour' AS ts) AS t,
                  monitor_route r, monitor_region g
                """,
                [t.pk, now],
            )
            cursor.execute(CHECKSUM)
            before = cursor.fetchone()
        assert before[0] == 30 * 24 * 6
        _migrate(AFTER)
        assert _relkind("monitor_proberesult") == "p"
        with connection.cursor() as cursor:
            cursor.execute(CHECKSUM)
            assert cursor.fetchone() == before
        _migrate(_latest())  # today's models from here on
        # The old table is now the partition of everything before the migration's bound; new
        # rows after it land in daily partitions, and ids go on from the old ones.
        found = {p.name: p for p in partitions.partitions()}
        assert found["monitor_proberesult_legacy"].low is None
        bound = found["monitor_proberesult_legacy"].high
        assert bound is not None
        assert bound > now
        assert partitions.partition_name(bound) in found
        assert "monitor_proberesult_default" in found
        top = ProbeResult.objects.order_by("-id").values_list("id", flat=True).first()
        later = ProbeResult.objects.create(
            route_id=routes[0].pk, region_id=regions[0].pk, started_at=bound
        )
        assert top is not None
        assert later.pk > top
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT tableoid::regclass::text FROM monitor_proberesult WHERE id = %s", [later.pk]
            )
            assert cursor.fetchone()[0] == partitions.partition_name(bound)
        # The slot key survives in the legacy rows: a redelivered old result is not stored twice.
        old = ProbeResult.objects.filter(slot_at__isnull=False).order_by("id").first()
        assert old is not None
        payload = f.payload(old.task, old.route, old.region, old.slot_at)
        payload["started_at"] = old.started_at.isoformat()
        assert ingest.ingest([payload]) == 0
    finally:
        # Leave the next tests an empty partitioned table without the legacy partition.
        ProbeResult.objects.all().delete()
        _migrate(BEFORE)
        _migrate(AFTER)
        _migrate(_latest())  # and every migration after it, as the other tests expect
    assert "monitor_proberesult_legacy" not in {p.name for p in partitions.partitions()}


def _day_rows(t, r, g, at: datetime) -> None:  # type: ignore[no-untyped-def]
    ingest.ingest([f.payload(t, r, g, at)])


@pytest.fixture
def world(db: None):  # type: ignore[no-untyped-def]
    p = f.provider()
    r = f.route(p, "m1")
    g = f.region("eu-west")
    return f.task("qa", [r], [g]), r, g


def test_retention_drops_whole_expired_days_and_never_one_with_newer_rows(world) -> None:
    t, r, g = world
    cutoff = datetime(2026, 8, 10, 6, 0, tzinfo=UTC)
    day = partitions.day_start(cutoff)
    for n in range(-3, 2):
        assert partitions.create_day(day + timedelta(days=n))
    # Two rows per day partition, one in the default partition far back, one far ahead.
    for n in range(-3, 2):
        for hour in (1, 12):
            _day_rows(t, r, g, day + timedelta(days=n, hours=hour))
    _day_rows(t, r, g, day - timedelta(days=40))
    _day_rows(t, r, g, day + timedelta(days=30))
    # The day of the cutoff holds a row older than it (01:00) and one newer (12:00): kept.
    done = partitions.drop_expired(cutoff)
    assert sorted(done.dropped) == [
        partitions.partition_name(day + timedelta(days=n)) for n in (-3, -2, -1)
    ]
    assert done.deleted == 1  # the old row of the default partition
    left = {p.name for p in partitions.partitions()}
    assert partitions.partition_name(day) in left
    assert partitions.partition_name(day + timedelta(days=1)) in left
    starts = sorted(ProbeResult.objects.values_list("started_at", flat=True))
    assert starts == [
        day + timedelta(hours=1),
        day + timedelta(hours=12),
        day + timedelta(days=1, hours=1),
        day + timedelta(days=1, hours=12),
        day + timedelta(days=30),
    ]
    # A partition ending exactly at the cutoff goes; the next run changes nothing more.
    assert partitions.drop_expired(day + timedelta(days=1)).dropped == [
        partitions.partition_name(day)
    ]
    assert partitions.drop_expired(day + timedelta(days=1)).dropped == []
    assert ProbeResult.objects.count() == 3


def test_a_new_day_takes_over_its_rows_from_the_default_partition(world) -> None:
    t, r, g = world
    day = datetime(2026, 9, 1, tzinfo=UTC)
    _day_rows(t, r, g, day + timedelta(hours=5))
    assert partitions.create_day(day)
    assert not partitions.create_day(day)  # already there
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM monitor_proberesult")
        assert [row[0] for row in cursor.fetchall()] == [partitions.partition_name(day)]


def test_beat_keeps_partitions_ahead(world) -> None:
    now = datetime(2026, 10, 1, 13, tzinfo=UTC)
    assert partitions.ensure_ahead(3, now=now) == 4
    assert partitions.ensure_ahead(3, now=now) == 0
    names = {p.name for p in partitions.partitions()}
    for n in range(4):
        assert partitions.partition_name(partitions.day_start(now) + timedelta(days=n)) in names


def test_one_result_per_slot_even_with_different_start_times(world) -> None:
    t, r, g = world
    at = datetime(2026, 11, 2, 10, tzinfo=UTC)
    first = f.payload(t, r, g, at + timedelta(seconds=3))
    first["slot_at"] = at.isoformat()
    again = f.payload(t, r, g, at + timedelta(seconds=40))  # the probe run a second time
    again["slot_at"] = at.isoformat()
    assert ingest.ingest([first, again]) == 1  # one per slot within a batch
    assert ingest.ingest([again]) == 0  # and across batches
    assert ProbeResult.objects.get().started_at == at + timedelta(seconds=3)
    # A missed record for a slot that already has its result changes nothing either.
    assert ingest.record_missed([(t.pk, r.pk, g.pk, at)], at, "late") == 0
    assert ProbeResult.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_ingest_workers_and_the_sweep_write_one_row_per_slot() -> None:
    p = f.provider()
    r = f.route(p, "m1")
    g = f.region("eu-west")
    t = f.task("qa", [r], [g])
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    slots = [at + timedelta(seconds=n) for n in range(40)]
    for s in slots:
        ProbeSlot.objects.create(task=t, route=r, region=g, slot_at=s, deadline_at=s)
    barrier = threading.Barrier(3)

    def worker(offset: int) -> None:
        try:
            barrier.wait()
            batch = []
            for s in slots:
                payload = f.payload(t, r, g, s - timedelta(seconds=offset))
                payload["slot_at"] = s.isoformat()
                batch.append(payload)
            ingest.ingest(batch)
        finally:
            connections.close_all()

    def sweeper() -> None:
        try:
            barrier.wait()
            ingest.sweep_missed()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(o,)) for o in (1, 2)]
    threads.append(threading.Thread(target=sweeper))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    counts = ProbeResult.objects.values_list("slot_at").distinct().count()
    assert counts == ProbeResult.objects.count() == len(slots)


@pytest.mark.django_db
def test_a_region_worker_sends_results_as_probes_end_not_at_the_batch_end(
    sim: SimulatorProcess,  # noqa: F811
    settings,  # type: ignore[no-untyped-def]
) -> None:
    settings.TICK_SECONDS = 6  # the batch's starts spread over 6 s
    settings.RESULT_FLUSH_SECONDS = 1
    p = f.provider("fastchip", base_url=f"{sim.base_url}/fastchip/v1")
    p.set_api_key(OPENAI_KEY)
    p.save()
    routes = [f.route(p, m) for m in ("fast-small", "mid-think", "slow-large")]
    regions = [f.region(f"r{i}") for i in range(2)]
    t = f.task("stream", routes, regions, max_tokens=20, probe_timeout_s=20)
    at = timezone.now().replace(microsecond=0)
    batch = {
        "region": "r0",
        "probes": [
            slots.probe_message(slots.Slot(t, r, g, at), []) for r in routes for g in regions
        ],
    }
    sent: list[tuple[float, int]] = []
    t0 = time.monotonic()
    payloads = worker.run_batch(
        json.loads(json.dumps(batch)),
        emit=lambda chunk: sent.append((time.monotonic() - t0, len(chunk))),
    )
    assert [p["outcome"] for p in payloads] == ["ok"] * 6, payloads
    assert sum(n for _, n in sent) == 6
    # Several chunks; the first left while later probes had not even started (6 s spread).
    assert len(sent) >= 3, sent
    assert sent[0][0] < 3.0, sent
    # And each chunk is ingested as it comes: one row per slot in the end.
    for chunk in [payloads[:2], payloads[2:]]:
        ingest.ingest(json.loads(json.dumps(messages.results_to_json(chunk))))
    assert ProbeResult.objects.count() == 6
