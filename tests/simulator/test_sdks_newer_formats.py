"""The official SDKs read the simulator's newer dialects without error, and read the same
figures from them as the simulator's ground truth and the engine: the `openai` SDK's Responses
stream (its `responses.stream()` helper checks every event's identity and order), botocore's
own `bedrock-runtime` client (`converse_stream`: its SigV4 with the model id encoded twice, its
event-stream decoder with CRCs, its modelled in-stream exceptions) and `google-genai`
(`generate_content_stream`). If an SDK rejects the simulator's output, the simulator is wrong."""

from __future__ import annotations

import asyncio
from typing import Any

import botocore.session
import httpx2
import openai
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EventStreamError
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from probes import Measurement, ProbeSpec, probe
from probes.transport import warm_clients
from simulator.testing import SimulatorProcess

RESPONSES_KEY = "sk-test-oairesp-0123456789"
GEMINI_KEY = "test-gemsim-key-0123456789"
KEY_ID, SECRET = "AKIDTESTBEDSIM01", "test-secret-bedsim-0123456789"
CLAUDE = "anthropic.claude-sim-v1:0"
# Past every cache's minimum (1,024 tokens): the second request reads the prefix cached.
LONG = "The quarterly report covers routes, regions and latency budgets. " * 200


def _truth(sim: SimulatorProcess, request_id: str) -> dict[str, Any]:
    return dict(httpx2.get(f"{sim.base_url}/_sim/requests/{request_id}").json())


def _engine(spec: ProbeSpec) -> Measurement:
    async def go() -> Measurement:
        try:
            return await probe(spec)
        finally:
            await warm_clients.aclose()

    return asyncio.run(go())


# --- OpenAI Responses: the openai SDK ------------------------------------------------------


def _openai(sim: SimulatorProcess, fault: str = "") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{sim.base_url}/oairesp/v1",
        api_key=RESPONSES_KEY,
        max_retries=0,
        default_headers={"x-sim-fault": fault} if fault else None,
    )


@pytest.mark.parametrize("summary", [None, "auto"], ids=["hidden-reasoning", "summary"])
def test_openai_sdks_responses_stream_helper_accepts_every_event(
    sim: SimulatorProcess, summary: str | None
) -> None:
    client = _openai(sim)
    usages, kinds = [], []
    for _ in range(2):  # the second reads the prompt cache
        reasoning: dict[str, Any] = {"effort": "low"}
        if summary:
            reasoning["summary"] = summary
        with client.responses.stream(
            model="resp-think",
            input=f"Variant {summary}. " + LONG + "What is 21 * 3?",  # a prefix of its own
            max_output_tokens=600,
            reasoning=reasoning,  # type: ignore[arg-type]
            store=False,
        ) as stream:
            summary_text, answer = [], []
            for event in stream:
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    answer.append(event.delta)
                elif event.type == "response.reasoning_summary_text.delta":
                    summary_text.append(event.delta)
            final = stream.get_final_response()
        assert final.status == "completed"
        assert final.output_text == "".join(answer)
        assert "ANSWER: 63" in final.output_text
        assert bool(summary_text) == bool(summary)
        assert final.usage is not None
        truth = _truth(sim, final.id.removeprefix("resp_"))
        assert final.usage.output_tokens == truth["output_tokens"]
        assert final.usage.output_tokens_details.reasoning_tokens == truth["reasoning_tokens"] > 0
        assert final.usage.input_tokens == truth["input_tokens"]
        assert final.usage.input_tokens_details.cached_tokens == truth["cached_tokens"]
        assert final.model == "resp-think"
        assert final.service_tier == "default"
        assert final.store is False
        usages.append(final.usage)
    assert kinds[0] == "response.created"
    assert usages[0].input_tokens_details.cached_tokens == 0
    assert usages[1].input_tokens_details.cached_tokens >= 1024


def test_the_engine_reads_what_the_openai_sdk_reads(sim: SimulatorProcess) -> None:
    """The same request through the SDK and the engine: the same billed figures."""
    result = _engine(
        ProbeSpec(
            base_url=f"{sim.base_url}/oairesp/v1",
            format="responses",
            model="resp-think",
            api_key=RESPONSES_KEY,
            user_prompt="What is 21 * 3?",
            max_tokens=600,
            reasoning_effort="low",
        )
    )
    assert result.ok, result.error_detail
    with _openai(sim).responses.stream(
        model="resp-think",
        input="What is 21 * 3?",
        max_output_tokens=600,
        reasoning={"effort": "low"},
        store=False,
    ) as stream:
        final = stream.get_final_response()
    assert final.usage is not None
    assert result.output_tokens == final.usage.output_tokens
    assert result.reasoning_tokens == final.usage.output_tokens_details.reasoning_tokens
    assert result.hidden_reasoning_tokens == result.reasoning_tokens  # none streamed
    # The answers' words are drawn per request; the question's answer ends both.
    assert "ANSWER: 63" in final.output_text
    assert result.text is not None
    assert result.text.endswith("ANSWER: 63")
    assert result.served_model == final.model
    assert result.service_tier == final.service_tier


def test_openai_sdk_sees_a_cut_response_as_incomplete(sim: SimulatorProcess) -> None:
    """Reasoning used the whole max_output_tokens: the stream's helper accepts every event and
    the last is response.incomplete (its final-response accessor wants a completed one)."""
    with _openai(sim).responses.stream(
        model="resp-think", input="hi", max_output_tokens=30, store=False
    ) as stream:
        events = list(stream)
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.status == "incomplete"
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.usage is not None
    assert last.response.usage.output_tokens == 30


@pytest.mark.parametrize(
    ("fault", "code"),
    [("stream_error", "server_error"), ("stream_throttled", "rate_limit_exceeded")],
)
def test_openai_sdk_reads_an_in_stream_error_as_an_error_event(
    sim: SimulatorProcess, fault: str, code: str
) -> None:
    stream = _openai(sim, fault).responses.create(
        model="resp-plain", input="hi", max_output_tokens=60, stream=True, store=False
    )
    events = list(stream)
    assert events[-1].type == "error"
    assert events[-1].code == code
    assert [e.sequence_number for e in events] == list(range(len(events)))


# --- Bedrock ConverseStream: botocore's own client -------------------------------------------


def _bedrock(sim: SimulatorProcess, secret: str = SECRET, fault: str = "") -> Any:
    client = botocore.session.get_session().create_client(
        "bedrock-runtime",
        region_name="us-west-2",
        endpoint_url=f"{sim.base_url}/bedsim",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}),
    )
    if fault:

        def add_fault(request: Any, **_: Any) -> None:
            request.headers["x-sim-fault"] = fault

        # Before signing, as any header the service sees: the simulator verifies it signed.
        client.meta.events.register("before-sign.bedrock-runtime.ConverseStream", add_fault)
    return client


def _converse(client: Any, text: str, cache: bool = False) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"text": text}]
    if cache:
        content.append({"cachePoint": {"type": "default"}})
        content.append({"text": "What is 21 * 3?"})
    return dict(
        client.converse_stream(
            modelId=CLAUDE,
            messages=[{"role": "user", "content": content}],
            inferenceConfig={"maxTokens": 2000},
            additionalModelRequestFields={"thinking": {"type": "enabled", "budget_tokens": 1024}},
        )
    )


def test_botocore_converse_stream_decodes_every_event_and_the_usage(
    sim: SimulatorProcess,
) -> None:
    client = _bedrock(sim)
    metadata = []
    for _ in range(2):  # the second reads the prefix before the cachePoint from the cache
        response = _converse(client, LONG, cache=True)
        text, reasoning, kinds = [], [], []
        for event in response["stream"]:
            (kind,) = event
            kinds.append(kind)
            if kind == "contentBlockDelta":
                delta = event[kind]["delta"]
                text.append(delta.get("text", ""))
                reasoning.append(delta.get("reasoningContent", {}).get("text", ""))
            elif kind == "metadata":
                metadata.append(event[kind])
        assert kinds[0] == "messageStart"
        assert kinds[-2:] == ["messageStop", "metadata"]
        assert "ANSWER: 63" in "".join(text)
        assert "".join(reasoning)  # Claude's thinking, shown as Bedrock shows it
        truth = _truth(sim, response["ResponseMetadata"]["RequestId"])
        usage = metadata[-1]["usage"]
        assert usage["outputTokens"] == truth["output_tokens"]
        # inputTokens leaves cache reads and writes out, as Bedrock documents.
        assert (
            usage["inputTokens"]
            + usage.get("cacheReadInputTokens", 0)
            + usage.get("cacheWriteInputTokens", 0)
            == truth["input_tokens"]
        )
        assert usage.get("cacheReadInputTokens", 0) == truth["cached_tokens"]
        assert metadata[-1]["metrics"]["latencyMs"] > 0
        assert metadata[-1]["serviceTier"] == {"type": "default"}
    assert metadata[0]["usage"].get("cacheWriteInputTokens", 0) > 0
    assert metadata[1]["usage"]["cacheReadInputTokens"] > 0


def test_the_engine_reads_what_botocore_reads(sim: SimulatorProcess) -> None:
    response = _converse(_bedrock(sim), "What is 21 * 3?")
    usage = next(e["metadata"]["usage"] for e in response["stream"] if "metadata" in e)
    result = _engine(
        ProbeSpec(
            base_url=f"{sim.base_url}/bedsim",
            format="bedrock",
            model=CLAUDE,
            aws_region="us-west-2",
            aws_access_key_id=KEY_ID,
            aws_secret_access_key=SECRET,
            user_prompt="What is 21 * 3?",
            max_tokens=2000,
            thinking_budget_tokens=1024,
        )
    )
    assert result.ok, result.error_detail
    assert result.output_tokens == usage["outputTokens"]
    assert result.input_tokens == usage["inputTokens"]
    assert result.server_ms is not None


def test_botocore_is_refused_403_when_it_signs_with_the_wrong_secret(
    sim: SimulatorProcess,
) -> None:
    with pytest.raises(ClientError) as caught:
        _converse(_bedrock(sim, secret="not-the-secret"), "hi")
    error = caught.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert error["Error"]["Code"] == "InvalidSignatureException"
    assert error["Error"]["Message"].startswith(
        "The request signature we calculated does not match the signature you provided."
    )


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("stream_error", "modelStreamErrorException"),
        ("stream_throttled", "throttlingException"),
    ],
)
def test_botocore_raises_the_modelled_in_stream_exception(
    sim: SimulatorProcess, fault: str, code: str
) -> None:
    response = _converse(_bedrock(sim, fault=fault), "hi")
    with pytest.raises(EventStreamError) as caught:
        for _ in response["stream"]:
            pass
    assert caught.value.response["Error"]["Code"] == code


# --- Gemini native: google-genai ------------------------------------------------------------


def _gemini(sim: SimulatorProcess, key: str = GEMINI_KEY) -> genai.Client:
    return genai.Client(
        api_key=key,
        http_options=genai_types.HttpOptions(
            base_url=f"{sim.base_url}/gemsim/", api_version="v1beta"
        ),
    )


def test_google_genai_streams_thoughts_and_cumulative_usage(sim: SimulatorProcess) -> None:
    client = _gemini(sim)
    chunks = list(
        client.models.generate_content_stream(
            model="gem-think",
            contents="What is 21 * 3?",
            config=genai_types.GenerateContentConfig(
                max_output_tokens=1000,
                thinking_config=genai_types.ThinkingConfig(include_thoughts=True),
            ),
        )
    )
    parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]  # type: ignore[index,union-attr]
    thoughts = [p.text for p in parts if p.thought]
    answer = "".join(p.text or "" for p in parts if not p.thought)
    assert thoughts
    assert "ANSWER: 63" in answer
    last = chunks[-1]
    assert last.candidates[0].finish_reason == genai_types.FinishReason.STOP  # type: ignore[index]
    truth = _truth(sim, str(last.response_id))
    usage = last.usage_metadata
    assert usage is not None
    assert usage.thoughts_token_count == truth["reasoning_tokens"] > 0
    assert (usage.candidates_token_count or 0) + usage.thoughts_token_count == truth[
        "output_tokens"
    ]
    # Cumulative: every chunk's counts only grow, and the last holds the whole.
    counts = [(c.usage_metadata.total_token_count or 0) for c in chunks if c.usage_metadata]
    assert counts == sorted(counts)
    assert usage.total_token_count == truth["input_tokens"] + truth["output_tokens"]


def test_the_engine_reads_what_google_genai_reads(sim: SimulatorProcess) -> None:
    client = _gemini(sim)  # kept: a client closes its connections when it is collected
    chunks = list(
        client.models.generate_content_stream(
            model="gem-think",
            contents=LONG + "What is 21 * 3?",
            config=genai_types.GenerateContentConfig(max_output_tokens=1000),
        )
    )
    usage = chunks[-1].usage_metadata
    assert usage is not None
    result = _engine(
        ProbeSpec(
            base_url=f"{sim.base_url}/gemsim/v1beta",
            format="gemini",
            model="gem-think",
            api_key=GEMINI_KEY,
            user_prompt=LONG + "What is 21 * 3?",
            max_tokens=1000,
        )
    )
    assert result.ok, result.error_detail
    assert result.output_tokens == (usage.candidates_token_count or 0) + (
        usage.thoughts_token_count or 0
    )
    assert result.reasoning_tokens == usage.thoughts_token_count
    assert result.input_tokens == usage.prompt_token_count
    # The SDK's request wrote the prefix to the cache; the engine's read it.
    assert result.cached_tokens is not None
    assert result.cached_tokens >= 1024


def test_google_genai_raises_gemini_errors_from_the_simulator(sim: SimulatorProcess) -> None:
    wrong = _gemini(sim, key="not-a-key")
    with pytest.raises(genai_errors.ClientError) as caught:
        list(wrong.models.generate_content_stream(model="gem-think", contents="hi"))
    assert caught.value.code == 400
    assert caught.value.status == "INVALID_ARGUMENT"
    both = genai_types.ThinkingConfig(thinking_budget=100, thinking_level="LOW")  # type: ignore[arg-type]
    client = _gemini(sim)
    with pytest.raises(genai_errors.ClientError) as caught:
        list(
            client.models.generate_content_stream(
                model="gem-think",
                contents="hi",
                config=genai_types.GenerateContentConfig(thinking_config=both),
            )
        )
    assert caught.value.code == 400
