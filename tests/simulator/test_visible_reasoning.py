"""Visible-reasoning servers: DeepSeek's reasoning_content and OpenRouter's reasoning deltas,
each with the SSE comments it sends while a request waits."""

from __future__ import annotations

import json
import math
import time

import httpx2
import openai
import pytest

from simulator.testing import SimulatorProcess

KEY = "sk-test-visible-0123456789"


def _read(sim: SimulatorProcess, model: str) -> tuple[list[tuple[float, str]], dict]:
    """Every non-empty line with its arrival time (perf_counter), and the ground truth."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is 5 * 5?"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    lines = []
    with httpx2.stream(
        "POST",
        f"{sim.base_url}/visible/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {KEY}"},
        timeout=10,
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line:
                lines.append((time.perf_counter(), line))
        request_id = response.headers["x-sim-request-id"]
    return lines, httpx2.get(f"{sim.base_url}/_sim/requests/{request_id}").json()


@pytest.mark.parametrize(
    ("model", "key", "comment", "waits_for_first_token"),
    [
        ("ds-think", "reasoning_content", ": keep-alive", False),
        ("or-think", "reasoning", ": OPENROUTER PROCESSING", True),
    ],
)
def test_reasoning_deltas_and_comments_while_waiting(
    sim: SimulatorProcess, model: str, key: str, comment: str, waits_for_first_token: bool
) -> None:
    lines, truth = _read(sim, model)
    comments = [(at, line) for at, line in lines if line.startswith(":")]
    data = [(at, json.loads(line[6:])) for at, line in lines if line.startswith("data: {")]
    assert {line for _, line in comments} == {comment}
    # Every 100 ms while the request waits, and only then: all before any data. DeepSeek's
    # wait is the queue (350 ms); OpenRouter's lasts to the first token (queue + prefill at
    # 50 tokens/s).
    waited_ms = truth["planned_ttft_ms"] if waits_for_first_token else 350
    if waits_for_first_token:
        assert waited_ms > 400  # the prefill makes it outlast the queue
    assert len(comments) == math.ceil(waited_ms / 100) - 1
    assert comments[-1][0] < data[0][0]
    deltas = [c["delta"] for _, e in data for c in e["choices"]]
    reasoning = [d[key] for d in deltas if d.get(key)]
    answer = [d["content"] for d in deltas if d.get("content")]
    other = "reasoning" if key == "reasoning_content" else "reasoning_content"
    assert not any(other in d for d in deltas)
    assert len(reasoning) == 12
    assert "ANSWER: 25" in "".join(answer)
    usage = data[-1][1]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 12
    assert usage["completion_tokens"] == truth["streamed_tokens"] == len(reasoning) + len(answer)
    assert truth["hidden_tokens"] == 0
    # Reasoning is streamed: the first token comes before the first answer token.
    assert truth["first_token_at"] < truth["first_answer_token_at"]
    assert truth["first_token_at"] - truth["received_at"] >= 0.35
    if waits_for_first_token:
        assert data[0][0] > truth["first_token_at"] - 0.002  # role chunk with the first token


def test_the_openai_sdk_skips_the_comments(sim: SimulatorProcess) -> None:
    client = openai.OpenAI(base_url=f"{sim.base_url}/visible/v1", api_key=KEY, max_retries=0)
    for model, key in (("ds-think", "reasoning_content"), ("or-think", "reasoning")):
        reasoning = []
        for chunk in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            for choice in chunk.choices:
                value = getattr(choice.delta, key, None)
                if value:
                    reasoning.append(value)
        assert len(reasoning) == 12
