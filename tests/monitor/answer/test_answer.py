"""Issue 30: the answer stays right when data is thin, stale or just starting.

Silence (our missed slots) is not evidence against a winner; a first winner waits for its
interval to close; a challenger whose samples all lie below the incumbent's takes over at five
samples; a task with no winner says why for all its routes. Results go through the real ingest
into real rollups, and the overview's board decides (PostgreSQL).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from monitor.answer import board, selection
from monitor.models import SLOT_DISPATCHED, ProbeSlot, Task, WinnerChange
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def _feed(t, r, g, n, *, start_s=0, every_s=60, **kw) -> None:
    ingest.ingest(
        [f.payload(t, r, g, T0 + timedelta(seconds=start_s + i * every_s), **kw) for i in range(n)]
    )


def _miss(t, r, g, slots: list[datetime]) -> None:
    """Our workers missed these slots: the sweep's own path (ProbeSlot, then record_missed)."""
    for at in slots:
        ProbeSlot.objects.create(
            task=t,
            route=r,
            region=g,
            slot_at=at,
            deadline_at=at + timedelta(seconds=t.probe_timeout_s),
            status=SLOT_DISPATCHED,
        )
    with transaction.atomic():
        ingest.record_missed(
            [(t.pk, r.pk, g.pk, at) for at in slots], slots[-1], "no worker took it"
        )


def _cell(now: datetime) -> board.Cell:
    [row] = board.refresh(now).rows
    [cell] = row.cells
    return cell


# --- silence is not evidence ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_stale_winner_keeps_its_cell_and_its_figures_with_the_facts_of_its_silence() -> None:
    p = f.provider()
    fast, slow = f.route(p, "fast"), f.route(p, "slow")
    ap = f.region("ap-south")
    t = f.task("qa", [fast, slow], [ap])  # probes every 60 s: stale after 5 min
    _feed(t, fast, ap, 30, e2e_ms=1000)
    _feed(t, slow, ap, 30, e2e_ms=9000)
    assert _cell(T0 + timedelta(minutes=30)).route_id == fast.pk
    # fast's next 8 slots are missed by our workers; slow keeps being probed.
    _miss(t, fast, ap, [T0 + timedelta(minutes=30 + i) for i in range(8)])
    _feed(t, slow, ap, 8, start_s=30 * 60, e2e_ms=9000)
    now = T0 + timedelta(minutes=37)
    cell = _cell(now)
    assert cell.route_id == fast.pk
    assert cell.stale  # its own last probe, not the fresh runner-up's
    assert cell.winner is not None
    assert cell.winner.samples == 30  # its figures are kept, not read as 0 probes
    assert cell.silence == ("no probe for 8 min: 8 slots since were missed by our ap-south workers")
    assert WinnerChange.objects.filter(task=t).count() == 1  # no change, no false reason
    # The task page shows the same figures and the same words.
    routes = list(t.routes.order_by("pk"))
    latency = selection.Window.read(now - board.WINDOW, now + timedelta(hours=1))
    choice = selection.decide(
        t,
        routes,
        latency.latency(t, routes, ap),
        latency.quality(t, routes),
        region=ap,
        now=now,
        incumbent=fast.pk,
    )
    assert choice.winner is not None
    assert choice.winner.route == fast
    assert choice.winner.metric.n == 30


@pytest.mark.django_db
def test_every_regions_missed_slots_come_in_one_read_and_each_region_keeps_its_own() -> None:
    """The overview's board and the regions page decide in every region of a task: the
    facts of each stale route's silence come in one read for all of them (missed_in_regions),
    and each region's are its own, as missed_since reads them one region at a time."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    p = f.provider()
    fast, slow = f.route(p, "fast"), f.route(p, "slow")
    ap, eu = f.region("ap-south"), f.region("eu-west")
    t = f.task("qa", [fast, slow], [ap, eu])
    for g in (ap, eu):
        _feed(t, fast, g, 30, e2e_ms=1000)
        _feed(t, slow, g, 30, e2e_ms=9000)
    board.refresh(T0 + timedelta(minutes=30))  # fast wins in both regions
    # In ap-south fast goes silent (8 slots missed by us), slow is probed on; in eu-west
    # slow goes silent (3 missed, and 2 before its last probe that are not its silence's).
    _miss(t, fast, ap, [T0 + timedelta(minutes=30 + i) for i in range(8)])
    _feed(t, slow, ap, 8, start_s=30 * 60, e2e_ms=9000)
    _miss(t, slow, eu, [T0 + timedelta(minutes=20, seconds=30 + i) for i in range(2)])
    _miss(t, slow, eu, [T0 + timedelta(minutes=31 + i) for i in range(3)])
    _feed(t, fast, eu, 8, start_s=30 * 60, e2e_ms=1000)
    now = T0 + timedelta(minutes=37)
    routes = list(t.routes.order_by("pk"))
    window = selection.Window.read(now - board.WINDOW, now + timedelta(hours=1))
    quiet = {g.pk: selection.quiet_routes(t, routes, window.latency(t, routes, g), now) for g in (ap, eu)}  # fmt: skip
    assert set(quiet[ap.pk]) == {fast.pk}
    assert set(quiet[eu.pk]) == {slow.pk}

    with CaptureQueriesContext(connection) as queries:
        together = selection.missed_in_regions(t, quiet, now)
    assert len(queries) == 1
    assert together == {ap.pk: {fast.pk: 8}, eu.pk: {slow.pk: 3}}
    for g in (ap, eu):
        assert together[g.pk] == selection.missed_since(t, g, quiet[g.pk], now)
    # The board says the same words as before, region by region.
    cells = {c.region_slug: c for c in board.refresh(now).rows[0].cells}
    assert cells["ap-south"].silence.endswith("8 slots since were missed by our ap-south workers")


@pytest.mark.django_db
def test_a_stale_challenger_cannot_take_a_cell_and_says_so_in_facts() -> None:
    p = f.provider()
    fast, slow = f.route(p, "fast"), f.route(p, "slow")
    ap = f.region("ap-south")
    t = f.task("qa", [fast, slow], [ap])
    _feed(t, fast, ap, 30, e2e_ms=1000)  # until T0 + 29 min, then nothing
    _feed(t, slow, ap, 60, e2e_ms=9000)  # until T0 + 59 min
    now = T0 + timedelta(minutes=59)
    assert _cell(now).route_id == slow.pk  # the first winner is named from fresh routes only
    routes = list(t.routes.order_by("pk"))
    window = selection.Window.read(now - board.WINDOW, now + timedelta(hours=1))
    choice = selection.decide(
        t,
        routes,
        window.latency(t, routes, ap),
        window.quality(t, routes),
        region=ap,
        now=now,
    )
    out = next(c for c in choice.candidates if c.route == fast)
    assert out.reason == selection.REASON_SILENT
    assert out.metric.n == 30  # its figures are there, beside the reason
    assert out.detail == "no probe for 30 min"  # no slot of it was missed: none is blamed


@pytest.mark.django_db
def test_after_the_documented_silence_a_fresh_route_takes_the_cell_and_says_why() -> None:
    p = f.provider()
    fast, slow = f.route(p, "fast"), f.route(p, "slow")
    ap = f.region("ap-south")
    t = f.task("qa", [fast, slow], [ap])
    assert selection.silence_limit(t) == timedelta(hours=1)
    _feed(t, fast, ap, 30, e2e_ms=1000)
    _feed(t, slow, ap, 30, e2e_ms=9000)
    assert _cell(T0 + timedelta(minutes=30)).route_id == fast.pk
    _feed(t, slow, ap, 61, start_s=30 * 60, e2e_ms=9000)  # fast says nothing for an hour
    cell = _cell(T0 + timedelta(minutes=89))  # fast's last probe 60 min ago: kept
    assert cell.route_id == fast.pk
    cell = _cell(T0 + timedelta(minutes=91))
    assert cell.route_id == slow.pk
    assert cell.why == (
        f"{fast} no probe for 62 min, longer than the 60 min a winner keeps its cell without probes"
    )


# --- a first winner and a takeover that converge on the truth ------------------------------


@pytest.mark.django_db
def test_no_first_winner_until_its_interval_closes_collecting_until_then() -> None:
    p = f.provider()
    r = f.route(p, "m")
    eu = f.region("eu-west")
    t = f.task("qa", [r], [eu])
    _feed(t, r, eu, 3, e2e_ms=1000)
    cell = _cell(T0 + timedelta(minutes=3))
    assert cell.route_id is None
    assert cell.reason == f"collecting: 3 of 6 reference probes ({r}, the most so far)"
    _feed(t, r, eu, 2, start_s=3 * 60, e2e_ms=1000)  # 5: a median, but no upper end yet
    cell = _cell(T0 + timedelta(minutes=5))
    assert cell.route_id is None
    assert cell.reason == f"collecting: 5 of 6 reference probes ({r}, the fastest so far)"
    assert not WinnerChange.objects.filter(task=t).exists()
    _feed(t, r, eu, 1, start_s=5 * 60, e2e_ms=1000)
    cell = _cell(T0 + timedelta(minutes=6))
    assert cell.winner is not None
    assert cell.winner.route_id == r.pk
    assert cell.winner.metric_high_ms is not None
    assert cell.why == "first route to qualify"


@pytest.mark.django_db
def test_a_challenger_whose_five_samples_all_lie_below_the_winners_takes_over() -> None:
    p = f.provider()
    relay, lyra = f.route(p, "relay-r1"), f.route(p, "lyra-sonnet")
    ap = f.region("ap-south")
    t = f.task("agent", [relay, lyra], [ap])
    for i in range(6):
        _feed(t, relay, ap, 1, start_s=i * 60, e2e_ms=89_000 + 1000 * i)
    assert _cell(T0 + timedelta(minutes=6)).route_id == relay.pk
    for i in range(5):
        _feed(t, lyra, ap, 1, start_s=6 * 60 + i * 60, e2e_ms=13_500 + 100 * i)
    cell = _cell(T0 + timedelta(minutes=10))  # both fresh
    assert cell.route_id == lyra.pk
    assert cell.why == f"all 5 of its reference probes below all 6 of {relay}'s (e2e p50)"
    # Its median's interval has no upper end at 5: "faster with confidence" could not say so.
    assert cell.winner is not None
    assert cell.winner.metric_high_ms is None


def test_all_below_is_read_conservatively_and_needs_enough_samples() -> None:
    from monitor.stats import confidence, hist

    def counts(*values: float) -> dict[int, int]:
        out: dict[int, int] = {}
        hist.add_into(out, hist.build(values, hist.MS))
        return out

    five_fast, five_slow = counts(*[1000.0] * 5), counts(*[5000.0] * 5)
    assert confidence.all_below(five_fast, five_slow)
    assert not confidence.all_below(five_slow, five_fast)
    assert not confidence.all_below(counts(1000, 1000), five_slow)  # 1 in 21: chance
    # Two values 1% apart share a bucket (5% wide): never called apart.
    assert not confidence.all_below(counts(*[1000.0] * 5), counts(*[1010.0] * 5))


# --- no winner: why, for the task as a whole -----------------------------------------------


@pytest.mark.django_db
def test_a_task_with_no_winner_says_what_each_route_lacked() -> None:
    p = f.provider()
    sloppy, flaky, new = f.route(p, "sloppy"), f.route(p, "flaky"), f.route(p, "new")
    eu = f.region("eu-west")
    t = f.task("qa", [sloppy, flaky, new], [eu], min_pass_rate=0.8)
    _feed(t, sloppy, eu, 20, e2e_ms=500, quality_pass=False)
    _feed(t, flaky, eu, 20, e2e_ms=500, quality_pass=True)
    _feed(t, flaky, eu, 20, start_s=1200, outcome="error", error_kind="http_5xx")
    _feed(t, new, eu, 3, start_s=1500, e2e_ms=500, quality_pass=True)
    cell = _cell(T0 + timedelta(minutes=30))
    assert cell.route_id is None
    assert cell.reason == (
        "no route meets the bar (3 routes judged: "
        f"{sloppy}: pass rate 0/20 (0%-16%) not surely at or above 80%; "
        f"{flaky}: 50% errors (20 of 40), above the 2.0% ceiling; "
        f"{new}: 3 of 10 graded probes needed)"
    )
    assert cell.why == ""


def test_a_task_reads_its_silence_limit_from_its_schedule() -> None:
    slow = Task(probe_interval_s=1800, probe_timeout_s=900)  # stale after 1.5 h
    assert selection.silence_limit(slow) == timedelta(hours=4.5)


# --- one writer of the winner's history ----------------------------------------------------


@pytest.mark.django_db
def test_a_reader_that_rebuilds_an_old_board_records_no_winner_change() -> None:
    p = f.provider()
    r = f.route(p, "m")
    eu = f.region("eu-west")
    t = f.task("qa", [r], [eu])
    _feed(t, r, eu, 10, e2e_ms=1000)
    now = T0 + timedelta(minutes=10)
    read = board.current(now)  # no snapshot and no beat: rebuilt for this reader
    assert read.rows[0].cells[0].route_id == r.pk
    assert not WinnerChange.objects.exists()
    board.refresh(now)  # beat's rebuild records it
    assert list(WinnerChange.objects.values_list("route_id", "reason")) == [
        (r.pk, "first route to qualify")
    ]
