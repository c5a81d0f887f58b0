"""Request body encodings as each provider takes them."""

from __future__ import annotations

import gzip
import json

import httpx2
import msgpack

from simulator.testing import SimulatorProcess
from tests.sim_fixtures import ANTHROPIC_KEY, OPENAI_KEY

OPENAI_BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _packed(body: dict) -> bytes:
    return gzip.compress(msgpack.packb(body))


MSGPACK_GZIP = {"content-type": "application/vnd.msgpack", "content-encoding": "gzip"}


def test_a_provider_that_takes_msgpack_reads_it(sim: SimulatorProcess) -> None:
    response = httpx2.post(
        f"{sim.base_url}/fastchip/v1/chat/completions",
        content=_packed({**OPENAI_BODY, "model": "fast-small"}),
        headers={"authorization": f"Bearer {OPENAI_KEY}", **MSGPACK_GZIP},
    )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 3


def test_openai_style_providers_parse_msgpack_as_json_and_refuse_it(
    sim: SimulatorProcess,
) -> None:
    url = f"{sim.base_url}/jsononly/v1/chat/completions"
    auth = {"authorization": "Bearer sk-test-jsononly-0123456789"}
    for headers in (MSGPACK_GZIP, {"content-type": "application/vnd.msgpack"}):
        body = _packed(OPENAI_BODY) if "content-encoding" in headers else msgpack.packb(OPENAI_BODY)
        response = httpx2.post(url, content=body, headers={**auth, **headers})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("We could not parse the JSON body of your request.")
    # gzip-compressed JSON is fine.
    gzipped = httpx2.post(
        url,
        content=gzip.compress(json.dumps(OPENAI_BODY).encode()),
        headers={**auth, "content-type": "application/json", "content-encoding": "gzip"},
    )
    assert gzipped.status_code == 200


def test_anthropic_style_providers_refuse_msgpack_in_their_shape(sim: SimulatorProcess) -> None:
    body = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    url = f"{sim.base_url}/hugeclaude/v1/messages"
    auth = {"x-api-key": "sk-test-hugeclaude-0123456789", "anthropic-version": "2023-06-01"}
    response = httpx2.post(url, content=_packed(body), headers={**auth, **MSGPACK_GZIP})
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith("The request body is not valid JSON")
    gzipped = httpx2.post(
        url,
        content=gzip.compress(json.dumps(body).encode()),
        headers={**auth, "content-encoding": "gzip"},
    )
    assert gzipped.status_code == 200


def test_bad_msgpack_is_a_400_where_msgpack_is_taken(sim: SimulatorProcess) -> None:
    response = httpx2.post(
        f"{sim.base_url}/claudish/v1/messages",
        content=b"\xc1\xc1\xc1",
        headers={
            "x-api-key": ANTHROPIC_KEY,
            "anthropic-version": "2023-06-01",
            "content-type": "application/vnd.msgpack",
        },
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
