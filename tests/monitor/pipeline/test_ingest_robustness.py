"""Ingest never loses a good result because of a bad one (real PostgreSQL).

It did: one rate-limit header past 2**31-1 failed the batch's COPY, and with it every probe of
that region's tick, on every tick. Now values are fitted to their columns before the write, a
payload that does not match the contract is rejected alone, and a batch the database refuses
is written again row by row; every rejection is logged without values and counted."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.urls import reverse

from monitor.models import GRAIN_HOUR, EvalCase, Heartbeat, ProbeResult, RaceRun, Rollup
from monitor.pipeline.ingest import races
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.ingest import rows as ingest_rows
from monitor.stats import hist
from tests.monitor import factories as f

T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
SECRET = "sk-live-do-not-log-0123456789"


@pytest.fixture
def setup(db: None):
    p = f.provider()
    r1, r2 = f.route(p, "m1"), f.route(p, "m2")
    eu = f.region("eu-west")
    t = f.task("qa", [r1, r2], [eu])
    return t, r1, r2, eu


def _rejected() -> int:
    row = Heartbeat.objects.filter(name=ingest.REJECTED_COUNTER).first()
    return row.count if row else 0


def _over_the_wire(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Celery's JSON: NaN and infinities survive it (Python's json writes and reads them).
    return json.loads(json.dumps(payloads))


def test_out_of_range_values_are_fitted_and_the_whole_batch_is_stored(setup) -> None:
    t, r1, _, eu = setup
    good = [f.payload(t, r1, eu, T0 + timedelta(minutes=i), ttft_ms=100.0 + i) for i in range(5)]
    huge = f.payload(t, r1, eu, T0 + timedelta(minutes=10), ttft_ms=200.0)
    huge["ratelimit_remaining_tokens"] = 2**40
    huge["ratelimit_remaining_requests"] = -(2**40)
    nan = f.payload(t, r1, eu, T0 + timedelta(minutes=11))
    nan.update(ttft_ms=float("nan"), tps=float("inf"), e2e_ms=float("-inf"), dns_ms=float("nan"))
    negative = f.payload(t, r1, eu, T0 + timedelta(minutes=12), ttft_ms=300.0, cached_tokens=-1)
    negative.update(output_tokens=-5, input_tokens=2**31, request_bytes=-1)
    text = f.payload(t, r1, eu, T0 + timedelta(minutes=13), ttft_ms=400.0)
    text.update(text="a\x00b" * 3000, error_kind="k" * 200, http_version="HTTP/" + "9" * 50)

    assert ingest.ingest(_over_the_wire([*good, huge, nan, negative, text])) == 9

    rows = {r.slot_at: r for r in ProbeResult.objects.all()}
    clamped = rows[T0 + timedelta(minutes=10)]
    # Above the column's range: clamped to its top; below it: null (no reading).
    assert clamped.ratelimit_remaining_tokens == 2**31 - 1
    assert clamped.ratelimit_remaining_requests is None
    nulled = rows[T0 + timedelta(minutes=11)]
    assert (nulled.ttft_ms, nulled.tps, nulled.e2e_ms, nulled.dns_ms) == (None, None, None, None)
    counts = rows[T0 + timedelta(minutes=12)]
    assert (counts.output_tokens, counts.cached_tokens, counts.request_bytes) == (None,) * 3
    assert counts.input_tokens == 2**31 - 1
    cut = rows[T0 + timedelta(minutes=13)]
    assert "\x00" not in cut.text
    assert len(cut.text) == ingest_rows.TEXT_LIMIT
    assert len(cut.error_kind) == 30
    assert len(cut.http_version) == 10
    assert _rejected() == 0

    hour = Rollup.objects.get(grain=GRAIN_HOUR, region=eu, route=r1)
    assert hour.count_ok == 9
    # TTFT from the rows that have one: the NaN row is not a sample.
    assert hist.total(hour.ttft_hist) == 8
    assert hist.total(hour.tps_hist) == 8
    assert hour.cache_reported == 0  # -1 cached tokens is no report, not a cache miss
    assert hour.output_tokens == 200 * 8
    assert hour.input_tokens == 1000 * 8 + 2**31 - 1


def test_payloads_that_do_not_match_are_rejected_alone_logged_and_counted(
    setup, caplog: pytest.LogCaptureFixture
) -> None:
    t, r1, r2, eu = setup
    good = [f.payload(t, r1, eu, T0 + timedelta(minutes=i)) for i in range(3)]
    wrong_type = f.payload(t, r2, eu, T0, ttft_ms=100.0)
    wrong_type["ttft_ms"] = "fast"
    secret_in_it = f.payload(t, r2, eu, T0 + timedelta(minutes=1))
    secret_in_it["error_detail"] = {"authorization": f"Bearer {SECRET}"}
    missing = f.payload(t, r2, eu, T0 + timedelta(minutes=2))
    del missing["route_id"]
    bad_time = f.payload(t, r2, eu, T0 + timedelta(minutes=3))
    bad_time["started_at"] = "yesterday"
    unknown_column = f.payload(t, r2, eu, T0 + timedelta(minutes=4))
    unknown_column["cost_usd"] = [1, 2]  # a column the contract does not list: checked all the same
    batch = [good[0], wrong_type, "not a result", secret_in_it, good[1], missing, bad_time]
    batch += [unknown_column, good[2]]

    assert ingest.ingest(_over_the_wire(batch)) == 3

    assert set(ProbeResult.objects.values_list("route_id", flat=True)) == {r1.pk}
    assert _rejected() == 6
    assert f"rejected result {t.pk}/{r2.pk}/{eu.pk}" in caplog.text
    assert "result.ttft_ms: expected float or null, got str" in caplog.text
    assert "result.route_id: missing" in caplog.text
    assert "started_at: not an ISO 8601 time" in caplog.text
    assert "result: expected an object, got str" in caplog.text
    assert "cost_usd: expected a number, got list" in caplog.text
    assert SECRET not in caplog.text
    assert "fast" not in caplog.text  # names the field, never the value
    hour = Rollup.objects.get(grain=GRAIN_HOUR, region=eu, route=r1)
    assert hour.count_ok == 3
    assert not Rollup.objects.filter(route=r2).exists()


def test_a_message_that_is_not_a_list_is_rejected_and_counted(setup) -> None:
    assert ingest.ingest({"results": []}) == 0
    assert _rejected() == 1
    assert ingest.ingest([]) == 0
    assert _rejected() == 1


def test_rows_the_database_refuses_are_written_one_by_one_around_them(
    setup, caplog: pytest.LogCaptureFixture
) -> None:
    t, r1, r2, eu = setup
    payloads = [f.payload(t, r1, eu, T0 + timedelta(minutes=i)) for i in range(4)]
    payloads.insert(2, f.payload(t, r2, eu, T0))
    r2_pk = r2.pk
    r2.delete()  # deleted while its result was on the way: the foreign key refuses the row

    assert ingest.ingest(_over_the_wire(payloads)) == 4

    assert ProbeResult.objects.count() == 4
    assert "writing them one by one" in caplog.text
    assert f"rejected result {t.pk}/{r2_pk}/{eu.pk}" in caplog.text
    assert "ForeignKeyViolation" in caplog.text
    assert _rejected() == 1
    assert Rollup.objects.get(grain=GRAIN_HOUR, region=eu, route=r1).count_ok == 4


def test_the_row_by_row_fallback_keeps_the_good_rows_of_a_batch_copy_refuses(
    setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the fitting (as before), 2**40 fails the COPY: the fallback still stores the
    rest of the batch and counts the one row."""
    t, r1, _, eu = setup
    payloads = [f.payload(t, r1, eu, T0 + timedelta(minutes=i)) for i in range(3)]
    payloads[1]["ratelimit_remaining_tokens"] = 2**40
    monkeypatch.setattr(ingest_rows, "_fit", lambda column, value: value)

    assert ingest.ingest(_over_the_wire(payloads)) == 2

    assert ProbeResult.objects.count() == 2
    assert _rejected() == 1
    assert Rollup.objects.get(grain=GRAIN_HOUR, region=eu, route=r1).count_ok == 2


def test_a_result_graded_against_a_deleted_eval_case_is_kept_ungraded_by_it(setup) -> None:
    t, r1, _, eu = setup
    case = EvalCase.objects.create(task=t, name="a", input="1+1", expected="2")
    payload = f.payload(t, r1, eu, T0, quality_pass=True)
    payload["eval_case_id"] = case.pk
    case.delete()
    assert ingest.ingest(_over_the_wire([payload])) == 1
    row = ProbeResult.objects.get()
    assert (row.eval_case_id, row.quality_pass) == (None, True)


def test_the_counter_adds_up_across_calls(setup) -> None:
    ingest.count_rejected(2)
    ingest.count_rejected(3)
    ingest.count_rejected(0)
    assert _rejected() == 5


def _race(t, eu, lanes: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {
        "race": {"task_id": t.pk, "region_id": eu.pk, "slot_at": T0.isoformat()},
        "started_at": T0.isoformat(),
        "winner_route_id": None,
        "winner_ms": None,
        "lanes": lanes,
        **kw,
    }


def _lane(**kw: Any) -> dict[str, Any]:
    lane: dict[str, Any] = {
        "elapsed_ms": 100.0,
        "cancelled": False,
        "tokens_paid": 10,
        "saved_ms": None,
        "outcome": "ok",
        "error_kind": "",
        "input_tokens": 100,
    }
    lane.update(kw)
    return lane


def test_a_race_result_with_out_of_range_values_is_stored_fitted(setup) -> None:
    t, r1, r2, eu = setup
    RaceRun.objects.create(task=t, region=eu, slot_at=T0, deadline_at=T0 + timedelta(minutes=5))
    result = _race(
        t,
        eu,
        {
            str(r1.pk): _lane(elapsed_ms=float("nan")),
            str(r2.pk): _lane(tokens_paid=2**40, saved_ms=float("inf"), cancelled=True),
        },
        winner_route_id=str(r1.pk),
        winner_ms=float("nan"),
    )
    assert races.ingest(json.loads(json.dumps(result))) is True
    run = RaceRun.objects.get()
    assert run.status == "done"
    assert run.winner_ms is None
    assert run.loser_tokens == 2**31 - 1
    assert run.lanes[str(r1.pk)]["elapsed_ms"] is None
    assert run.lanes[str(r2.pk)]["saved_ms"] is None
    assert run.cost_usd == run.loser_cost_usd + Decimal("0.000120")  # the winner's 100 in, 10 out


def test_a_race_result_that_does_not_match_is_rejected_counted_and_changes_nothing(
    setup, caplog: pytest.LogCaptureFixture
) -> None:
    t, r1, _, eu = setup
    RaceRun.objects.create(task=t, region=eu, slot_at=T0, deadline_at=T0 + timedelta(minutes=5))
    assert races.ingest(_race(t, eu, {str(r1.pk): _lane(tokens_paid="many")})) is False
    assert races.ingest(_race(t, eu, {}, started_at="soon")) is False
    assert races.ingest("a race") is False
    assert _rejected() == 3
    assert RaceRun.objects.get().status == "dispatched"  # the sweep records it missed
    assert "race result.lanes" in caplog.text
    assert "tokens_paid: expected int, got str" in caplog.text
    assert "slot_at or started_at is not an ISO 8601 time" in caplog.text
    assert "many" not in caplog.text
    assert "soon" not in caplog.text
    assert all(r.levelno == logging.WARNING for r in caplog.records if "rejected" in r.message)


def test_the_rejected_count_shows_in_the_admin_heartbeat_list(
    setup, client, django_user_model
) -> None:
    t, r1, _, eu = setup
    bad = f.payload(t, r1, eu, T0)
    bad["outcome"] = None
    ingest.ingest(_over_the_wire([bad]))
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-1")
    client.force_login(admin)
    body = client.get(reverse("admin:monitor_heartbeat_changelist")).content.decode()
    assert ingest.REJECTED_COUNTER in body
    row = body[body.index(ingest.REJECTED_COUNTER) :].split("</tr>")[0]
    assert '<td class="field-count">1</td>' in row
