"""The engine against the strict simulated provider: an OpenAI reasoning profile that hides
its reasoning and refuses max_tokens and non-default temperatures, and Anthropic caching only
behind cache_control. The same behaviour is also tested against loopback servers faithful to
the real APIs' documented bytes (test_real_providers.py).
"""

from __future__ import annotations

import httpx2
import pytest

from probes import ProbeSpec
from probes.errors import Kind
from probes.model import MAX_COMPLETION_TOKENS, SOURCE_USAGE_MINUS_HIDDEN
from simulator.testing import SimulatorProcess
from tests.probes.support import run
from tests.sim_fixtures import ANTHROPIC_KEY

REASONING_KEY = "sk-test-oaisim-0123456789"


def _spec(sim: SimulatorProcess, model: str, **kw: object) -> ProbeSpec:
    settings: dict[str, object] = {"max_tokens": 300, **kw}
    return ProbeSpec(
        base_url=sim.base_url + "/oaisim/v1",
        format="openai",
        model=model,
        api_key=REASONING_KEY,
        **settings,  # type: ignore[arg-type]
    )


def _hidden_reasoning_model(sim: SimulatorProcess) -> str:
    """test.toml's OpenAI reasoning model, checked to refuse max_tokens as the real ones do."""
    result = run(_spec(sim, "o-think", max_tokens=5))
    assert result.error_kind == Kind.CONFIG, result.error_detail
    assert "'max_tokens'" in result.error_detail
    return "o-think"


def test_a_reasoning_route_with_max_completion_tokens_measures_streamed_speed(
    sim: SimulatorProcess,
) -> None:
    model = _hidden_reasoning_model(sim)
    result = run(_spec(sim, model, token_limit_param=MAX_COMPLETION_TOKENS))
    assert result.ok, result.error_detail
    truth = httpx2.get(f"{sim.base_url}/_sim/requests/{result.request_id}").json()
    assert result.hidden_reasoning_tokens == truth["reasoning_tokens"] > 0
    assert result.tps_token_source == SOURCE_USAGE_MINUS_HIDDEN
    streamed = result.streamed_output_tokens
    assert streamed == truth["output_tokens"] - truth["reasoning_tokens"]
    sent = truth["token_times"][-streamed:]  # the answer's tokens, whatever came before
    truth_tps = (len(sent) - 1) / (sent[-1] - sent[0])
    assert result.tps == pytest.approx(truth_tps, rel=0.02)
    assert result.ttfat_ms == result.ttft_ms


def test_the_same_reasoning_route_refuses_a_temperature_as_config(sim: SimulatorProcess) -> None:
    model = _hidden_reasoning_model(sim)
    result = run(_spec(sim, model, token_limit_param=MAX_COMPLETION_TOKENS, temperature=0.5))
    assert result.error_kind == Kind.CONFIG
    assert "'temperature'" in result.error_detail


def test_anthropic_caches_only_what_cache_control_marks(sim: SimulatorProcess) -> None:
    spec = ProbeSpec(
        base_url=sim.base_url + "/claudish",
        format="anthropic",
        model="claudish-mid",
        api_key=ANTHROPIC_KEY,
        system_prompt="Answer in one line. (strict-cache test)",
        input_tokens=3000,
        max_tokens=10,
    )
    run(spec)
    marked = run(spec)
    assert marked.cached_tokens is not None
    assert marked.cached_tokens >= 2048  # the engine marks its stable prefix
    # The same long prefix, sent twice by hand without the mark, is never cached.
    body = {
        "model": "claudish-mid",
        "max_tokens": 10,
        "system": "Unmarked prefix. " + "A long and stable document sentence. " * 400,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    headers = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}
    for _ in range(2):
        reply = httpx2.post(f"{sim.base_url}/claudish/v1/messages", json=body, headers=headers)
    assert reply.json()["usage"]["cache_read_input_tokens"] == 0
