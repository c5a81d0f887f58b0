"""The wire contract between beat, region workers and ingest (monitor.pipeline.messages): what
the scheduler plans is what monitor.tasks sends, over the real broker; messages in the shape
queued before this contract existed are still accepted; one that does not match is dropped
with a log line at the worker, never run half-read or retried."""

from __future__ import annotations

import copy
import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from monitor import celery_app, tasks
from monitor.crypto import encrypt_bound, origin_of
from monitor.models import ProbeResult, RegionKey
from monitor.pipeline import messages, signing
from monitor.pipeline.beat import races, scheduling, slots
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.region import worker
from probes.model import ProbeSpec
from simulator.testing import SimulatorProcess
from tests.monitor import factories as f
from tests.sim_fixtures import OPENAI_KEY, sim  # noqa: F401 (fixture)

NOW = datetime(2026, 11, 2, 10, 0, 30, tzinfo=UTC)


@pytest.fixture
def world(db: None, settings):
    settings.SLOT_GRACE_SECONDS = 300  # every first slot and race is still in time at NOW
    p = f.provider()
    routes = [f.route(p, f"m{i}") for i in range(2)]
    # Queues of their own on the shared broker: nothing else reads or fills them.
    regions = [f.region(f"t{uuid.uuid4().hex[:10]}") for _ in range(2)]
    t = f.task("qa", routes, regions, probe_interval_s=60, race_interval_s=300)
    return t, routes, regions


def _old_shape(message: dict[str, Any]) -> dict[str, Any]:
    """A probe message as the scheduler sent it before request settings existed."""
    old = copy.deepcopy(message)
    del old["request"]
    return old


def test_the_celery_task_names_never_change() -> None:
    # Messages already queued, and beat's schedule, name these.
    assert {
        "monitor.tasks.tick",
        "monitor.tasks.run_probe_batch",
        "monitor.tasks.ingest_results",
        "monitor.tasks.run_race",
        "monitor.tasks.ingest_race",
        "monitor.tasks.refresh_overview",
        "monitor.tasks.delete_old_results",
        "monitor.tasks.send_digests",
    } <= set(celery_app.tasks)
    assert tasks.run_probe_batch.name == messages.RUN_PROBE_BATCH
    assert tasks.run_race.name == messages.RUN_RACE


def test_the_plan_is_one_batch_per_region_then_one_message_per_race(world) -> None:
    _, routes, regions = world
    # Only the slots whose time has come (claimed ahead, a new schedule's first slot can be
    # later than NOW): the expiry below is judged on slots in the past.
    planned = scheduling.plan(NOW, ahead_s=0)
    batches = [d for d in planned if d.task_name == messages.RUN_PROBE_BATCH]
    raced = [d for d in planned if d.task_name == messages.RUN_RACE]
    assert planned == batches + raced
    assert {d.queue for d in batches} == {d.queue for d in raced} == {g.queue_name for g in regions}
    for d in batches:
        batch = messages.probe_batch_from_json(d.message)
        assert d.queue == f"probes.{batch['region']}"
        assert d.tally == len(batch["probes"]) == len(routes)
        # A worker that picks the batch up later could not finish before the deadlines:
        # counted from the first slot (it is in the past: the phases spread the slots over
        # the minute before NOW), not from when the tick sends it.
        first = min(datetime.fromisoformat(p["slot"]["slot_at"]) for p in batch["probes"])
        assert first < NOW
        assert d.expires == first + timedelta(seconds=300)
    for d in raced:
        race = messages.race_message_from_json(d.message)
        assert set(race["lanes"]) == {str(r.pk) for r in routes}
        assert d.expires == datetime.fromisoformat(race["race"]["slot_at"]) + timedelta(seconds=300)
    assert scheduling.plan(NOW, ahead_s=0) == []  # claimed once: a second beat sends nothing


def test_the_tick_sends_what_was_planned_to_each_region_queue(world) -> None:
    # Now, not NOW: Celery turns an expiry already past into 0.
    planned = scheduling.plan(timezone.now())
    sent = tasks.send(planned)
    assert sent == {
        **{d.tally_key: d.tally for d in planned if d.task_name == messages.RUN_PROBE_BATCH},
        "races": 2,
    }
    received = []
    with celery_app.connection_for_read() as conn:
        for queue in sorted({d.queue for d in planned}):
            with conn.SimpleQueue(queue) as q:
                while True:
                    try:
                        msg = q.get(timeout=1)
                    except q.Empty:
                        break
                    args, _, _ = msg.decode()
                    received.append((queue, msg.headers["task"], args[0], msg.headers["expires"]))
                    msg.ack()

    def key(r: tuple[Any, ...]) -> tuple[str, str]:
        return (r[0], r[1])

    # Each travels signed for its region, its secrets re-encrypted for that region only.
    opened = []
    for queue, task_name, envelope, expires in received:
        row = RegionKey.objects.get(region__slug=queue.removeprefix("probes."))
        keys = {row.key_id: signing.RegionSecret(row.key_id, row.get_secret())}
        kind = signing.KIND_BATCH if task_name == messages.RUN_PROBE_BATCH else signing.KIND_RACE
        _, env = signing.verify(envelope, keys, queue.removeprefix("probes."), kind)
        for probe in signing.probe_messages(kind, env["body"]):
            assert probe["provider"]["api_key_token"].startswith(f"rwr1.{row.key_id}.")
            probe["provider"]["api_key_token"] = "(wrapped)"
        # The expiry travels signed, judged by the worker in central time (monitor.pipeline.region.clock),
        # never as Celery's own `expires`, which Celery judges by the worker's clock.
        assert expires is None
        opened.append((queue, task_name, env["body"], env["expires_at"]))
    expected = [(d.queue, d.task_name, d.message, d.expires.timestamp()) for d in planned]
    for _, task_name, message, _ in expected:
        kind = signing.KIND_BATCH if task_name == messages.RUN_PROBE_BATCH else signing.KIND_RACE
        for probe in signing.probe_messages(kind, message):
            probe["provider"]["api_key_token"] = "(wrapped)"
    assert sorted(opened, key=key) == sorted(expected, key=key)


def test_a_message_queued_before_request_settings_existed_is_read_with_the_defaults(
    world,
) -> None:
    t, routes, regions = world
    message = slots.probe_message(slots.Slot(t, routes[0], regions[0], NOW), [])
    old = messages.probe_message_from_json(_old_shape(dict(message)))
    assert old == message
    assert old["request"] == {
        "token_limit_param": "max_tokens",
        "reasoning_effort": None,
        "thinking_budget_tokens": None,
        "service_tier": None,
        "temperature": None,
        "extra_body": {},
        "secret_headers_token": "",
        "api_version": None,
    }
    # A race result whose unusable lane carried only three keys, as the first workers sent it.
    result = messages.race_result_from_json(
        {
            "race": {"task_id": t.pk, "region_id": regions[0].pk, "slot_at": NOW.isoformat()},
            "started_at": NOW.isoformat(),
            "winner_route_id": None,
            "winner_ms": None,
            "lanes": {"7": {"outcome": "error", "error_kind": "config", "tokens_paid": 0}},
        }
    )
    assert result["lanes"]["7"]["cancelled"] is False
    assert result["lanes"]["7"]["elapsed_ms"] is None


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda m: m.pop("slot"), "slot: missing"),
        (lambda m: m["slot"].update(task_id="3"), "slot.task_id: expected int, got str"),
        (lambda m: m.update(http2="yes"), "http2: expected bool, got str"),
        (lambda m: m.update(max_tokens=True), "max_tokens: expected int, got bool"),
        (lambda m: m["provider"].update(extra_headers={"X": 1}), "extra_headers['X']"),
        (lambda m: m["request"].update(temperature="hot"), "request.temperature"),
        (lambda m: m.update(eval={"id": 1}), "eval.grader: missing"),
    ],
)
def test_a_probe_message_that_does_not_match_is_named_by_its_field(world, change, named) -> None:
    t, routes, regions = world
    message: dict[str, Any] = json.loads(
        json.dumps(slots.probe_message(slots.Slot(t, routes[0], regions[0], NOW), []))
    )
    change(message)
    with pytest.raises(messages.ContractError) as err:
        messages.probe_message_from_json(message)
    assert named in str(err.value)


def test_the_worker_drops_a_batch_that_does_not_match_with_a_log_line(
    world, caplog: pytest.LogCaptureFixture
) -> None:
    assert worker.run_batch({"region": "eu", "probes": "all of them"}) == []
    assert worker.run_batch(["not", "a", "batch"]) == []
    assert worker.run_race({"race": {}}) is None
    assert "rejected a probe batch: batch.probes: expected a list, got str" in caplog.text
    assert "rejected a probe batch: batch: expected an object, got list" in caplog.text
    assert "rejected a race message" in caplog.text


def test_a_bad_probe_is_left_out_and_the_rest_of_its_batch_still_runs(
    world, caplog: pytest.LogCaptureFixture
) -> None:
    t, routes, regions = world
    good = slots.probe_message(slots.Slot(t, routes[0], regions[0], NOW), [])
    good["provider"] = {**good["provider"], "api_key_token": "not-a-fernet-token"}
    bad = {**good, "model": None}
    payloads = worker.run_batch({"region": regions[0].slug, "probes": [bad, good]})
    # The good one could not start (its key does not decrypt): a config result, ours.
    assert [(p["route_id"], p["outcome"], p.get("error_kind")) for p in payloads] == [
        (routes[0].pk, "error", "config")
    ]
    assert "batch.probes[0].model: expected str, got null" in caplog.text


def test_secret_headers_travel_encrypted_and_reach_the_spec_only_when_set(world) -> None:
    t, routes, regions = world
    message = slots.probe_message(slots.Slot(t, routes[0], regions[0], NOW), [])
    unset = worker.spec_kwargs(message, None, "key", {})
    assert set(unset).isdisjoint(worker.UNSET_REQUEST_SETTINGS)
    ProbeSpec(**unset)  # today's message builds today's spec

    headers = {"X-Org-Secret": "org-secret-0123456789"}
    url = message["provider"]["base_url"]
    token = encrypt_bound(origin_of(url), json.dumps(headers))
    assert "org-secret" not in token
    assert worker.secret_headers(token, url) == headers
    message["request"] = {
        **message["request"],
        "reasoning_effort": "low",
        "secret_headers_token": token,
    }
    kwargs = worker.spec_kwargs(message, None, "key", worker.secret_headers(token, url))
    assert kwargs["reasoning_effort"] == "low"
    assert kwargs["secret_headers"] == headers
    assert "temperature" not in kwargs  # unset settings are left to the engine's defaults
    # This passes on both sides of the probes/ merge: an engine with the field takes the
    # setting; one without it fails the probe as ours (config), naming the setting.
    if "reasoning_effort" in {f.name for f in dataclasses.fields(ProbeSpec)}:
        assert worker.spec_for(message, {}).reasoning_effort == "low"  # type: ignore[attr-defined]
    else:
        with pytest.raises(worker.Unusable, match="no request setting reasoning_effort"):
            worker.spec_for(message, {})


def test_secret_headers_that_do_not_decrypt_fail_as_ours_without_showing_them(world) -> None:
    url = "https://api.example.com/v1"
    token = encrypt_bound(origin_of(url), "X-Org-Secret: org-secret-0123456789")
    with pytest.raises(worker.Unusable) as err:
        worker.secret_headers(token, url)
    assert str(err.value) == "secret headers are not a JSON object"
    with pytest.raises(worker.Unusable, match="cannot be decrypted"):
        worker.secret_headers("gAAAA-not-a-token", url)
    with pytest.raises(worker.Unusable, match="another origin") as err:
        worker.secret_headers(token, "https://attacker.example.net/v1")
    assert "org-secret" not in str(err.value)


@pytest.mark.django_db
def test_a_batch_queued_in_the_old_shape_is_probed_and_stored(
    sim: SimulatorProcess,  # noqa: F811
) -> None:
    p = f.provider("fastchip", base_url=f"{sim.base_url}/fastchip/v1")
    p.set_api_key(OPENAI_KEY)
    p.save()
    route = f.route(p, "fast-small")
    region = f.region("local")
    t = f.task("old", [route], [region], max_tokens=20, probe_timeout_s=20)
    at = timezone.now().replace(microsecond=0)
    message = slots.probe_message(slots.Slot(t, route, region, at), [])
    queued = json.loads(json.dumps({"region": "local", "probes": [_old_shape(dict(message))]}))

    payloads = worker.run_batch(queued)  # real HTTP to the simulator

    assert [p["outcome"] for p in payloads] == ["ok"], payloads
    wire = json.loads(json.dumps(messages.results_to_json(payloads)))
    assert ingest.ingest(wire) == 1
    row = ProbeResult.objects.get()
    assert (row.route, row.slot_at, row.outcome) == (route, at, "ok")
    assert row.ttft_ms is not None
    assert row.output_tokens


def test_a_race_message_round_trips_through_json(world) -> None:
    t, _, regions = world
    message = races.race_message(t, regions[0], NOW, [], NOW)
    wire = json.loads(json.dumps(messages.race_message_to_json(message)))
    assert messages.race_message_from_json(wire) == message
