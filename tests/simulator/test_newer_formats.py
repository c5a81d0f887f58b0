"""The simulator's OpenAI Responses, Gemini native and Bedrock dialects are as strict as the
services: what a careless client gets wrong is refused the way the real API refuses it."""

from __future__ import annotations

import json
from typing import Any, cast

import httpx2
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import EventStreamBuffer

from simulator.testing import SimulatorProcess

KEY_ID, SECRET = "AKIDTESTBEDSIM01", "test-secret-bedsim-0123456789"
MODEL = "anthropic.claude-sim-v1:0"
BODY = json.dumps(
    {
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        "inferenceConfig": {"maxTokens": 20},
    }
).encode()


def _signed(url: str, signed_url: str | None = None, region: str = "us-west-2") -> dict[str, str]:
    request = AWSRequest(
        method="POST",
        url=signed_url or url,
        data=BODY,
        headers={"content-type": "application/json"},
    )
    SigV4Auth(Credentials(KEY_ID, SECRET), "bedrock", region).add_auth(request)
    return {k.lower(): v for k, v in request.headers.items()}


def test_bedrock_takes_a_model_id_with_a_colon_signed_as_botocore_signs_it(
    sim: SimulatorProcess,
) -> None:
    url = f"{sim.base_url}/bedsim/model/{MODEL.replace(':', '%3A')}/converse-stream"
    response = httpx2.post(url, content=BODY, headers=_signed(url))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/vnd.amazon.eventstream"
    buffer = EventStreamBuffer()
    buffer.add_data(response.content)
    kinds = [cast("dict[str, Any]", m.headers)[":event-type"] for m in buffer]
    assert kinds[0] == "messageStart"
    assert kinds[-2:] == ["messageStop", "metadata"]


def test_bedrock_answers_a_model_id_signed_unencoded_with_403_as_aws_does(
    sim: SimulatorProcess,
) -> None:
    # The classic mistake: the signature computed over the path with a bare ':' (encoded once
    # in the canonical URI), the request sent with it percent-encoded.
    sent = f"{sim.base_url}/bedsim/model/{MODEL.replace(':', '%3A')}/converse-stream"
    signed = f"{sim.base_url}/bedsim/model/{MODEL}/converse-stream"
    response = httpx2.post(sent, content=BODY, headers=_signed(sent, signed_url=signed))
    assert response.status_code == 403
    assert response.headers["x-amzn-errortype"].startswith("InvalidSignatureException:")
    assert response.json()["message"].startswith(
        "The request signature we calculated does not match the signature you provided."
    )


def test_bedrock_refuses_a_scope_for_another_region_and_an_unknown_key(
    sim: SimulatorProcess,
) -> None:
    url = f"{sim.base_url}/bedsim/model/{MODEL.replace(':', '%3A')}/converse-stream"
    other_region = httpx2.post(url, content=BODY, headers=_signed(url, region="eu-west-1"))
    assert other_region.status_code == 403
    assert other_region.headers["x-amzn-errortype"].startswith("InvalidSignatureException:")
    unknown = _signed(url)
    unknown["authorization"] = unknown["authorization"].replace(KEY_ID, "AKIDUNKNOWN000000000")
    response = httpx2.post(url, content=BODY, headers=unknown)
    assert response.status_code == 403
    assert response.headers["x-amzn-errortype"].startswith("UnrecognizedClientException:")
    assert httpx2.post(url, content=BODY).status_code == 403  # no credentials at all


def test_responses_refuses_chat_parameters_and_pads_deltas_unless_told_not_to(
    sim: SimulatorProcess,
) -> None:
    url = f"{sim.base_url}/oairesp/v1/responses"
    auth = {"authorization": "Bearer sk-test-oairesp-0123456789"}
    refused = httpx2.post(
        url, headers=auth, json={"model": "resp-plain", "input": "hi", "max_tokens": 20}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "unknown_parameter"
    body = {"model": "resp-plain", "input": "hi", "max_output_tokens": 20, "stream": True}
    padded = httpx2.post(url, headers=auth, json=body).text
    bare = httpx2.post(
        url, headers=auth, json={**body, "stream_options": {"include_obfuscation": False}}
    ).text
    assert '"obfuscation":' in padded
    assert '"obfuscation":' not in bare
    assert "[DONE]" not in bare
    numbers = [
        json.loads(line[6:])["sequence_number"]
        for line in bare.splitlines()
        if line.startswith("data: ")
    ]
    assert numbers == list(range(len(numbers)))


def test_gemini_hides_thoughts_unless_asked_and_bills_them_either_way(
    sim: SimulatorProcess,
) -> None:
    url = f"{sim.base_url}/gemsim/v1beta/models/gem-think:streamGenerateContent?alt=sse"
    headers = {"x-goog-api-key": "test-gemini-key-unused"}
    assert httpx2.post(url, headers=headers, json={"contents": [{}]}).status_code == 400
    headers = {"x-goog-api-key": "test-gemsim-key-0123456789"}

    def chunks(config: dict[str, Any]) -> list[dict[str, Any]]:
        body = {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": config}
        text = httpx2.post(url, headers=headers, json=body).text
        return [json.loads(line[6:]) for line in text.split("\r\n") if line.startswith("data: ")]

    hidden = chunks({"maxOutputTokens": 500})
    shown = chunks({"maxOutputTokens": 500, "thinkingConfig": {"includeThoughts": True}})

    def thought_parts(stream: list[dict[str, Any]]) -> int:
        return sum(
            1
            for c in stream
            for part in c["candidates"][0]["content"]["parts"]
            if part.get("thought")
        )

    assert thought_parts(hidden) == 0
    assert thought_parts(shown) > 0
    for stream in (hidden, shown):
        assert stream[-1]["usageMetadata"]["thoughtsTokenCount"] == 60
        assert stream[-1]["candidates"][0]["finishReason"] == "STOP"


def test_responses_keeps_the_response_unless_store_is_false(sim: SimulatorProcess) -> None:
    """`store` defaults to true (the response is kept and says so); anything but a boolean
    is refused."""
    url = f"{sim.base_url}/oairesp/v1/responses"
    auth = {"authorization": "Bearer sk-test-oairesp-0123456789"}
    body = {"model": "resp-plain", "input": "hi", "max_output_tokens": 20}
    assert httpx2.post(url, headers=auth, json=body).json()["store"] is True
    unstored = httpx2.post(url, headers=auth, json={**body, "store": False})
    assert unstored.json()["store"] is False
    truth = httpx2.get(
        f"{sim.base_url}/_sim/requests/{unstored.json()['id'].removeprefix('resp_')}"
    ).json()
    assert truth["options"]["store"] is False
    refused = httpx2.post(url, headers=auth, json={**body, "store": "no"})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_type"
    assert refused.json()["error"]["param"] == "store"


def test_gemini_takes_a_thinking_level_in_either_case(sim: SimulatorProcess) -> None:
    """The SDKs send the enum's name ("LOW"), the documentation's examples "low"."""
    url = f"{sim.base_url}/gemsim/v1beta/models/gem-think:generateContent"
    headers = {"x-goog-api-key": "test-gemsim-key-0123456789"}

    def thoughts(level: str) -> int:
        body = {
            "contents": [{"parts": [{"text": "hi"}]}],
            "generationConfig": {"thinkingConfig": {"thinkingLevel": level}},
        }
        response = httpx2.post(url, headers=headers, json=body)
        assert response.status_code == 200, response.text
        return int(response.json()["usageMetadata"]["thoughtsTokenCount"])

    assert thoughts("LOW") == thoughts("low") < thoughts("high")
    bad = {"contents": [{}], "generationConfig": {"thinkingConfig": {"thinkingLevel": "lots"}}}
    assert httpx2.post(url, headers=headers, json=bad).status_code == 400


def test_gemini_reads_a_field_by_either_of_its_proto3_json_names(sim: SimulatorProcess) -> None:
    """google-genai writes thinkingConfig's fields as `include_thoughts`, `thinking_budget`;
    the documentation's examples as `includeThoughts`, `thinkingBudget`. Proto3 JSON parsers,
    Google's among them, take both; a field given by both names is refused."""
    url = f"{sim.base_url}/gemsim/v1beta/models/gem-think:generateContent"
    headers = {"x-goog-api-key": "test-gemsim-key-0123456789"}

    def answer(thinking: dict[str, Any]) -> httpx2.Response:
        body = {
            "contents": [{"parts": [{"text": "hi"}]}],
            "generation_config": {"max_output_tokens": 500, "thinking_config": thinking},
        }
        return httpx2.post(url, headers=headers, json=body)

    snake = answer({"include_thoughts": True, "thinking_budget": 10})
    camel = answer({"includeThoughts": True, "thinkingBudget": 10})
    for response in (snake, camel):
        assert response.status_code == 200, response.text
        usage = response.json()["usageMetadata"]
        assert usage["thoughtsTokenCount"] == 10  # the budget was read
        parts = response.json()["candidates"][0]["content"]["parts"]
        assert any(p.get("thought") for p in parts)  # and includeThoughts
    assert answer({"thinking_budget": 10, "thinking_level": "low"}).status_code == 400
    twice = answer({"thinkingBudget": 10, "thinking_budget": 20})
    assert twice.status_code == 400
    assert "Duplicate field" in twice.json()["error"]["message"]
