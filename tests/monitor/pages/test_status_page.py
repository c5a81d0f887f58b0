"""The status page and /metrics show what waits in the broker (real Redis), a replay of the
dead letters takes only what a region signed, and every page says why a capped task stopped
probing."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from monitor.models import ProbeResult, ProbeSlot, Region
from monitor.pipeline import queues, signing
from monitor.pipeline.beat import scheduling
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f


@pytest.fixture
def world(db: None):
    p = f.provider()
    r = f.route(p, "m1")
    g = f.region("qdepth-test")
    t = f.task("capped", [r], [g], input_tokens=1000, max_tokens=200)
    return t, r, g


@pytest.fixture
def clean_broker(world):
    *_, g = world
    client = queues.client()
    keys = [g.queue_name + suffix for suffix in ("", "\x06\x163", "\x06\x166", "\x06\x169")]
    keys += [queues.DEAD_LETTER_KEY, queues.DEAD_LETTER_MALFORMED_KEY]
    client.delete(*keys)
    yield client
    client.delete(*keys)


def _signed(g: Region, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Results as the region's worker sends them (and ingest parks them)."""
    return signing.seal(signing.signing_key(g.slug), g.slug, signing.KIND_RESULTS, results, None)


def test_queue_depths_are_read_from_the_broker(clean_broker, world) -> None:
    _, _, g = world
    for i in range(3):
        clean_broker.rpush(g.queue_name, f"message {i}")
    clean_broker.rpush(g.queue_name + "\x06\x166", "a priority 6 message")
    figures = queues.broker_figures([g.queue_name])
    assert figures is not None
    assert figures["depths"][g.queue_name] == 4
    assert set(figures["depths"]) >= {"ingest", "default", g.queue_name}


def test_metrics_export_queue_depths_and_dead_letters(
    client: Client, clean_broker, world, teammate: User
) -> None:
    _, _, g = world
    clean_broker.rpush(g.queue_name, "one", "two")
    queues.park("results", _signed(g, [{"route_id": 1}]), "OperationalError", 13)
    client.force_login(teammate)
    body = client.get(reverse("rw-metrics")).content.decode()
    assert "routewatch_broker_up 1" in body
    assert f'routewatch_queue_depth{{queue="{g.queue_name}"}} 2' in body, [
        line for line in body.splitlines() if "queue" in line
    ]
    assert "routewatch_dead_letters 1" in body
    assert "# TYPE routewatch_unacked_messages gauge" in body


def test_the_status_page_lists_queues_and_lets_staff_replay_dead_letters(
    client: Client, clean_broker, world, teammate: User, django_user_model
) -> None:
    t, r, g = world
    slot_at = timezone.now().replace(microsecond=0)
    ProbeSlot.objects.create(
        task=t, route=r, region=g, slot_at=slot_at, deadline_at=slot_at + timedelta(minutes=5)
    )
    queues.park("results", _signed(g, [f.payload(t, r, g, slot_at)]), "OperationalError", 13)
    client.force_login(teammate)
    page = client.get(reverse("rw-status")).content.decode()
    assert f'data-queue="{g.queue_name}"' in page
    assert "Dead letters" in page
    assert "OperationalError" in page
    assert "Replay all" not in page  # not staff
    assert client.post(reverse("rw-replay-dead-letters")).status_code == 302  # to admin login
    assert queues.dead_letter_count() == 1
    staff = django_user_model.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    client.force_login(staff)
    assert "Replay all" in client.get(reverse("rw-status")).content.decode()
    response = client.post(reverse("rw-replay-dead-letters"), follow=True)
    assert "1 messages replayed: 1 results newly stored" in response.content.decode()
    assert ProbeResult.objects.get().outcome == "ok"
    assert ProbeSlot.objects.get().status == "done"
    assert queues.dead_letter_count() == 0


def test_the_status_page_reads_the_scheduled_regions_once(
    client: Client, clean_broker, world, teammate: User
) -> None:
    """Which regions some active task probes from is one query a Status page, not one for the
    list and another for each region's "scheduled" flag (issue 33: the page's CPU)."""
    *_, g = world
    client.force_login(teammate)
    client.get(reverse("rw-status"))  # warm: the session and the templates
    with CaptureQueriesContext(connection) as queries:
        page = client.get(reverse("rw-status")).content.decode()
    assert f'data-queue="{g.queue_name}"' in page
    scheduled = [
        q["sql"] for q in queries if q["sql"].startswith('SELECT DISTINCT "monitor_region"')
    ]
    assert len(scheduled) == 1, scheduled


def test_a_replay_stores_nothing_its_region_did_not_sign(clean_broker, world) -> None:
    # Whoever can write to Redis can park a letter: unsigned results, or results signed by
    # another region, for an open slot of this one, must not become measurements.
    t, r, g = world
    other = f.region("qdepth-other")
    slot_at = timezone.now().replace(microsecond=0)
    slot = ProbeSlot.objects.create(
        task=t, route=r, region=g, slot_at=slot_at, deadline_at=slot_at + timedelta(minutes=5)
    )
    forged = [f.payload(t, r, g, slot_at)]
    queues.park("results", forged, "OperationalError", 13)
    queues.park("results", _signed(other, forged), "OperationalError", 13)
    queues.park("race", {"race": {"region_id": g.pk}, "lanes": {}}, "OperationalError", 13)
    assert queues.replay_dead_letters() == (3, 0)
    assert not ProbeResult.objects.exists()
    assert ProbeSlot.objects.get().status == slot.status != "done"
    # The region's own signature is what lets the same result in.
    queues.park("results", _signed(g, forged), "OperationalError", 13)
    assert queues.replay_dead_letters() == (1, 1)
    assert ProbeResult.objects.get().region_id == g.pk


def test_malformed_dead_letters_are_kept_aside_and_the_rest_replayed(
    client: Client, clean_broker, world, django_user_model
) -> None:
    t, r, g = world
    slot_at = timezone.now().replace(microsecond=0)
    ProbeSlot.objects.create(
        task=t, route=r, region=g, slot_at=slot_at, deadline_at=slot_at + timedelta(minutes=5)
    )
    good = _signed(g, [f.payload(t, r, g, slot_at)])
    letter = {"kind": "results", "reason": "OperationalError", "attempts": 13, "body": good}
    malformed = [
        b"not json {",
        json.dumps({**letter, "parked_at": "yesterday"}).encode(),
        json.dumps({**letter, "parked_at": float("nan")}).encode(),
        json.dumps({**letter, "parked_at": 1e300}).encode(),
        json.dumps(["a list"]).encode(),
    ]
    clean_broker.rpush(queues.DEAD_LETTER_KEY, *malformed)
    queues.park("results", good, "OperationalError", 13)
    staff = django_user_model.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    client.force_login(staff)
    page = client.get(reverse("rw-status"))
    assert page.status_code == 200
    assert [x["body"] for x in queues.dead_letters()] == [good]
    response = client.post(reverse("rw-replay-dead-letters"), follow=True)
    assert response.status_code == 200
    assert "1 messages replayed: 1 results newly stored" in response.content.decode()
    assert ProbeSlot.objects.get().status == "done"
    assert queues.dead_letter_count() == 0
    # Never lost: kept as they were, counted, for a person to read.
    assert clean_broker.lrange(queues.DEAD_LETTER_MALFORMED_KEY, 0, -1) == malformed
    figures = queues.broker_figures([g.queue_name])
    assert figures is not None
    assert figures["malformed_dead_letters"] == len(malformed)


def test_the_status_page_says_when_the_broker_does_not_answer(
    client: Client, world, teammate: User, settings
) -> None:
    # A broker URL nothing listens on (port 9, discard): a real refused connection.
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # queues.client follows the setting
    client.force_login(teammate)
    page = client.get(reverse("rw-status")).content.decode()
    assert 'id="broker-down"' in page
    assert "routewatch_broker_up 0" in client.get(reverse("rw-metrics")).content.decode()


def test_every_page_says_why_a_capped_task_stopped(client: Client, world, teammate: User) -> None:
    t, r, g = world
    t.monthly_spend_cap_usd = Decimal("0.01")
    t.save()
    now = timezone.now()
    # $0.0014 each: seven results spend $0.0098, and an eighth probe would pass the cap.
    ingest.ingest([f.payload(t, r, g, now - timedelta(minutes=i)) for i in range(7)])
    client.force_login(teammate)
    for url in (
        reverse("rw-overview"),
        reverse("rw-task", args=[t.slug]),
        reverse("rw-route", args=[r.pk]) + f"?task={t.slug}",
        reverse("rw-regions") + f"?task={t.slug}",
        reverse("rw-status"),
    ):
        page = client.get(url).content.decode()
        assert "spend cap: stopped" in page, url
        assert "Probing stopped: monthly spend cap $0.01 reached: $0.0098 spent" in page, url
    assert scheduling.due_slots(now) == []


def test_a_region_whose_every_recent_probe_failed_at_the_network_has_a_failed_path(
    db: None,
) -> None:
    """monitoring.path_failures, read from the window's rows through the route index: a
    region is judged only on its scheduled probes of the last PATH_WINDOW (missed slots, older
    probes and other regions' probes aside), and one probe that reached its provider clears it."""
    from monitor.pages import monitoring

    p1, p2 = f.provider("p1"), f.provider("p2")
    r1, r2 = f.route(p1, "m1"), f.route(p2, "m2")
    cut, live, alone = f.region("cut"), f.region("live"), f.region("alone")
    t = f.task("qa", [r1, r2], [cut, live, alone])
    now = timezone.now()
    recent = [now - timedelta(seconds=s) for s in (20, 50, 80)]
    payloads = [
        f.payload(t, r, g, at, outcome="error", error_kind=kind)
        for g in (cut, live)
        for at, kind in zip(recent, ("connect", "dns", "timeout_headers"), strict=True)
        for r in (r1, r2)
    ]
    # The live region reached one provider once; an older success and a missed slot do not
    # clear the cut one; the third region failed at the network, but to one provider only.
    payloads.append(f.payload(t, r2, live, now - timedelta(seconds=10)))
    payloads.append(f.payload(t, r1, cut, now - monitoring.PATH_WINDOW - timedelta(seconds=5)))
    payloads.append(f.payload(t, r1, cut, now - timedelta(seconds=5), outcome="missed"))
    payloads += [f.payload(t, r1, alone, at, outcome="error", error_kind="tls") for at in recent]
    ingest.ingest(payloads)
    found = monitoring.path_failures(now, [cut.pk, live.pk, alone.pk])
    assert found == {cut.pk: monitoring.PathFailure(probes=6, providers=2)}
    # An HTTP error is an answer: the path reached the provider.
    ingest.ingest(
        [f.payload(t, r1, cut, now - timedelta(seconds=1), outcome="error", error_kind="http_5xx")]
    )
    assert monitoring.path_failures(now, [cut.pk, live.pk, alone.pk]) == {}


def test_a_region_is_cleared_from_the_schedules_minutes_and_the_raw_rows_judge_the_rest(
    db: None,
) -> None:
    """The path check reads the schedule's minutes first (RegionMinute.reached: a probe that
    got past the network, in a whole minute of slot time inside the window); a region they do
    not clear is judged on the raw rows, so a probe in the minute the window starts in still
    counts, and one just before the window does not. With every region cleared by its
    minutes, the raw rows are not read at all."""
    from monitor.pages import monitoring

    p1, p2 = f.provider("p1"), f.provider("p2")
    r1, r2 = f.route(p1, "m1"), f.route(p2, "m2")
    early, before, busy = f.region("early"), f.region("before"), f.region("busy")
    t = f.task("qa", [r1, r2], [early, before, busy])
    now = (timezone.now() - timedelta(minutes=1)).replace(second=30, microsecond=0)
    since = now - monitoring.PATH_WINDOW  # hh:mm:30: its minute began 30 s before it
    failing = [now - timedelta(seconds=s) for s in (10, 40, 70)]
    payloads = [
        f.payload(t, r, g, at, outcome="error", error_kind="connect")
        for g in (early, before)
        for at in failing
        for r in (r1, r2)
    ]
    # `early` reached its provider 10 s into the window (the minute it starts in), `before`
    # 10 s before it; `busy` in a whole minute of the window, and in an older minute too.
    payloads.append(f.payload(t, r1, early, since + timedelta(seconds=10), outcome="error", error_kind="http_4xx"))  # fmt: skip
    payloads.append(f.payload(t, r1, before, since - timedelta(seconds=10)))
    payloads.append(f.payload(t, r1, busy, now - timedelta(seconds=40)))
    payloads.append(f.payload(t, r2, busy, since - timedelta(minutes=2)))
    payloads.append(f.payload(t, r2, busy, now - timedelta(seconds=20), outcome="error", error_kind="dns"))  # fmt: skip
    ingest.ingest(payloads)

    found = monitoring.path_failures(now, [early.pk, before.pk, busy.pk])
    assert found == {before.pk: monitoring.PathFailure(probes=6, providers=2)}

    def plan(regions: list[int]) -> str:
        params = {"since": since, "now": now, "regions": regions, "kinds": sorted(monitoring.PATH_KINDS)}  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + monitoring._REACHED_SQL, params)
            return "\n".join(row[0] for row in cursor.fetchall())

    def raw_scans(text: str) -> list[str]:
        # The plan's scan nodes on the raw rows (not, say, a sort key naming their column).
        lines = text.splitlines()
        return [line for line in lines if " Scan " in line and "monitor_proberesult" in line]

    # `busy` is cleared by its minutes: no raw row is read; `early` is not: they are.
    assert monitoring.path_failures(now, [busy.pk]) == {}
    assert raw_scans(plan([busy.pk])), plan([busy.pk])
    assert all("never executed" in line for line in raw_scans(plan([busy.pk]))), plan([busy.pk])
    assert not all("never executed" in line for line in raw_scans(plan([early.pk]))), plan(
        [early.pk]
    )


def test_ingest_of_the_release_before_still_writes_the_schedules_minutes(db: None) -> None:
    """During an upgrade, ingest workers of the release before write RegionMinute rows without
    `reached`: the column's database default takes them (a NOT NULL without one failed their
    whole transaction)."""
    from monitor.models import RegionMinute

    g = f.region("old")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO monitor_regionminute (region_id, minute, probed, missed, late, lag_hist) "
            "VALUES (%s, %s, 3, 0, 0, '{}')",
            [g.pk, timezone.now().replace(second=0, microsecond=0)],
        )
    row = RegionMinute.objects.get(region=g)
    assert (row.probed, row.reached) == (3, 0)
