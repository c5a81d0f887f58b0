"""Every fault the simulator can inject ends in the right error_kind, within its deadline."""

from __future__ import annotations

import asyncio
import socket
import time
import tracemalloc

import httpx2
import pytest

from probes import ProbeSpec, probe
from probes.engine import _REJECTS_STREAM_OPTIONS
from probes.tokenizer import encoding
from probes.transport import warm_clients
from simulator.testing import SimulatorProcess
from tests.sim_fixtures import ANTHROPIC_KEY, OPENAI_KEY


def _spec(sim: SimulatorProcess, fmt: str = "openai", fault: str = "", **kw: object) -> ProbeSpec:
    path, model, key = (
        ("/fastchip/v1", "fast-small", OPENAI_KEY)
        if fmt == "openai"
        else ("/claudish", "claudish-mid", ANTHROPIC_KEY)
    )
    headers = {"x-sim-fault": fault} if fault else {}
    return ProbeSpec(
        base_url=sim.base_url + path,
        format=fmt,
        model=model,
        api_key=key,
        max_tokens=40,
        extra_headers=headers,
        **kw,
    )  # type: ignore[arg-type]


def _run(spec: ProbeSpec):
    async def go():
        try:
            return await probe(spec)
        finally:
            await warm_clients.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("http_500", "http_5xx"),
        ("http_503", "http_5xx"),
        ("http_429", "http_429"),
        ("malformed_chunk", "malformed_stream"),
        ("stream_error", "stream_error"),
        ("truncated", "truncated"),
    ],
)
def test_a_fault_ends_in_its_error_kind(
    sim: SimulatorProcess, fmt: str, fault: str, kind: str
) -> None:
    result = _run(_spec(sim, fmt, fault))
    assert result.outcome == "error"
    assert result.error_kind == kind, result.error_detail
    if kind == "http_429":
        assert result.retry_after_s is not None
        assert result.retry_after_s >= 1


@pytest.mark.parametrize(
    ("fault", "kind", "deadline_s"),
    [
        ("stall_headers", "timeout_headers", 1.0),
        ("trickle", "timeout_first_token", 1.0),
        ("stall_mid", "timeout_total", 1.5),
    ],
)
def test_stalled_and_trickling_servers_end_within_the_deadline(
    sim: SimulatorProcess, fault: str, kind: str, deadline_s: float
) -> None:
    spec = _spec(sim, "openai", fault, total_timeout_s=1.5, first_token_timeout_s=1.0)
    started = time.perf_counter()
    result = _run(spec)
    elapsed = time.perf_counter() - started
    assert result.error_kind == kind
    assert result.t0_perf is not None
    ended_after_t0 = time.perf_counter() - result.t0_perf
    assert ended_after_t0 < deadline_s + 0.1 + 0.05  # the deadline, plus 100 ms, plus closing
    assert elapsed < deadline_s + 1.0


def test_usage_missing_is_counted_with_the_tokenizer(sim: SimulatorProcess) -> None:
    result = _run(_spec(sim, "openai", "no_usage"))
    assert result.ok
    assert result.token_source == "tokenizer"
    truth = httpx2.get(f"{sim.base_url}/_sim/requests/{result.request_id}").json()
    assert result.output_tokens == truth["output_tokens"]
    assert result.cached_tokens is None  # not reported differs from 0


def test_usage_after_done_is_still_read(sim: SimulatorProcess) -> None:
    result = _run(_spec(sim, "openai", "usage_after_done"))
    assert result.ok
    assert result.token_source == "usage"
    assert result.output_tokens == 40


def test_a_server_rejecting_stream_options_is_retried_and_remembered(sim: SimulatorProcess) -> None:
    _REJECTS_STREAM_OPTIONS.clear()
    result = _run(_spec(sim, "openai", "reject_stream_options"))
    assert result.ok
    assert result.token_source == "tokenizer"  # no usage without stream_options
    assert f"{sim.base_url}/fastchip/v1/chat/completions" in _REJECTS_STREAM_OPTIONS
    _REJECTS_STREAM_OPTIONS.clear()


@pytest.mark.parametrize("fault", ["huge_response", "huge_line"])
def test_a_huge_response_or_line_stops_at_the_cap_without_growing_memory(
    sim: SimulatorProcess, fault: str
) -> None:
    cap = 2 * 1024 * 1024
    spec = _spec(
        sim, "openai", fault, max_response_bytes=cap, max_line_bytes=512 * 1024, total_timeout_s=20
    )
    encoding()  # the tokenizer's tables load once per process; not what this test measures
    tracemalloc.start()
    result = _run(spec)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert result.error_kind == "too_large"
    assert peak < 4 * cap + 8 * 1024 * 1024, peak  # bounded by the cap, not by what was sent


def test_dns_connect_tls_and_blocked_addresses_are_told_apart(
    sim: SimulatorProcess, tls_sim: SimulatorProcess
) -> None:
    assert (
        _run(
            ProbeSpec(base_url="http://no-such-host.invalid/v1", format="openai", model="m")
        ).error_kind
        == "dns"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    refused = _run(
        ProbeSpec(base_url=f"http://127.0.0.1:{closed_port}/v1", format="openai", model="m")
    )
    assert refused.error_kind == "connect"
    untrusted = _run(
        ProbeSpec(
            base_url=tls_sim.base_url + "/fastchip/v1",
            format="openai",
            model="fast-small",
            api_key=OPENAI_KEY,
        )
    )
    assert untrusted.error_kind == "tls"
    blocked = _run(_spec(sim, allow_private=False))
    assert blocked.error_kind == "blocked_url"
    assert "non-public" in blocked.error_detail


def test_proxy_variables_in_the_environment_do_not_reroute_probes(
    sim: SimulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy would take the connection out of our backend: no DNS timing, no address check,
    # no arrival stamps. The probe must connect itself, whatever the environment says.
    trap = socket.create_server(("127.0.0.1", 0))
    trap.settimeout(0.2)
    proxy = f"http://127.0.0.1:{trap.getsockname()[1]}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        result = _run(_spec(sim))
        assert result.outcome == "ok", result.error_detail
        blocked = _run(_spec(sim, allow_private=False))
        assert blocked.error_kind == "blocked_url"  # the address check still applies
        with pytest.raises(TimeoutError):
            trap.accept()  # nothing reached the would-be proxy
    finally:
        trap.close()
