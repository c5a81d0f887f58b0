"""Measuring real providers truthfully: request settings as the real APIs take them, speed that
counts only what streamed, what served each probe, and secrets that never leak.

The servers here are loopback servers replying with the real APIs' documented bytes
(tests/probes/real_apis.py), for behaviour the simulated provider does not have yet.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys

import pytest

from probes import ProbeSpec, probe
from probes.errors import Kind
from probes.model import MAX_COMPLETION_TOKENS, SOURCE_TOKENIZER, SOURCE_USAGE_MINUS_HIDDEN
from probes.tokenizer import count_tokens
from probes.transport import warm_clients
from simulator.testing import ROOT, SimulatorProcess
from tests.probes.loopback import LoopbackServer, Received, Reply, sse
from tests.probes.real_apis import (
    OPENAI_MODEL,
    SSE_HEADERS,
    WORDS,
    anthropic_stream,
    azure_stream,
    openai_reasoning,
)
from tests.probes.support import run
from tests.sim_fixtures import ANTHROPIC_KEY, OPENAI_KEY

KEY = "sk-proj-realistic-key-0123456789abcdef"


def _reasoning_spec(url: str, **kw: object) -> ProbeSpec:
    return ProbeSpec(
        base_url=url + "/v1",
        format="openai",
        model="o4-mini",
        api_key=KEY,
        max_tokens=4000,
        reasoning_effort="low",
        **kw,  # type: ignore[arg-type]
    )


def test_hidden_reasoning_is_its_own_figure_and_speed_counts_streamed_tokens_only() -> None:
    with LoopbackServer(openai_reasoning) as server:
        result = run(_reasoning_spec(server.url, token_limit_param=MAX_COMPLETION_TOKENS))
        sent = server.received[0].json()
        reply = server.replies[0]
    assert result.ok, result.error_detail
    assert sent["max_completion_tokens"] == 4000
    assert "max_tokens" not in sent
    assert sent["reasoning_effort"] == "low"
    assert "temperature" not in sent  # None: not sent
    # Ground truth: the server's send times of the 50 streamed answer tokens.
    token_times = reply.sent_at[1:51]
    truth_tps = (len(token_times) - 1) / (token_times[-1] - token_times[0])
    assert result.streamed_output_tokens == 50
    assert result.tps_token_source == SOURCE_USAGE_MINUS_HIDDEN
    assert result.tps is not None
    assert result.tps == pytest.approx(truth_tps, rel=0.02)
    assert result.tps < 150  # (2,050 - 1) / 0.5 s would be ~4,000 tok/s
    # Billed output stays what was billed; the hidden part is shown apart.
    assert result.output_tokens == 2050
    assert result.token_source == "usage"
    assert result.reasoning_tokens == 2000
    assert result.hidden_reasoning_tokens == 2000
    assert result.ttfat_ms == result.ttft_ms  # nothing streamed before the answer
    assert result.ttft_ms is not None
    assert result.ttft_ms > 150  # the hidden reasoning's time is in it
    assert result.served_model == OPENAI_MODEL
    assert result.service_tier == "default"
    assert result.request_id == "req_5f1c0ffee0123456789"


def test_the_same_route_with_max_tokens_is_a_config_error_naming_the_parameter() -> None:
    with LoopbackServer(openai_reasoning) as server:
        result = run(_reasoning_spec(server.url))  # token_limit_param="max_tokens"
    assert result.error_kind == Kind.CONFIG
    assert result.error_detail.startswith(
        "the route's request settings are wrong for this model: 'max_tokens' is not "
        "supported, use 'max_completion_tokens'"
    )
    assert not Kind(result.error_kind).counts_against_provider


def test_a_temperature_the_model_refuses_is_a_config_error() -> None:
    with LoopbackServer(openai_reasoning) as server:
        result = run(
            _reasoning_spec(server.url, token_limit_param=MAX_COMPLETION_TOKENS, temperature=0.2)
        )
    assert result.error_kind == Kind.CONFIG
    assert "'temperature' does not accept the value sent" in result.error_detail


def test_settings_are_sent_as_the_apis_name_them_and_extra_body_merges_last() -> None:
    with LoopbackServer(openai_reasoning) as server:
        run(
            _reasoning_spec(
                server.url,
                token_limit_param=MAX_COMPLETION_TOKENS,
                service_tier="flex",
                temperature=1.0,
                extra_body={"reasoning_effort": "high", "metadata": {"probe": "rw"}},
            )
        )
        sent = server.received[0].json()
    assert sent["service_tier"] == "flex"
    assert sent["temperature"] == 1.0
    assert sent["reasoning_effort"] == "high"  # merged last
    assert sent["metadata"] == {"probe": "rw"}
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


def test_azure_uses_the_deployment_url_api_key_header_and_api_version() -> None:
    with LoopbackServer(azure_stream) as server:
        result = run(
            ProbeSpec(
                base_url=server.url + "/openai/deployments/gpt-4o-eu",
                format="azure",
                model="gpt-4o",
                api_key=KEY,
                api_version="2024-10-21",
            )
        )
        request = server.received[0]
    assert result.ok, result.error_detail
    assert request.target == "/openai/deployments/gpt-4o-eu/chat/completions?api-version=2024-10-21"
    assert request.headers["api-key"] == KEY
    assert "authorization" not in request.headers
    assert result.text == "".join(WORDS)
    assert result.served_model == "gpt-4o-2024-11-20"  # not the filter chunk's ""
    assert result.request_id == "5d2c6f1e-azure"  # apim-request-id
    assert result.output_tokens == len(WORDS)


def _anthropic_spec(url: str, **kw: object) -> ProbeSpec:
    return ProbeSpec(
        base_url=url,
        format="anthropic",
        model="claude-sonnet-4-5",
        api_key=KEY,
        system_prompt="You answer briefly.",
        user_prompt="What is 12 * 12?",
        input_tokens=3000,
        max_tokens=4096,
        **kw,  # type: ignore[arg-type]
    )


def test_an_anthropic_stable_prefix_is_marked_for_caching_and_a_fresh_one_is_not() -> None:
    with LoopbackServer(anthropic_stream) as server:
        stable = run(_anthropic_spec(server.url))
        fresh = run(_anthropic_spec(server.url, fresh_prefix=True))
        stable_body, fresh_body = (r.json() for r in server.received)
        headers = server.received[0].headers
    assert stable.ok, stable.error_detail
    assert fresh.ok, fresh.error_detail
    assert headers["x-api-key"] == KEY
    assert headers["anthropic-version"] == "2023-06-01"
    [block] = stable_body["system"]
    assert block["cache_control"] == {"type": "ephemeral"}
    assert block["text"].startswith("You answer briefly.\n\n")
    # The block holds the padding: the prompt is about its target size, most of it cacheable.
    assert count_tokens(block["text"]) > 2900
    assert stable_body["messages"] == [{"role": "user", "content": "What is 12 * 12?"}]
    [fresh_block] = fresh_body["system"]
    assert "cache_control" not in fresh_block
    assert fresh_block["text"].startswith("Request ")
    assert fresh_block["text"] != block["text"]
    assert stable.served_model == "claude-sonnet-4-5-20250929"
    assert stable.service_tier == "standard"
    assert stable.request_id == "req_011CAnthropic"


def test_the_stable_padding_is_the_same_every_probe_and_fresh_padding_never_is() -> None:
    with LoopbackServer(anthropic_stream) as server:
        for fresh in (False, False, True, True):
            run(_anthropic_spec(server.url, fresh_prefix=fresh))
        texts = [r.json()["system"][0]["text"] for r in server.received]
    assert texts[0] == texts[1]
    assert texts[2] != texts[3]
    assert texts[2].split("\n", 1)[1] != texts[0]  # not only the first line differs


def test_anthropic_thinking_is_sent_and_a_summarized_thinking_is_not_counted_as_speed() -> None:
    summary = [" I", " should", " multiply", " twelve", " by", " twelve", "."]
    billed = 1500 + len(WORDS)  # the full thinking was 1,500 tokens; a summary streamed

    def handler(request: Received) -> Reply:
        return anthropic_stream(request, thinking=summary, output_tokens=billed)

    with LoopbackServer(handler) as server:
        result = run(_anthropic_spec(server.url, thinking_budget_tokens=2048))
        sent = server.received[0].json()
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert sent["max_tokens"] == 4096
    assert result.ok, result.error_detail
    assert result.output_tokens == billed
    assert result.tps_token_source == SOURCE_TOKENIZER
    assert result.streamed_output_tokens == len(summary) + len(WORDS)
    assert result.reasoning_tokens == 1500
    assert result.hidden_reasoning_tokens == 1500 - len(summary)
    assert result.ttfat_ms is not None
    assert result.ttft_ms is not None
    assert result.ttfat_ms > result.ttft_ms


def test_streamed_reasoning_is_derived_for_anthropic(
    sim: SimulatorProcess,
) -> None:
    result = run(
        ProbeSpec(
            base_url=sim.base_url + "/claudish",
            format="anthropic",
            model="claudish-think",
            api_key=ANTHROPIC_KEY,
            # Anthropic thinks only when asked, within max_tokens, which must exceed the budget.
            thinking_budget_tokens=1024,
            max_tokens=1124,
        )
    )
    assert result.ok, result.error_detail
    assert result.reasoning_tokens == 15  # the profile's; Anthropic's usage has no such field
    assert result.hidden_reasoning_tokens == 0
    assert result.tps_token_source == "usage"


def test_connection_reuse_is_recorded_from_what_the_connection_did(sim: SimulatorProcess) -> None:
    spec = ProbeSpec(
        base_url=sim.base_url + "/fastchip/v1",
        format="openai",
        model="fast-small",
        api_key=OPENAI_KEY,
        max_tokens=5,
    )

    async def go() -> list:  # type: ignore[type-arg]
        try:
            warm = [await probe(spec), await probe(spec)]
            cold = await probe(dataclasses.replace(spec, cold=True))
            return [*warm, cold]
        finally:
            await warm_clients.aclose()

    first, second, cold = asyncio.run(go())
    assert (first.connection_reused, second.connection_reused) == (False, True)
    assert cold.connection_reused is False
    assert second.connect_ms is None


def test_secret_headers_never_appear_in_repr_details_results_or_logs(
    sim: SimulatorProcess, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "gw-live-7e1d0c4b9a8f2e3d1c0b"
    echoed: list[str] = []

    def echoing_gateway(request: Received) -> Reply:
        # A gateway that quotes the credentials it refused, in its error and in its stream.
        echoed.append(request.headers["x-gateway-key"])
        if request.json().get("temperature") == 0.5:
            message = f"invalid gateway key {request.headers['x-gateway-key']}"
            body = json.dumps({"error": {"message": message}}).encode()
            return Reply(403, [("content-type", "application/json")], [(0.0, body)])
        chunks = sse(
            {"choices": [{"index": 0, "delta": {"content": "hi"}}]},
            {"error": {"message": f"upstream refused key {secret} and {KEY}"}},
            done=False,
        )
        return Reply(200, SSE_HEADERS, [(0.0, c) for c in chunks])

    caplog.set_level(logging.DEBUG)
    with LoopbackServer(echoing_gateway) as server:
        specs = [
            ProbeSpec(
                base_url=server.url + "/v1",
                format="openai",
                model="m",
                api_key=KEY,
                temperature=temperature,
                secret_headers={"x-gateway-key": secret},
            )
            for temperature in (0.5, None)
        ]
        results = [run(spec) for spec in specs]
    assert echoed == [secret, secret]  # it was sent
    assert [r.error_kind for r in results] == [Kind.HTTP_4XX, Kind.STREAM_ERROR]
    for spec, result in zip(specs, results, strict=True):
        assert "[redacted]" in result.error_detail
        for value in (secret, KEY):
            assert value not in repr(spec)
            assert value not in str(spec)
            assert value not in json.dumps(result.to_dict())
            assert value not in caplog.text


def test_the_cli_takes_the_request_settings_and_keeps_secret_headers_secret() -> None:
    secret = "gw-cli-secret-0123456789"
    with LoopbackServer(openai_reasoning) as server:
        command = [
            sys.executable,
            "-m",
            "probes",
            "--url",
            server.url + "/v1",
            "--format",
            "openai",
            "--model",
            "o4-mini",
            "--api-key-env",
            "RW_KEY",
            "--token-limit-param",
            "max_completion_tokens",
            "--reasoning-effort",
            "low",
            "--service-tier",
            "priority",
            "--extra-body",
            '{"user": "routewatch"}',
            "--secret-header-env",
            "x-gateway-key:RW_GATEWAY",
            "--json",
        ]
        env = dict(os.environ, RW_KEY=KEY, RW_GATEWAY=secret)
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        sent = server.received[0]
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["tps_token_source"] == SOURCE_USAGE_MINUS_HIDDEN
    assert record["hidden_reasoning_tokens"] == 2000
    assert record["served_model"] == OPENAI_MODEL
    body = sent.json()
    assert "max_completion_tokens" in body
    assert (body["reasoning_effort"], body["service_tier"], body["user"]) == (
        "low",
        "priority",
        "routewatch",
    )
    assert sent.headers["x-gateway-key"] == secret
    assert secret not in done.stdout + done.stderr
    assert KEY not in done.stdout + done.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "probes", "--help"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    for option in ("--token-limit-param", "--thinking-budget", "--api-version", "azure"):
        assert option in usage
