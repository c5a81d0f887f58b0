"""Numbers a provider sends, end to end: whatever the rate-limit headers and usage counts hold
(huge, negative, inf, NaN, not numbers), every probe of a batch comes back `ok` through the real
engine and region worker, and ingest stores every row of the batch in PostgreSQL.

A property test: hypothesis draws the values, a real loopback server sends them over a socket
(tests/probes/test_numbers.py holds the engine's own guarantees)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from monitor.models import ProbeResult, Rollup
from monitor.pipeline.beat import slots
from monitor.pipeline.ingest import results as ingest
from monitor.pipeline.region import worker
from tests.monitor import factories as f
from tests.probes.loopback import LoopbackServer
from tests.probes.test_numbers import HEADERS, _reply, case, header_values, usage_values

BATCH = 4  # probes per batch: one bad value must not lose the other rows
_slot = itertools.count()


@override_settings(TICK_SECONDS=1)  # the worker spreads a batch's starts over one tick
@settings(
    max_examples=15,  # the engine's own number guarantees draw more (tests/probes/test_numbers.py)
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    wire=st.sampled_from(["openai", "anthropic"]),
    headers=st.fixed_dictionaries({}, optional=dict.fromkeys(HEADERS, header_values)),
    usage=st.tuples(usage_values, usage_values, usage_values, usage_values),
)
def test_no_number_a_provider_sends_fails_a_probe_or_loses_a_row(
    db: None, wire: str, headers: dict[str, str], usage: tuple[Any, ...]
) -> None:
    case.update(headers=headers, usage=usage)
    with LoopbackServer(_reply) as server:
        provider = f.provider(
            f"p{next(_slot)}",
            base_url=server.url + ("/v1" if wire == "openai" else ""),
            wire_format=wire,
        )
        routes = [f.route(provider, f"m{i}") for i in range(BATCH)]
        region = f.region(f"r-{provider.slug}")
        task = f.task(f"t-{provider.slug}", routes, [region], input_tokens=0, max_tokens=16)
        at = datetime(2026, 11, 2, 10, tzinfo=UTC) + timedelta(minutes=next(_slot))
        messages = [slots.probe_message(slots.Slot(task, r, region, at), [], n=0) for r in routes]
        payloads = worker.run_batch({"region": region.slug, "probes": messages})
    assert [p["outcome"] for p in payloads] == ["ok"] * BATCH, [
        (p.get("error_kind"), p.get("error_detail")) for p in payloads
    ]
    assert ingest.ingest(payloads) == BATCH
    stored = ProbeResult.objects.filter(task=task)
    assert stored.count() == BATCH
    assert all(r.outcome == "ok" for r in stored)
    hourly = Rollup.objects.get(task=task, grain="hour", region=region, route=routes[0])
    assert hourly.count_ok == 1
