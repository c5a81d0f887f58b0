"""Anthropic Messages as the real API behaves: prompt caching only at cache_control
breakpoints, extended thinking only when enabled, overloaded errors."""

from __future__ import annotations

import json
import uuid

import anthropic
import httpx2
import pytest

from simulator.testing import SimulatorProcess
from tests.sim_fixtures import ANTHROPIC_KEY

# About 1,400 tokens: over the 1,024-token minimum, under claudish-summary's 2,048.
DOCUMENT = "Routes, regions and latency budgets are measured every minute. " * 130
EPHEMERAL = {"type": "ephemeral"}


def _unique(text: str) -> str:
    """A prefix no other test has cached (the simulator is shared by the session)."""
    return f"[{uuid.uuid4()}] {text}"


def _post(sim: SimulatorProcess, **body: object) -> httpx2.Response:
    """A message request; a field given as None is left out."""
    payload = {"model": "claudish-mid", "max_tokens": 20, **body}
    payload.setdefault("messages", [{"role": "user", "content": "What is 2 * 3?"}])
    payload = {k: v for k, v in payload.items() if v is not None}
    return httpx2.post(
        f"{sim.base_url}/claudish/v1/messages",
        json=payload,
        headers={"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"},
        timeout=10,
    )


def _usage(sim: SimulatorProcess, **body: object) -> dict:
    response = _post(sim, **body)
    assert response.status_code == 200, response.text
    usage: dict = response.json()["usage"]
    return usage


def _total(usage: dict) -> int:
    return int(
        usage["input_tokens"]
        + usage["cache_creation_input_tokens"]
        + usage["cache_read_input_tokens"]
    )


def test_nothing_is_cached_without_cache_control(sim: SimulatorProcess) -> None:
    system = _unique(DOCUMENT)
    for _ in range(3):
        usage = _usage(sim, system=system)
        assert usage["cache_creation_input_tokens"] == 0
        assert usage["cache_read_input_tokens"] == 0
        assert usage["input_tokens"] > 1024


def test_a_system_breakpoint_is_written_then_read(sim: SimulatorProcess) -> None:
    system = [{"type": "text", "text": _unique(DOCUMENT), "cache_control": EPHEMERAL}]
    first = _usage(sim, system=system)
    second = _usage(sim, system=system, messages=[{"role": "user", "content": "Other question?"}])
    # The cached prefix is the system block; the question after it is plain input.
    assert first["cache_read_input_tokens"] == 0
    assert first["cache_creation_input_tokens"] > 1024
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert second["cache_creation_input_tokens"] == 0
    # input_tokens excludes both cache writes and reads.
    assert 0 < first["input_tokens"] < 20
    assert 0 < second["input_tokens"] < 20


def test_a_breakpoint_on_a_message_block_caches_everything_up_to_it(sim: SimulatorProcess) -> None:
    system = _unique("You answer in one line.")
    content = [
        {"type": "text", "text": DOCUMENT, "cache_control": EPHEMERAL},
        {"type": "text", "text": "What is 2 * 3?"},
    ]
    messages = [{"role": "user", "content": content}]
    first = _usage(sim, system=system, messages=messages)
    second = _usage(sim, system=system, messages=messages)
    assert first["cache_creation_input_tokens"] == second["cache_read_input_tokens"] > 1024
    # A change before the breakpoint is a different prefix: a miss, and a new write.
    changed = _usage(sim, system=system + "!", messages=messages)
    assert changed["cache_read_input_tokens"] == 0
    assert changed["cache_creation_input_tokens"] > 1024


def test_top_level_cache_control_caches_the_whole_prompt(sim: SimulatorProcess) -> None:
    messages = [{"role": "user", "content": _unique(DOCUMENT)}]
    first = _usage(sim, messages=messages, cache_control=EPHEMERAL)
    second = _usage(sim, messages=messages, cache_control=EPHEMERAL)
    assert first["cache_creation_input_tokens"] == _total(first)
    assert first["input_tokens"] == 0
    assert second["cache_read_input_tokens"] == _total(second)


def test_a_longer_conversation_reads_the_earlier_breakpoint(sim: SimulatorProcess) -> None:
    document = {"type": "text", "text": _unique(DOCUMENT)}
    marked = {**document, "cache_control": EPHEMERAL}
    first = _usage(sim, messages=[{"role": "user", "content": [marked]}])
    later = [
        {"role": "user", "content": [document]},
        {"role": "assistant", "content": "Noted."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "And now?", "cache_control": EPHEMERAL}],
        },
    ]
    second = _usage(sim, messages=later)
    # The lookback finds the first request's prefix; the rest is written anew.
    assert second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]
    assert second["cache_creation_input_tokens"] == _total(second) - _total(first)


def test_prefixes_under_the_minimum_are_not_cached(sim: SimulatorProcess) -> None:
    short = [{"type": "text", "text": _unique("Be brief. " * 100), "cache_control": EPHEMERAL}]
    for _ in range(2):
        usage = _usage(sim, system=short)
        assert usage["cache_creation_input_tokens"] == usage["cache_read_input_tokens"] == 0
    # claudish-summary's minimum is 2,048 tokens: the 1,400-token document is too short there.
    system = [{"type": "text", "text": _unique(DOCUMENT), "cache_control": EPHEMERAL}]
    for _ in range(2):
        usage = _usage(sim, model="claudish-summary", system=system)
        assert usage["cache_creation_input_tokens"] == usage["cache_read_input_tokens"] == 0
    longer = [{"type": "text", "text": _unique(DOCUMENT * 2), "cache_control": EPHEMERAL}]
    _usage(sim, model="claudish-summary", system=longer)
    assert _usage(sim, model="claudish-summary", system=longer)["cache_read_input_tokens"] > 2048


def test_a_cache_hit_shortens_the_prefill(sim: SimulatorProcess) -> None:
    system = [{"type": "text", "text": _unique(DOCUMENT * 4), "cache_control": EPHEMERAL}]
    ttfts = []
    for _ in range(2):
        response = _post(sim, system=system, stream=True)
        request_id = response.headers["x-sim-request-id"]
        truth = httpx2.get(f"{sim.base_url}/_sim/requests/{request_id}").json()
        ttfts.append(truth["first_token_at"] - truth["received_at"])
        assert truth["cached_tokens"] + truth["cache_creation_tokens"] <= truth["input_tokens"]
    cold, warm = ttfts
    assert cold - warm > 0.1  # ~5,500 tokens at 30,000 tokens/s: ~180 ms of prefill gone


@pytest.mark.parametrize(
    ("cache_control", "message"),
    [({"type": "persistent"}, "ephemeral"), ({"type": "ephemeral", "ttl": "2h"}, "ttl")],
)
def test_bad_cache_control_is_refused(
    sim: SimulatorProcess, cache_control: dict, message: str
) -> None:
    response = _post(sim, system=[{"type": "text", "text": "x", "cache_control": cache_control}])
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]


def test_more_than_four_breakpoints_are_refused(sim: SimulatorProcess) -> None:
    blocks = [{"type": "text", "text": f"part {i}", "cache_control": EPHEMERAL} for i in range(5)]
    response = _post(sim, system=blocks)
    assert response.status_code == 400
    assert response.json()["error"] == {
        "type": "invalid_request_error",
        "message": "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    }


def _events(response: httpx2.Response) -> list[tuple[str, dict]]:
    out, event = [], ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            out.append((event, json.loads(line[6:])))
    return out


def _stream(sim: SimulatorProcess, **body: object) -> tuple[list[tuple[str, dict]], dict]:
    payload = {
        "model": "claudish-summary",
        "max_tokens": 3000,
        "stream": True,
        "messages": [{"role": "user", "content": "What is 7 * 8?"}],
        **body,
    }
    with httpx2.stream(
        "POST",
        f"{sim.base_url}/claudish/v1/messages",
        json=payload,
        headers={"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"},
        timeout=10,
    ) as response:
        assert response.status_code == 200, response.read()
        events = _events(response)
        request_id = response.headers["x-sim-request-id"]
    return events, httpx2.get(f"{sim.base_url}/_sim/requests/{request_id}").json()


def test_no_thinking_blocks_unless_thinking_is_enabled(sim: SimulatorProcess) -> None:
    for extra in ({}, {"thinking": {"type": "disabled"}}):
        events, truth = _stream(sim, **extra)
        blocks = [d["content_block"]["type"] for e, d in events if e == "content_block_start"]
        assert blocks == ["text"]
        assert not any(d.get("delta", {}).get("type") == "thinking_delta" for _, d in events)
        assert truth["reasoning_tokens"] == 0
        assert truth["output_tokens"] == truth["streamed_tokens"] == 30


def test_thinking_is_billed_beyond_its_streamed_summary(sim: SimulatorProcess) -> None:
    events, truth = _stream(sim, thinking={"type": "enabled", "budget_tokens": 1024})
    blocks = [d["content_block"]["type"] for e, d in events if e == "content_block_start"]
    assert blocks == ["thinking", "text"]
    deltas = [d["delta"] for e, d in events if e == "content_block_delta"]
    thinking = [d["thinking"] for d in deltas if d["type"] == "thinking_delta"]
    text = [d["text"] for d in deltas if d["type"] == "text_delta"]
    assert [d["type"] for d in deltas].count("signature_delta") == 1
    assert "ANSWER: " in "".join(text)
    billed = next(d["usage"]["output_tokens"] for e, d in events if e == "message_delta")
    # 200 thinking tokens billed, a quarter of them streamed as the summary.
    assert len(thinking) == 50
    assert billed == 200 + len(text) == 230
    assert (truth["output_tokens"], truth["reasoning_tokens"]) == (230, 200)
    assert (truth["streamed_tokens"], truth["hidden_tokens"]) == (80, 150)
    assert len(truth["token_times"]) == 80
    # The summary is spread over the whole thinking time: its last token ends the thinking.
    assert truth["token_times"][49] - truth["token_times"][0] == pytest.approx(196 / 400, abs=0.01)
    assert truth["first_answer_token_at"] - truth["token_times"][49] == pytest.approx(
        1 / 400, abs=0.005
    )


def test_thinking_stops_at_its_budget(sim: SimulatorProcess) -> None:
    _, truth = _stream(
        sim,
        model="claudish-think",
        max_tokens=1030,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert truth["reasoning_tokens"] == 15  # the model needed 15 of its 1,024
    assert truth["output_tokens"] == 45


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"thinking": {"type": "enabled", "budget_tokens": 512}},
            "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024",
        ),
        (
            {"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 2000}},
            "`max_tokens` must be greater than `thinking.budget_tokens`",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 1024}, "temperature": 0.5},
            "`temperature` may only be set to 1 when thinking is enabled",
        ),
        ({"thinking": {"type": "enabled"}}, "budget_tokens: Field required"),
        ({"thinking": {"type": "sometimes"}}, "thinking"),
        ({"max_tokens": None}, "max_tokens: Field required"),
        ({"max_completion_tokens": 10}, "max_completion_tokens: Extra inputs are not permitted"),
    ],
)
def test_invalid_thinking_and_limits_get_the_apis_400(
    sim: SimulatorProcess, body: dict, message: str
) -> None:
    response = _post(sim, **{"model": "claudish-summary", "max_tokens": 3000, **body})
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert message in error["error"]["message"]


def test_a_model_without_thinking_refuses_it(sim: SimulatorProcess) -> None:
    response = _post(sim, max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 1024})
    assert response.status_code == 400


def test_overloaded_as_http_529_and_mid_stream(sim: SimulatorProcess) -> None:
    response = httpx2.post(
        f"{sim.base_url}/claudish/v1/messages",
        json={
            "model": "claudish-mid",
            "max_tokens": 20,
            "messages": [{"role": "user", "content": "x"}],
        },
        headers={
            "x-api-key": ANTHROPIC_KEY,
            "anthropic-version": "2023-06-01",
            "x-sim-fault": "http_529",
        },
    )
    assert response.status_code == 529
    assert response.json() == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
    }
    with httpx2.stream(
        "POST",
        f"{sim.base_url}/claudish/v1/messages",
        json={
            "model": "claudish-mid",
            "max_tokens": 20,
            "stream": True,
            "messages": [{"role": "user", "content": "x"}],
        },
        headers={
            "x-api-key": ANTHROPIC_KEY,
            "anthropic-version": "2023-06-01",
            "x-sim-fault": "stream_error",
        },
    ) as streamed:
        assert streamed.status_code == 200
        events = _events(streamed)
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    assert sum(d.get("delta", {}).get("type") == "text_delta" for _, d in events) == 5
    client = anthropic.Anthropic(
        base_url=f"{sim.base_url}/claudish", api_key=ANTHROPIC_KEY, max_retries=0
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(
            model="claudish-mid",
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-sim-fault": "http_529"},
        )
    assert caught.value.status_code == 529


def test_the_anthropic_sdk_with_thinking_and_cache_control(sim: SimulatorProcess) -> None:
    client = anthropic.Anthropic(
        base_url=f"{sim.base_url}/claudish", api_key=ANTHROPIC_KEY, max_retries=0
    )
    system = [{"type": "text", "text": _unique(DOCUMENT * 2), "cache_control": EPHEMERAL}]
    messages = []
    for _ in range(2):
        with client.messages.stream(
            model="claudish-summary",
            max_tokens=4000,
            thinking={"type": "enabled", "budget_tokens": 2048},
            system=system,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "What is 9 * 9?"}],
        ) as stream:
            messages.append(stream.get_final_message())
    first, second = messages
    assert [b.type for b in first.content] == ["thinking", "text"]
    assert first.usage.output_tokens == 230
    assert (first.usage.cache_creation_input_tokens or 0) > 2048
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens


def test_the_anthropic_version_header_is_required(sim: SimulatorProcess) -> None:
    response = httpx2.post(
        f"{sim.base_url}/claudish/v1/messages",
        json={
            "model": "claudish-mid",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
        },
        headers={"x-api-key": ANTHROPIC_KEY},
    )
    assert response.status_code == 400
    assert response.json()["error"] == {
        "type": "invalid_request_error",
        "message": "anthropic-version: header is required",
    }
