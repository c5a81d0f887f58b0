"""The openai-reasoning profile behaves like an o-series / GPT-5 model in Chat Completions."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from simulator.testing import SimulatorProcess

KEY = "sk-test-oaisim-0123456789"
QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]


def _post(sim: SimulatorProcess, **body: object) -> httpx2.Response:
    payload = {"model": "o-think", "messages": QUESTION, **body}
    return httpx2.post(
        f"{sim.base_url}/oaisim/v1/chat/completions",
        json=payload,
        headers={"authorization": f"Bearer {KEY}"},
        timeout=10,
    )


def _stream(sim: SimulatorProcess, **body: object) -> tuple[list[dict], dict]:
    """The stream's data events (parsed) and the request's ground truth."""
    payload = {
        "model": "o-think",
        "messages": QUESTION,
        "stream": True,
        "stream_options": {"include_usage": True},
        **body,
    }
    with httpx2.stream(
        "POST",
        f"{sim.base_url}/oaisim/v1/chat/completions",
        json=payload,
        headers={"authorization": f"Bearer {KEY}"},
        timeout=10,
    ) as response:
        assert response.status_code == 200, response.read()
        events = [
            json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")
        ]
        request_id = response.headers["x-sim-request-id"]
    return events, httpx2.get(f"{sim.base_url}/_sim/requests/{request_id}").json()


def test_max_tokens_is_refused_with_openais_error(sim: SimulatorProcess) -> None:
    response = _post(sim, max_tokens=50)
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "unsupported_parameter",
        }
    }


@pytest.mark.parametrize("temperature", [0, 0.7, 2])
def test_a_non_default_temperature_is_refused(sim: SimulatorProcess, temperature: float) -> None:
    response = _post(sim, temperature=temperature, max_completion_tokens=50)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error",
        "temperature",
        "unsupported_value",
    )
    assert f"does not support {json.dumps(temperature)} with this model" in error["message"]


def test_the_default_temperature_is_allowed(sim: SimulatorProcess) -> None:
    assert _post(sim, temperature=1, max_completion_tokens=80).status_code == 200


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("reasoning_effort", "extreme", "unsupported_value"),
        ("service_tier", "turbo", "invalid_value"),
    ],
)
def test_unknown_efforts_and_tiers_are_refused(
    sim: SimulatorProcess, field: str, value: str, code: str
) -> None:
    response = _post(sim, **{field: value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (field, code)


def test_reasoning_is_billed_but_never_streamed(sim: SimulatorProcess) -> None:
    events, truth = _stream(sim, max_completion_tokens=500)
    deltas = [c["delta"] for e in events for c in e["choices"]]
    assert not any("reasoning_content" in d or "reasoning" in d for d in deltas)
    answer = [d["content"] for d in deltas if d.get("content")]
    usage = events[-1]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 40  # medium effort
    assert usage["completion_tokens"] == 40 + len(answer) == 60
    # Ground truth: what was streamed and what was hidden, apart.
    assert truth["output_tokens"] == 60
    assert truth["reasoning_tokens"] == truth["hidden_tokens"] == 40
    assert truth["streamed_tokens"] == len(truth["token_times"]) == len(answer) == 20
    # The first token a client sees is the answer's; hidden reasoning came before it.
    assert truth["first_token_at"] == truth["first_answer_token_at"] == truth["token_times"][0]
    hidden_s = 40 / 400
    assert truth["first_token_at"] - truth["received_at"] >= 0.040 + hidden_s
    # Speed over the streamed tokens only: 19 gaps at 400 tok/s.
    window_s = truth["token_times"][-1] - truth["token_times"][0]
    assert (truth["streamed_tokens"] - 1) / window_s == pytest.approx(400, rel=0.1)


def test_service_tier_is_in_every_chunk(sim: SimulatorProcess) -> None:
    events, truth = _stream(sim, service_tier="auto")
    assert events
    assert {e["service_tier"] for e in events} == {"default"}
    events, _ = _stream(sim, service_tier="flex")
    assert {e["service_tier"] for e in events} == {"flex"}
    assert truth["service_tier"] == "default"


def test_max_completion_tokens_bounds_reasoning_and_answer_together(
    sim: SimulatorProcess,
) -> None:
    events, truth = _stream(sim, max_completion_tokens=50)
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == 50
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 40
    assert truth["streamed_tokens"] == 10
    finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finish == ["length"]


def test_reasoning_can_use_the_whole_budget_and_leave_no_answer(sim: SimulatorProcess) -> None:
    events, truth = _stream(sim, max_completion_tokens=30)
    contents = [c["delta"].get("content") for e in events for c in e["choices"]]
    assert not any(contents)
    assert events[-1]["usage"]["completion_tokens"] == 30
    assert events[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 30
    assert (truth["streamed_tokens"], truth["hidden_tokens"], truth["output_tokens"]) == (0, 30, 30)
    assert truth["first_token_at"] is None
    # The stream still lasts as long as the reasoning took (30 tokens: 29 gaps after the first).
    assert truth["end_at"] - truth["received_at"] >= 0.040 + 29 / 400
    whole = _post(sim, max_completion_tokens=30).json()
    assert whole["choices"][0]["message"]["content"] == ""
    assert whole["choices"][0]["finish_reason"] == "length"


def test_more_effort_more_hidden_tokens_and_a_later_first_answer(sim: SimulatorProcess) -> None:
    hidden, first_answer_s = [], []
    for effort in ("minimal", "low", "medium", "high"):
        events, truth = _stream(sim, reasoning_effort=effort)
        assert (
            events[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"]
            == (truth["hidden_tokens"])
        )
        hidden.append(truth["hidden_tokens"])
        first_answer_s.append(truth["first_answer_token_at"] - truth["received_at"])
    assert hidden == [2, 16, 40, 100]
    assert first_answer_s == sorted(first_answer_s)
    # high: 100 hidden tokens at 400 tok/s before the answer, after a 40 ms queue.
    assert first_answer_s[-1] == pytest.approx(0.040 + 100 / 400, abs=0.01)


def test_priority_is_served_faster_and_flex_slower(sim: SimulatorProcess) -> None:
    ttft = {}
    for tier in ("priority", "default", "flex"):
        events, truth = _stream(sim, service_tier=tier)
        assert events[0]["service_tier"] == tier
        ttft[tier] = truth["first_answer_token_at"] - truth["received_at"]
        rate = (truth["streamed_tokens"] - 1) / (truth["last_token_at"] - truth["first_token_at"])
        ttft[f"{tier} rate"] = rate
    assert ttft["priority"] < ttft["default"] < ttft["flex"]
    assert ttft["priority rate"] > ttft["default rate"] > ttft["flex rate"]
    # Queueing differs most: 40 ms x 0.25 for priority, x 4 for flex.
    assert ttft["flex"] - ttft["default"] > 0.1


def test_a_whole_response_reports_the_tier_and_the_reasoning(sim: SimulatorProcess) -> None:
    data = _post(sim, max_completion_tokens=500, service_tier="priority").json()
    assert data["service_tier"] == "priority"
    assert data["model"] == "o-think-2026-01-01"
    assert "reasoning_content" not in data["choices"][0]["message"]
    assert data["usage"]["completion_tokens_details"]["reasoning_tokens"] == 40
    assert data["usage"]["completion_tokens"] == 60


def test_the_openai_sdk_streams_a_reasoning_model(sim: SimulatorProcess) -> None:
    client = openai.OpenAI(base_url=f"{sim.base_url}/oaisim/v1", api_key=KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="o-think",
        messages=QUESTION,  # type: ignore[arg-type]
        max_completion_tokens=500,
        reasoning_effort="low",
        service_tier="priority",
        stream=True,
        stream_options={"include_usage": True},
    )
    text, tiers, usage = [], set(), None
    for chunk in stream:
        tiers.add(chunk.service_tier)
        usage = chunk.usage or usage
        text.extend(c.delta.content or "" for c in chunk.choices)
    assert "ANSWER: 42" in "".join(text)  # quality 1.0
    assert tiers == {"priority"}
    assert usage is not None
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 16
    with pytest.raises(openai.BadRequestError, match="max_completion_tokens"):
        client.chat.completions.create(model="o-think", messages=QUESTION, max_tokens=10)  # type: ignore[arg-type]


def test_a_stream_cut_short_counts_the_hidden_tokens_before_it(sim: SimulatorProcess) -> None:
    body = {"model": "o-think", "messages": QUESTION, "stream": True}
    lines: list[str] = []
    with (
        httpx2.stream(
            "POST",
            f"{sim.base_url}/oaisim/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {KEY}", "x-sim-fault": "stall_mid"},
            timeout=httpx2.Timeout(5, read=0.5),
        ) as response,
        pytest.raises(httpx2.ReadTimeout),
    ):
        lines.extend(response.iter_lines())
    assert sum('"content":" ' in line for line in lines) == 5
    truth = httpx2.get(
        f"{sim.base_url}/_sim/requests/{response.headers['x-sim-request-id']}"
    ).json()
    # Five answer tokens went out, after all 40 hidden reasoning tokens were generated.
    assert (truth["streamed_tokens"], truth["hidden_tokens"], truth["output_tokens"]) == (5, 40, 45)
    assert truth["end_at"] is None
