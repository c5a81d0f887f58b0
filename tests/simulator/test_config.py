"""The TOML config, and the demo's profiles against the seeds' figures."""

from __future__ import annotations

import subprocess
import sys

import httpx2
import pytest

from simulator.config import ConfigFileError, Profile, load, parse
from simulator.testing import CONFIGS, ROOT, SimulatorProcess

DEMO = load(CONFIGS / "demo.toml")


def _model(provider: str, model: str) -> Profile:
    return DEMO.providers[provider].models[model]


def _ttft_s(provider: str, model: str, input_tokens: int, answer: bool = False) -> float:
    p = _model(provider, model)
    ttft = p.queue_ms / 1000 + input_tokens / p.prefill_tokens_per_s
    return ttft + (p.reasoning_tokens / p.decode_tokens_per_s if answer else 0.0)


def test_the_demo_routes_are_labelled_simulated() -> None:
    for provider in DEMO.providers.values():
        assert provider.name.endswith("(simulated)")
        assert not provider.allow_fault_header
        for profile in provider.models.values():
            assert profile.label == "simulated"


def test_the_demo_matches_the_seeds_reference_routes() -> None:
    # Wafer-scale: TTFT 1.62 s at 10k input tokens, 1,823 tok/s.
    assert _ttft_s("waferscale", "wafer-llama-70b", 10_000) == pytest.approx(1.62, rel=0.05)
    assert _model("waferscale", "wafer-llama-70b").decode_tokens_per_s == pytest.approx(
        1823, rel=0.02
    )
    # Frontier reasoning: first answer token after ~75 s at 10k input tokens, 60 tok/s.
    assert _ttft_s("frontier", "frontier-reasoner", 10_000, answer=True) == pytest.approx(
        75.1, rel=0.05
    )
    assert _model("frontier", "frontier-reasoner").decode_tokens_per_s == 60
    mids = [_model("midcloud", m).decode_tokens_per_s for m in DEMO.providers["midcloud"].models]
    assert all(100 <= rate <= 220 for rate in mids)
    cheap = _model("budget", "tiny-1b")
    assert cheap.quality < 0.5
    assert cheap.price_output_per_mtok == min(
        m.price_output_per_mtok for p in DEMO.providers.values() for m in p.models.values()
    )


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({}, r"no \[\[providers\]\]"),
        ({"providers": [{"slug": "x", "format": "grpc"}]}, "format"),
        ({"providers": [{"slug": "x", "format": "openai", "colour": 1}]}, "colour"),
        (
            {"providers": [{"slug": "x", "format": "openai", "faults": {"gremlins": 0.1}}]},
            "gremlins",
        ),
        ({"providers": [{"slug": "x", "format": "openai", "faults": {"http_500": 2}}]}, "between"),
        (
            {"providers": [{"slug": "x", "format": "openai", "models": [{"id": "m", "speed": 1}]}]},
            "speed",
        ),
        ({"providers": [{"slug": "x", "format": "openai", "models": [{"quality": 0.5}]}]}, "id"),
        (
            {
                "providers": [
                    {
                        "slug": "x",
                        "format": "openai",
                        "models": [{"id": "m", "profile": "anthropic"}],
                    }
                ]
            },
            "profile must be one of",
        ),
        (
            {"providers": [{"slug": "x", "format": "anthropic", "profile": "azure-openai"}]},
            "profile must be one of",
        ),
        (
            {
                "providers": [
                    {
                        "slug": "x",
                        "format": "anthropic",
                        "models": [{"id": "m", "thinking_summary_ratio": 2}],
                    }
                ]
            },
            "thinking_summary_ratio",
        ),
        (
            {"providers": [{"slug": "x", "format": "openai", "advertised_tokens_per_minute": 0}]},
            "advertised_tokens_per_minute",
        ),
        (
            {
                "providers": [
                    {
                        "slug": "x",
                        "format": "openai",
                        "models": [{"id": "m", "decode_tokens_per_s": 0}],
                    }
                ]
            },
            "positive",
        ),
    ],
)
def test_bad_configs_are_refused_with_a_reason(raw: dict, error: str) -> None:
    with pytest.raises(ConfigFileError, match=error):
        parse(raw)


def test_a_single_api_key_is_accepted() -> None:
    config = parse({"providers": [{"slug": "x", "format": "openai", "api_key": "sk-1"}]})
    assert config.providers["x"].api_keys == ("sk-1",)


def test_the_demo_shows_each_real_apis_behaviour() -> None:
    profiles = {
        (p.slug, m.id): (p.profile, m.profile)
        for p in DEMO.providers.values()
        for m in p.models.values()
    }
    assert profiles[("frontier", "frontier-reasoner")] == ("openai", "openai-reasoning")
    assert ("openai", "openrouter-reasoning") in profiles.values()
    assert ("anthropic", "anthropic") in profiles.values()
    assert any(provider == "azure-openai" for provider, _ in profiles.values())
    lyra = _model("lyra", "lyra-sonnet")
    assert lyra.reasoning_tokens > 1024  # thinks when asked, within a 1,024+ budget
    assert 0 < lyra.thinking_summary_ratio < 1
    # Only the Cerebras-like provider documents msgpack bodies.
    assert [p.slug for p in DEMO.providers.values() if p.accepts_msgpack] == ["waferscale"]


def test_the_demo_config_serves() -> None:
    with SimulatorProcess(CONFIGS / "demo.toml", seed=1) as demo:
        models = httpx2.get(
            f"{demo.base_url}/lyra/v1/models",
            headers={"x-api-key": "sk-sim-lyra-demo-key", "anthropic-version": "2023-06-01"},
        ).json()
        assert [m["id"] for m in models["data"]] == ["lyra-sonnet"]
        # Demo providers ignore x-sim-fault: faults there come from configured probabilities.
        response = httpx2.post(
            f"{demo.base_url}/waferscale/v1/chat/completions",
            json={
                "model": "wafer-llama-70b",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
            },
            headers={
                "authorization": "Bearer sk-sim-waferscale-demo-key",
                "x-sim-fault": "http_500",
            },
        )
        assert response.status_code == 200
        refused = httpx2.post(
            f"{demo.base_url}/frontier/v1/chat/completions",
            json={
                "model": "frontier-reasoner",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
            },
            headers={"authorization": "Bearer sk-sim-frontier-demo-key"},
        )
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "max_tokens"
        azure = httpx2.post(
            f"{demo.base_url}/contoso/openai/deployments/contoso-gpt-4o-mini/chat/completions"
            "?api-version=2024-10-21",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            headers={"api-key": "5f3c9a7e1b2d4c6f8a0e9d7c5b3a1f2e"},
        )
        assert azure.status_code in (200, 429, 500)  # its configured fault rates
        assert azure.headers["x-sim-label"] == "simulated"


def test_token_rate_limits(sim: SimulatorProcess) -> None:
    url = f"{sim.base_url}/tokenlimited/v1/messages"
    headers = {"x-api-key": "sk-test-tokenlimited-0123456789", "anthropic-version": "2023-06-01"}
    body = {"model": "tiny", "max_tokens": 600, "messages": [{"role": "user", "content": "hi"}]}
    first = httpx2.post(url, json=body, headers=headers)
    assert first.status_code == 200
    assert int(first.headers["anthropic-ratelimit-tokens-remaining"]) < 400
    second = httpx2.post(url, json=body, headers=headers)
    assert second.status_code == 429
    assert second.json()["error"]["type"] == "rate_limit_error"
    assert int(second.headers["retry-after"]) >= 1


def test_the_simulator_does_not_import_django() -> None:
    code = (
        "import sys, simulator.__main__, simulator.app, simulator.testing, simulator.tasks\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'django'], 'django imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
