"""The official SDKs stream from the simulator and parse every event."""

from __future__ import annotations

import asyncio
import gzip
import json

import anthropic
import httpx2
import msgpack
import openai
import pytest

from simulator.testing import SimulatorProcess
from tests.sim_fixtures import ANTHROPIC_KEY, OPENAI_KEY

LONG = "The quarterly report covers routes, regions and latency budgets. " * 200


def _openai(sim: SimulatorProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim.base_url}/fastchip/v1", api_key=OPENAI_KEY, max_retries=0)


def _anthropic(sim: SimulatorProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=f"{sim.base_url}/claudish", api_key=ANTHROPIC_KEY, max_retries=0
    )


def test_openai_sdk_streams_with_usage_and_cached_tokens(sim: SimulatorProcess) -> None:
    client = _openai(sim)
    question = [{"role": "user", "content": LONG + "What is 21 * 3?"}]
    usages = []
    for _ in range(2):  # the second call hits the prompt cache
        text, reasoning = [], []
        stream = client.chat.completions.create(
            model="mid-think",
            messages=question,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=200,
        )
        for chunk in stream:
            if chunk.usage:
                usages.append(chunk.usage)
            for choice in chunk.choices:
                if choice.delta.content:
                    text.append(choice.delta.content)
                extra = getattr(choice.delta, "reasoning_content", None)
                if extra:
                    reasoning.append(extra)
        assert "\nANSWER: " in "".join(text)  # right or wrong, per the profile's quality
        assert reasoning  # reasoning deltas come before the answer
    assert usages[0].completion_tokens == 60
    assert usages[0].prompt_tokens_details is not None
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    assert usages[1].prompt_tokens_details is not None
    assert usages[1].prompt_tokens_details.cached_tokens > 1000


def test_openai_sdk_async_and_non_streaming(sim: SimulatorProcess) -> None:
    async def scenario() -> tuple[str, int]:
        client = openai.AsyncOpenAI(
            base_url=f"{sim.base_url}/fastchip/v1", api_key=OPENAI_KEY, max_retries=0
        )
        parts = []
        stream = await client.chat.completions.create(
            model="fast-small",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            max_tokens=50,
        )
        async for chunk in stream:
            parts.extend(c.delta.content or "" for c in chunk.choices)
        whole = await client.chat.completions.create(
            model="fast-small", messages=[{"role": "user", "content": "hi"}], max_tokens=50
        )
        await client.close()
        assert whole.usage is not None
        return "".join(parts), whole.usage.completion_tokens

    text, tokens = asyncio.run(scenario())
    assert text
    assert tokens == 50


def test_anthropic_sdk_streams_thinking_and_cache_reads_when_asked(sim: SimulatorProcess) -> None:
    client = _anthropic(sim)
    kinds: set[str] = set()
    finals = []
    system = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    for question in ("What is 11 * 11?", "What is 12 * 12?"):
        with client.messages.stream(
            model="claudish-think",
            max_tokens=2000,
            thinking={"type": "enabled", "budget_tokens": 1024},
            system=system,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": question}],
        ) as stream:
            for event in stream:
                kinds.add(event.type)
            finals.append(stream.get_final_message())
    assert {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "thinking",
        "signature",
        "text",
    } <= kinds
    first, second = finals
    assert [block.type for block in first.content] == ["thinking", "text"]
    assert "ANSWER: " in first.content[-1].text  # type: ignore[union-attr]
    assert first.usage.output_tokens == 45  # 15 thinking + 30 answer tokens
    assert first.usage.cache_read_input_tokens == 0
    assert (first.usage.cache_creation_input_tokens or 0) > 1000
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens < 20  # only the question is not cached


def test_anthropic_sdk_sees_no_thinking_and_no_cache_unless_asked(sim: SimulatorProcess) -> None:
    client = _anthropic(sim)
    finals = []
    for _ in range(2):
        with client.messages.stream(
            model="claudish-think",
            max_tokens=200,
            system=LONG,
            messages=[{"role": "user", "content": "What is 11 * 11?"}],
        ) as stream:
            finals.append(stream.get_final_message())
    for message in finals:
        assert [block.type for block in message.content] == ["text"]
        assert message.usage.output_tokens == 30
        assert message.usage.cache_read_input_tokens == 0
        assert message.usage.cache_creation_input_tokens == 0
        assert message.usage.input_tokens > 1000


def test_anthropic_sdk_async_and_model_listing(sim: SimulatorProcess) -> None:
    async def scenario() -> tuple[str, list[str]]:
        client = anthropic.AsyncAnthropic(
            base_url=f"{sim.base_url}/claudish", api_key=ANTHROPIC_KEY, max_retries=0
        )
        async with client.messages.stream(
            model="claudish-mid", max_tokens=30, messages=[{"role": "user", "content": "hello"}]
        ) as stream:
            text = "".join([t async for t in stream.text_stream])
        models = [m.id async for m in client.models.list()]
        await client.close()
        return text, models

    text, models = asyncio.run(scenario())
    assert text
    assert models == ["claudish-mid", "claudish-think", "claudish-summary"]


def test_wrong_keys_get_each_dialects_error(sim: SimulatorProcess) -> None:
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{sim.base_url}/fastchip/v1", api_key="sk-wrong", max_retries=0
        ).models.list()
    with pytest.raises(anthropic.AuthenticationError) as caught:
        anthropic.Anthropic(
            base_url=f"{sim.base_url}/claudish", api_key="sk-wrong", max_retries=0
        ).messages.create(
            model="claudish-mid", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_msgpack_gzip_bodies_are_accepted(sim: SimulatorProcess) -> None:
    body = gzip.compress(
        msgpack.packb(
            {
                "model": "fast-small",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5,
            }
        )
    )
    response = httpx2.post(
        f"{sim.base_url}/fastchip/v1/chat/completions",
        content=body,
        headers={
            "authorization": f"Bearer {OPENAI_KEY}",
            "content-type": "application/vnd.msgpack",
            "content-encoding": "gzip",
        },
    )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 5
    truth = httpx2.get(
        f"{sim.base_url}/_sim/requests/{response.headers['x-sim-request-id']}"
    ).json()
    assert truth["output_tokens"] == 5
    assert json.dumps(truth)


def test_rate_limits_answer_429_with_retry_after(sim: SimulatorProcess) -> None:
    url = f"{sim.base_url}/limited/v1/chat/completions"
    headers = {"authorization": "Bearer sk-test-limited-0123456789"}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    statuses = [httpx2.post(url, json=body, headers=headers) for _ in range(5)]
    assert [r.status_code for r in statuses][:3] == [200, 200, 200]
    limited = statuses[-1]
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
    assert limited.headers["x-ratelimit-remaining-requests"] == "0"
