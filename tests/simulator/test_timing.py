"""The simulator's timing is a ground truth: measured medians match the configured profile."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx2
import pytest

from simulator.config import load
from simulator.testing import CONFIGS, SimulatorProcess

KEY = {"authorization": "Bearer sk-test-statsim-0123456789"}
PROFILE = load(CONFIGS / "test.toml").providers["statsim"].models["stat-model"]


async def _one(client: httpx2.AsyncClient, url: str, prompt: str) -> tuple[float, float, dict]:
    body = {
        "model": "stat-model",
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": 12,
    }
    t0 = time.perf_counter()
    times = []
    # A seed per request: the sample of queue delays is the same in every run.
    headers = {**KEY, "x-sim-seed": prompt.split(":")[0].split()[-1]}
    async with client.stream("POST", url, json=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                times.append(time.perf_counter())
        request_id = response.headers["x-sim-request-id"]
    truth = (await client.get(url.split("/statsim")[0] + f"/_sim/requests/{request_id}")).json()
    ttft_ms = (times[0] - t0) * 1000
    rate = (len(times) - 1) / (times[-1] - times[0])
    return ttft_ms, rate, truth


@pytest.mark.slow
def test_ttft_and_decode_rate_medians_match_the_profile(sim: SimulatorProcess) -> None:
    url = f"{sim.base_url}/statsim/v1/chat/completions"

    async def run() -> list[tuple[float, float, dict]]:
        async with httpx2.AsyncClient(timeout=30) as client:
            out = []
            # 240 requests, 2 at a time: a client launching dozens at once would queue its own
            # sends and measure itself, not the server.
            for start in range(0, 240, 2):
                out += await asyncio.gather(
                    *(_one(client, url, f"Request {start + i}: hello") for i in range(2))
                )
            return out

    results = asyncio.run(run())
    prompt_tokens = results[0][2]["input_tokens"]
    expected_ttft_ms = PROFILE.queue_ms + prompt_tokens / PROFILE.prefill_tokens_per_s * 1000
    # The simulator's own TTFT (request read -> first token sent), on its clock: what the
    # profile promises. The client's view adds its own overhead, a few ms on a busy machine.
    ttft_median = statistics.median(
        (r[2]["first_token_at"] - r[2]["received_at"]) * 1000 for r in results
    )
    client_median = statistics.median(r[0] for r in results)
    assert 0 <= client_median - ttft_median < 15
    rate_median = statistics.median(r[1] for r in results)
    assert ttft_median == pytest.approx(expected_ttft_ms, rel=0.05)
    assert rate_median == pytest.approx(PROFILE.decode_tokens_per_s, rel=0.05)
    # The long tail: p95 well above the median (lognormal queue).
    ttfts = sorted(r[0] for r in results)
    assert ttfts[int(0.95 * len(ttfts))] > ttft_median * 1.3


def test_a_repeated_prefix_lowers_ttft_and_reports_cached_tokens(sim: SimulatorProcess) -> None:
    document = "Latency budgets and routes, region by region. " * 600  # ~6k tokens
    url = f"{sim.base_url}/fastchip/v1/chat/completions"
    headers = {"authorization": "Bearer sk-test-fastchip-0123456789"}
    truths = []
    for question in ("first?", "second?"):
        body = {
            "model": "slow-large",
            "messages": [{"role": "user", "content": document + question}],
            "stream": True,
            "max_tokens": 5,
        }
        with httpx2.stream("POST", url, json=body, headers=headers, timeout=30) as response:
            response.read()
            truths.append(
                httpx2.get(
                    f"{sim.base_url}/_sim/requests/{response.headers['x-sim-request-id']}"
                ).json()
            )
    cold, warm = truths
    assert cold["cached_tokens"] == 0
    assert warm["cached_tokens"] >= 5000
    cold_ttft = cold["first_token_at"] - cold["received_at"]
    warm_ttft = warm["first_token_at"] - warm["received_at"]
    assert warm_ttft < cold_ttft / 3  # prefill of ~6k tokens at 10k tok/s is gone


def test_http2_is_negotiated_when_the_client_asks(tls_sim: SimulatorProcess) -> None:
    url = f"{tls_sim.base_url}/fastchip/v1/models"
    headers = {"authorization": "Bearer sk-test-fastchip-0123456789"}
    with httpx2.Client(http2=True, verify=tls_sim.ssl_context()) as client:
        assert client.get(url, headers=headers).http_version == "HTTP/2"
    with httpx2.Client(http2=False, verify=tls_sim.ssl_context()) as client:
        assert client.get(url, headers=headers).http_version == "HTTP/1.1"
