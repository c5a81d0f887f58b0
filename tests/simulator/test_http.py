"""HTTP versions and connection reuse."""

from __future__ import annotations

import asyncio
import gzip

import anthropic
import httpx2
import msgpack
import openai

from simulator.testing import SimulatorProcess
from tests.sim_fixtures import ANTHROPIC_KEY, OPENAI_KEY


def test_h2c_with_prior_knowledge_and_http11_on_the_same_port(sim: SimulatorProcess) -> None:
    url = f"{sim.base_url}/fastchip/v1/models"
    headers = {"authorization": f"Bearer {OPENAI_KEY}"}
    with httpx2.Client(http1=False, http2=True) as client:
        response = client.get(url, headers=headers)
        assert response.http_version == "HTTP/2"
        assert [m["id"] for m in response.json()["data"]] == [
            "fast-small",
            "mid-think",
            "slow-large",
        ]
    assert httpx2.get(url, headers=headers).http_version == "HTTP/1.1"


def test_alpn_offers_http2_only_when_asked(
    tls_sim: SimulatorProcess, http1_only_sim: SimulatorProcess
) -> None:
    headers = {"authorization": f"Bearer {OPENAI_KEY}"}
    with httpx2.Client(http2=True, verify=http1_only_sim.ssl_context()) as client:
        response = client.get(f"{http1_only_sim.base_url}/fastchip/v1/models", headers=headers)
        assert response.http_version == "HTTP/1.1"
    with httpx2.Client(http2=True, verify=tls_sim.ssl_context()) as client:
        response = client.get(f"{tls_sim.base_url}/fastchip/v1/models", headers=headers)
        assert response.http_version == "HTTP/2"


def test_the_sdks_stream_over_http2_with_many_streams_on_one_connection(
    tls_sim: SimulatorProcess,
) -> None:
    async def scenario() -> tuple[list[str], list[int], list[str]]:
        # The SDKs are built on httpx2 (httpx's successor package), not httpx.
        http = httpx2.AsyncClient(http2=True, verify=tls_sim.ssl_context())
        oa = openai.AsyncOpenAI(
            base_url=f"{tls_sim.base_url}/fastchip/v1", api_key=OPENAI_KEY, http_client=http
        )
        an = anthropic.AsyncAnthropic(
            base_url=f"{tls_sim.base_url}/claudish", api_key=ANTHROPIC_KEY, http_client=http
        )

        async def one_openai(i: int) -> tuple[str, str]:
            response = await oa.chat.completions.with_raw_response.create(
                model="fast-small",
                messages=[{"role": "user", "content": f"What is {i} * 3?"}],
                stream=True,
                stream_options={"include_usage": True},
                max_tokens=30,
            )
            usage = 0
            async for chunk in response.parse():
                if chunk.usage:
                    usage = chunk.usage.completion_tokens
            assert usage == 30
            return response.http_response.http_version, response.headers["x-sim-request-id"]

        async def one_anthropic() -> int:
            async with an.messages.stream(
                model="claudish-think", max_tokens=30, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                message = await stream.get_final_message()
            return message.usage.output_tokens

        results = await asyncio.gather(*(one_openai(i) for i in range(20)))
        tokens = await asyncio.gather(*(one_anthropic() for _ in range(5)))
        await http.aclose()
        return [v for v, _ in results], tokens, [r for _, r in results]

    versions, tokens, ids = asyncio.run(scenario())
    assert set(versions) == {"HTTP/2"}
    assert tokens == [30] * 5  # no thinking unless asked for: 30 answer tokens
    truth = httpx2.get(f"{tls_sim.base_url}/_sim/requests/{ids[0]}", verify=tls_sim.ssl_context())
    assert truth.json()["http_version"] == "2"


def test_keep_alive_serves_many_requests_on_one_connection(sim: SimulatorProcess) -> None:
    with httpx2.Client() as client:
        ports = set()
        for _ in range(5):
            response = client.post(
                f"{sim.base_url}/fastchip/v1/chat/completions",
                json={
                    "model": "fast-small",
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 3,
                    "stream": True,
                },
                headers={"authorization": f"Bearer {OPENAI_KEY}"},
                extensions={"trace": lambda name, info: ports.add(name)},
            )
            assert response.text.endswith("data: [DONE]\n\n")
    assert sum(name == "connection.connect_tcp.complete" for name in ports) <= 1


def test_anthropic_accepts_msgpack_gzip_and_json_counts_match(sim: SimulatorProcess) -> None:
    payload = {
        "model": "claudish-mid",
        "max_tokens": 7,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is 9 * 9?"}]}],
    }
    url = f"{sim.base_url}/claudish/v1/messages"
    as_json = httpx2.post(
        url, json=payload, headers={"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}
    ).json()
    as_msgpack = httpx2.post(
        url,
        content=gzip.compress(msgpack.packb(payload)),
        headers={
            "x-api-key": ANTHROPIC_KEY,
            "anthropic-version": "2023-06-01",
            "content-type": "application/vnd.msgpack",
            "content-encoding": "gzip",
        },
    ).json()
    assert as_json["usage"] == as_msgpack["usage"]
    assert as_json["usage"]["output_tokens"] == 7
    assert as_json["stop_reason"] == "max_tokens"
    bad = httpx2.post(
        url,
        content=b"\x00not gzip",
        headers={
            "x-api-key": ANTHROPIC_KEY,
            "anthropic-version": "2023-06-01",
            "content-encoding": "gzip",
        },
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["type"] == "invalid_request_error"
