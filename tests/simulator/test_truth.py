"""The ground truth a client on the same host can compare (`GET /_sim/requests/<id>`)."""

from __future__ import annotations

import json
import time

import httpx2
import pytest

from simulator.testing import SimulatorProcess
from tests.sim_fixtures import OPENAI_KEY


def test_ground_truth_is_on_the_clients_clock(sim: SimulatorProcess) -> None:
    body = {
        "model": "mid-think",
        "messages": [{"role": "user", "content": "What is 12 * 12?"}],
        "max_tokens": 100,
        "stream": True,
    }
    t0 = time.perf_counter()
    arrivals = []
    with httpx2.stream(
        "POST",
        f"{sim.base_url}/fastchip/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {OPENAI_KEY}"},
    ) as response:
        headers_at = time.perf_counter()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content") or delta.get("reasoning_content"):
                    arrivals.append(time.perf_counter())
        request_id = response.headers["x-sim-request-id"]
    truth = httpx2.get(f"{sim.base_url}/_sim/requests/{request_id}").json()
    assert t0 < truth["received_at"] <= truth["headers_sent_at"] <= headers_at
    assert truth["headers_sent_at"] < truth["first_token_at"] < truth["first_answer_token_at"]
    assert truth["first_answer_token_at"] <= truth["last_token_at"] <= truth["end_at"]
    assert truth["output_tokens"] == len(truth["token_times"]) == len(arrivals) == 60
    assert truth["reasoning_tokens"] == 20
    assert truth["token_times"][0] == truth["first_token_at"]
    assert truth["token_times"][20] == truth["first_answer_token_at"]
    # Each token was sent before it arrived, and arrived soon after on the same clock (loopback;
    # the bound leaves room for a loaded machine stalling this reading process).
    for sent, seen in zip(truth["token_times"], arrivals, strict=True):
        assert 0 < seen - sent < 0.25
    # The planned timing is what was sent: TTFT = queue + prefill, then 200 tokens/s.
    assert truth["first_token_at"] - truth["received_at"] == pytest.approx(
        truth["planned_ttft_ms"] / 1000, abs=0.004
    )
    gaps = (truth["last_token_at"] - truth["first_token_at"]) / 59
    assert gaps == pytest.approx(1 / 200, rel=0.05)
    assert truth["send_lag_max_ms"] < 20
    assert {"model", "provider", "faults", "input_tokens", "cached_tokens"} <= set(truth)
    assert (truth["provider"], truth["model"], truth["http_version"]) == (
        "fastchip",
        "mid-think",
        "1.1",
    )


def test_unknown_request_ids_and_paths(sim: SimulatorProcess) -> None:
    assert httpx2.get(f"{sim.base_url}/_sim/requests/nope").status_code == 404
    assert httpx2.get(f"{sim.base_url}/nobody/v1/models").status_code == 404
    response = httpx2.get(
        f"{sim.base_url}/fastchip/v1/embeddings", headers={"authorization": f"Bearer {OPENAI_KEY}"}
    )
    assert response.status_code == 404
    assert response.headers["x-sim-request-id"]
    assert httpx2.get(f"{sim.base_url}/_sim/health").json()["status"] == "ok"
