"""The azure-openai provider profile: Azure's URLs, api-key header, errors and content filters."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from simulator.testing import SimulatorProcess

KEY = "0123456789abcdef0123456789abcdef"
VERSION = "2024-10-21"
BODY = {"messages": [{"role": "user", "content": "What is 4 * 4?"}], "max_tokens": 10}


def _url(sim: SimulatorProcess, deployment: str = "chat-deployment", query: str = "") -> str:
    url = f"{sim.base_url}/azuresim/openai/deployments/{deployment}/chat/completions"
    return url + (f"?{query}" if query else f"?api-version={VERSION}")


def test_a_deployment_url_with_the_api_key_header_answers(sim: SimulatorProcess) -> None:
    response = httpx2.post(_url(sim), json=BODY, headers={"api-key": KEY})
    assert response.status_code == 200
    data = response.json()
    assert data["model"] == "gpt-4o-mini-2024-07-18"  # the deployment's model
    assert data["usage"]["completion_tokens"] == 10
    assert data["prompt_filter_results"][0]["prompt_index"] == 0
    assert data["choices"][0]["content_filter_results"]["hate"] == {
        "filtered": False,
        "severity": "safe",
    }
    assert response.headers["apim-request-id"] == response.headers["x-sim-request-id"]


@pytest.mark.parametrize("headers", [{}, {"authorization": f"Bearer {KEY}"}, {"api-key": "wrong"}])
def test_only_the_api_key_header_authenticates(sim: SimulatorProcess, headers: dict) -> None:
    response = httpx2.post(_url(sim), json=BODY, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "401"
    assert "Access denied" in response.json()["error"]["message"]


def test_the_api_version_is_required_and_checked(sim: SimulatorProcess) -> None:
    # Azure answers a missing api-version with 404 "Resource not found", as if the URL
    # did not exist (MicrosoftDocs/azure-docs#114602), before it looks at the key.
    for headers in ({"api-key": KEY}, {}):
        missing = httpx2.post(_url(sim, query="x=1"), json=BODY, headers=headers)
        assert missing.status_code == 404
        assert missing.json() == {"error": {"code": "404", "message": "Resource not found"}}
    malformed = httpx2.post(
        _url(sim, query="api-version=latest"), json=BODY, headers={"api-key": KEY}
    )
    assert malformed.status_code == 400
    assert malformed.json() == {
        "error": {"code": "BadRequest", "message": "API version not supported"}
    }
    preview = httpx2.post(
        _url(sim, query="api-version=2025-04-01-preview"), json=BODY, headers={"api-key": KEY}
    )
    assert preview.status_code == 200


def test_unknown_deployments_and_openai_paths_are_not_found(sim: SimulatorProcess) -> None:
    unknown = httpx2.post(_url(sim, "no-such-deployment"), json=BODY, headers={"api-key": KEY})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "DeploymentNotFound"
    openai_path = httpx2.post(
        f"{sim.base_url}/azuresim/v1/chat/completions?api-version={VERSION}",
        json={**BODY, "model": "chat-deployment"},
        headers={"api-key": KEY},
    )
    assert openai_path.status_code == 404


def test_the_stream_opens_with_prompt_filter_results(sim: SimulatorProcess) -> None:
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    with httpx2.stream("POST", _url(sim), json=body, headers={"api-key": KEY}) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    first, role, *rest = events
    assert first["choices"] == []
    assert first["id"] == ""
    filters = first["prompt_filter_results"][0]["content_filter_results"]
    assert set(filters) >= {"hate", "self_harm", "sexual", "violence"}
    assert role["choices"][0]["delta"]["role"] == "assistant"
    tokens = [e for e in rest if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(tokens) == 10
    for event in tokens:
        assert event["choices"][0]["content_filter_results"]["violence"]["filtered"] is False
        assert event["model"] == "gpt-4o-mini-2024-07-18"
    assert rest[-1]["choices"] == []
    assert rest[-1]["usage"]["completion_tokens"] == 10


def test_a_reasoning_deployment_refuses_max_tokens(sim: SimulatorProcess) -> None:
    response = httpx2.post(_url(sim, "reasoning-deployment"), json=BODY, headers={"api-key": KEY})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_parameter"
    body = {"messages": BODY["messages"], "max_completion_tokens": 200}
    ok = httpx2.post(_url(sim, "reasoning-deployment"), json=body, headers={"api-key": KEY})
    assert ok.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 30


def test_the_azure_openai_client_streams(sim: SimulatorProcess) -> None:
    client = openai.AzureOpenAI(
        azure_endpoint=f"{sim.base_url}/azuresim",
        api_key=KEY,
        api_version=VERSION,
        max_retries=0,
    )
    text, usage = [], None
    for chunk in client.chat.completions.create(
        model="chat-deployment",
        messages=BODY["messages"],  # type: ignore[arg-type]
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    ):
        usage = chunk.usage or usage
        text.extend(c.delta.content or "" for c in chunk.choices if c.delta)
    assert "ANSWER: 16" in "".join(text)
    assert usage is not None
    assert usage.completion_tokens == 20
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=BODY["messages"])  # type: ignore[arg-type]
