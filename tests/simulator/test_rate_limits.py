"""Rate-limit headers as each provider sends them."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import httpx2
import pytest

from simulator.testing import SimulatorProcess
from simulator.wire import go_duration
from tests.sim_fixtures import ANTHROPIC_KEY

OPENAI_BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


GO_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)$")


RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.02, "20ms"), (0.999, "999ms"), (1, "1s"), (1.5, "1.5s"), (360, "6m0s"),
     (3723, "1h2m3s"), (59.9994, "59.999s")],
)  # fmt: skip
def test_durations_are_written_the_way_openai_writes_them(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_openai_style_rate_limit_headers(sim: SimulatorProcess) -> None:
    url = f"{sim.base_url}/headroom/v1/chat/completions"
    headers = {"authorization": "Bearer sk-test-headroom-0123456789"}
    body = {**OPENAI_BODY, "max_tokens": 2000}
    first = httpx2.post(url, json=body, headers=headers)
    second = httpx2.post(url, json=body, headers=headers)
    assert first.status_code == second.status_code == 200
    assert not any(h.startswith("anthropic-") for h in first.headers)
    assert first.headers["x-ratelimit-limit-requests"] == "600"
    assert first.headers["x-ratelimit-limit-tokens"] == "100000"
    used = 2000 + first.json()["usage"]["prompt_tokens"]  # max_tokens counts up front
    assert first.headers["x-ratelimit-remaining-requests"] == "599"
    assert second.headers["x-ratelimit-remaining-requests"] == "598"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 100_000 - used
    assert int(second.headers["x-ratelimit-remaining-tokens"]) == 100_000 - 2 * used
    # Back to full after used / limit of a minute, written as Go durations are.
    assert first.headers["x-ratelimit-reset-requests"] == "100ms"
    assert second.headers["x-ratelimit-reset-requests"] == "200ms"
    assert second.headers["x-ratelimit-reset-tokens"] == go_duration(2 * used * 60 / 100_000)
    assert GO_DURATION.match(second.headers["x-ratelimit-reset-tokens"])
    assert second.headers["x-ratelimit-reset-tokens"].endswith("s")
    assert "." in second.headers["x-ratelimit-reset-tokens"]  # 4,002 tokens of 100,000: "2.401s"


def test_anthropic_style_rate_limit_headers(sim: SimulatorProcess) -> None:
    url = f"{sim.base_url}/claudish/v1/messages"
    body = {
        "model": "claudish-mid",
        "max_tokens": 7,
        "messages": [{"role": "user", "content": "hi"}],
    }
    before = datetime.now(UTC).replace(microsecond=0)
    response = httpx2.post(
        url, json=body, headers={"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}
    )
    assert response.status_code == 200
    assert not any(h.startswith("x-ratelimit-") for h in response.headers)
    for kind in ("requests", "tokens", "input-tokens", "output-tokens"):
        limit = int(response.headers[f"anthropic-ratelimit-{kind}-limit"])
        remaining = int(response.headers[f"anthropic-ratelimit-{kind}-remaining"])
        assert 0 <= remaining < limit
        reset = response.headers[f"anthropic-ratelimit-{kind}-reset"]
        assert RFC3339.match(reset), reset
        at = datetime.strptime(reset, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        assert before <= at <= before + timedelta(seconds=62)
    output_used = int(response.headers["anthropic-ratelimit-output-tokens-limit"]) - int(
        response.headers["anthropic-ratelimit-output-tokens-remaining"]
    )
    assert output_used >= 7  # max_tokens counts at the start of a request


@pytest.mark.parametrize(
    ("provider", "path", "headers", "body"),
    [
        (
            "hugelimits",
            "/v1/chat/completions",
            {"authorization": "Bearer sk-test-hugelimits-0123456789"},
            OPENAI_BODY,
        ),
        (
            "hugeclaude",
            "/v1/messages",
            {"x-api-key": "sk-test-hugeclaude-0123456789", "anthropic-version": "2023-06-01"},
            {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
        ),
    ],
)
def test_huge_limits_and_non_numeric_values(
    sim: SimulatorProcess, provider: str, path: str, headers: dict, body: dict
) -> None:
    url = f"{sim.base_url}/{provider}{path}"
    response = httpx2.post(url, json=body, headers=headers)
    assert response.status_code == 200
    limits = {k: v for k, v in response.headers.items() if "ratelimit" in k and "reset" not in k}
    assert len(limits) >= 4
    values = [int(v) for v in limits.values()]
    assert max(values) >= 10**12 - 10
    assert all(v > 2**31 - 1 for v in values)
    inf = httpx2.post(url, json=body, headers={**headers, "x-sim-fault": "ratelimit_inf"})
    assert inf.status_code == 200
    counts = [v for k, v in inf.headers.items() if "ratelimit" in k and "reset" not in k]
    assert counts
    assert set(counts) == {"inf"}
