"""Independent servers for the interop tests (see servers.py), started on first use and
stopped when the last test of tests/interop/ is done (package scope: no idle gateway left
running beside the timing tests that come after).

A server that cannot be installed or started skips its tests, with the reason; under RW_CI=1
it fails them instead (CI must have every server).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme

from tests.interop.servers import Server, Unavailable, clean_env, free_port, venv_bin

# What the servers are told to answer: the tests check the engine's text and token counts
# against it.
ANSWER = (
    "Latency is the delay between a request and its answer. "
    "Lower latency makes applications feel faster."
)
SHORT_ANSWER = "Latency is the delay before an answer."  # mockllm streams one character per event
LONG_ANSWER = " ".join(f"word{i}" for i in range(40))  # ~2.3 s at mockllm's 10 ms per character
# stubllm's streaming pace, the ground truth for inter-token gaps and the wait before the first
STUB_CHUNK_DELAY_MS = 20
STUB_FIRST_TOKEN_DELAY_MS = 400
LITELLM_KEY = "sk-interop-master-0123456789"


def need(make: Callable[[], Server | Path]) -> Server | Path:
    try:
        return make()
    except Unavailable as exc:
        if os.environ.get("RW_CI"):
            pytest.fail(f"interop server unavailable in CI (CI must install it): {exc}")
        pytest.skip(f"interop server unavailable: {exc}")


def _bin(name: str) -> Path:
    result = need(lambda: venv_bin(name))
    assert isinstance(result, Path)
    return result


def _start(server: Server, timeout_s: float = 60.0) -> Server:
    result = need(lambda: server.start(timeout_s))
    assert isinstance(result, Server)
    return result


@pytest.fixture(scope="package")
def interop_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("interop")


@pytest.fixture(scope="package")
def mocks_bin() -> Path:
    return _bin("mocks")


@pytest.fixture(scope="package")
def litellm_bin() -> Path:
    return _bin("litellm")


# mockllm: its CLI (`mockllm start`) always runs uvicorn with --reload (the flag defaults to on
# and cannot be turned off), so the app is served by uvicorn directly, as the CLI would.
def mockllm_server(
    bin_dir: Path, workdir: Path, answer: str, name: str = "mockllm", port: int | None = None
) -> Server:
    responses = workdir / f"{name}.yml"
    # mockllm streams `defaults.unknown_response` whatever the prompt (its streaming path looks
    # the answer up as if it were a prompt), so the answer goes there.
    responses.write_text(
        json.dumps(
            {
                "responses": {},
                "defaults": {"unknown_response": answer},
                "settings": {"lag_enabled": True, "lag_factor": 10},
            }
        )
    )
    port = port or free_port()
    return Server(
        name=name,
        argv=[
            str(bin_dir / "python"),
            "-m",
            "uvicorn",
            "mockllm.server:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
        ],
        port=port,
        log=workdir / f"{name}.log",
        env=clean_env(MOCKLLM_RESPONSES_FILE=str(responses)),
        ready_path="/models",
    )


@pytest.fixture(scope="package")
def mockllm(mocks_bin: Path, interop_dir: Path) -> Iterator[Server]:
    server = _start(mockllm_server(mocks_bin, interop_dir, SHORT_ANSWER))
    yield server
    server.stop()


@pytest.fixture(scope="package")
def slow_mockllm(mocks_bin: Path, interop_dir: Path) -> Iterator[Server]:
    """A mockllm streaming LONG_ANSWER, for tests that freeze it (and let it go again)."""
    server = _start(mockllm_server(mocks_bin, interop_dir, LONG_ANSWER, name="slow"))
    yield server
    server.stop()


@pytest.fixture
def doomed_mockllm(mocks_bin: Path, tmp_path: Path) -> Iterator[Server]:
    """A mockllm of its own, streaming LONG_ANSWER slowly, for a test to stop or kill."""
    server = _start(mockllm_server(mocks_bin, tmp_path, LONG_ANSWER, name="doomed"))
    yield server
    server.stop()


FAKELLM_CONFIG = f"""\
version: 1
defaults:
  fallback: deterministic_echo
rules:
  - name: answer
    when:
      messages_contain: "latency"
    respond:
      content: "{ANSWER}"
"""


@dataclass
class Certs:
    ca: str
    cert: str
    key: str


@pytest.fixture(scope="package")
def certs(interop_dir: Path) -> Certs:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    paths = Certs(*(str(interop_dir / n) for n in ("ca.pem", "cert.pem", "key.pem")))
    ca.cert_pem.write_to_path(paths.ca)
    leaf.cert_chain_pems[0].write_to_path(paths.cert)
    leaf.private_key_pem.write_to_path(paths.key)
    return paths


@pytest.fixture(scope="package")
def fakellm_config(interop_dir: Path) -> Path:
    path = interop_dir / "fakellm.yaml"
    path.write_text(FAKELLM_CONFIG)
    return path


@pytest.fixture(scope="package")
def fakellm(mocks_bin: Path, interop_dir: Path, fakellm_config: Path) -> Iterator[Server]:
    """fakellm as its CLI serves it: uvicorn, HTTP/1.1 only, cleartext."""
    port = free_port()
    server = _start(
        Server(
            name="fakellm",
            argv=[
                str(mocks_bin / "fakellm"),
                "serve",
                "--config",
                str(fakellm_config),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            port=port,
            log=interop_dir / "fakellm.log",
            ready_path="/_fakellm/stats",
        )
    )
    yield server
    server.stop()


@dataclass
class HypercornFakellm:
    server: Server
    tls_origin: str  # HTTP/2 by ALPN (and HTTP/1.1)
    h2c_origin: str  # cleartext: HTTP/1.1, and HTTP/2 with prior knowledge


@pytest.fixture(scope="package")
def fakellm_hypercorn(
    mocks_bin: Path, interop_dir: Path, fakellm_config: Path, certs: Certs
) -> Iterator[HypercornFakellm]:
    """fakellm's app served by hypercorn (an h2 server): HTTP/2 over TLS and cleartext."""
    plain, tls = free_port(), free_port()
    server = _start(
        Server(
            name="fakellm-hypercorn",
            argv=[
                str(mocks_bin / "hypercorn"),
                "fakellm.server:app",
                "--bind",
                f"127.0.0.1:{tls}",
                "--insecure-bind",
                f"127.0.0.1:{plain}",
                "--certfile",
                certs.cert,
                "--keyfile",
                certs.key,
            ],
            port=plain,
            log=interop_dir / "fakellm-hypercorn.log",
            env=clean_env(FAKELLM_CONFIG=str(fakellm_config)),
            ready_path="/_fakellm/stats",
        )
    )
    yield HypercornFakellm(server, f"https://127.0.0.1:{tls}", f"http://127.0.0.1:{plain}")
    server.stop()


@pytest.fixture(scope="package")
def fakellm_uvicorn_tls(
    mocks_bin: Path, interop_dir: Path, fakellm_config: Path, certs: Certs
) -> Iterator[Server]:
    """fakellm's app on uvicorn over TLS: no HTTP/2 (its ALPN offers none)."""
    port = free_port()
    server = _start(
        Server(
            name="fakellm-uvicorn-tls",
            argv=[
                str(mocks_bin / "python"),
                "-m",
                "uvicorn",
                "fakellm.server:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-access-log",
                "--ssl-certfile",
                certs.cert,
                "--ssl-keyfile",
                certs.key,
            ],
            port=port,
            log=interop_dir / "fakellm-uvicorn-tls.log",
            env=clean_env(FAKELLM_CONFIG=str(fakellm_config)),
            ready_path="/_fakellm/stats",
            scheme="https",
            ca=certs.ca,
        )
    )
    yield server
    server.stop()


STUBLLM_FIXTURES = {
    "fixtures": [
        {
            "name": "answer",
            "match": {"messages": [{"role": "user", "content": "latency"}]},
            "response": {
                "content": ANSWER,
                "stream_chunk_delay_ms": STUB_CHUNK_DELAY_MS,
                "usage": {"prompt_tokens": 7, "completion_tokens": 19, "total_tokens": 26},
            },
        },
        {
            "name": "slow-start",
            "match": {"messages": [{"role": "user", "content": "slow start"}]},
            "response": {
                "content": ANSWER,
                "latency_ms": STUB_FIRST_TOKEN_DELAY_MS,
                "stream_chunk_delay_ms": 5,
            },
        },
        {
            "name": "never-starts",
            "match": {"messages": [{"role": "user", "content": "never starts"}]},
            "response": {"content": ANSWER, "latency_ms": 60_000},
        },
        {
            "name": "rate-limited",
            "match": {"messages": [{"role": "user", "content": "rate limit me"}]},
            "response": {"http_status": 429, "error_message": "Rate limit reached (stub)"},
        },
        {
            "name": "server-error",
            "match": {"messages": [{"role": "user", "content": "fail please"}]},
            "response": {"http_status": 500, "error_message": "The server had an error (stub)"},
        },
        {
            "name": "bad-openai-key",
            "match": {"headers": {"authorization": "Bearer sk-wrong-key"}},
            "response": {"http_status": 401, "error_message": "Incorrect API key provided"},
        },
        {
            "name": "bad-anthropic-key",
            "match": {"headers": {"x-api-key": "sk-wrong-key"}},
            "response": {"http_status": 401, "error_message": "invalid x-api-key"},
        },
    ]
}


@pytest.fixture(scope="package")
def stubllm(mocks_bin: Path, interop_dir: Path) -> Iterator[Server]:
    fixtures = interop_dir / "stubllm.json"
    fixtures.write_text(json.dumps(STUBLLM_FIXTURES))
    port = free_port()
    server = _start(
        Server(
            name="stubllm",
            argv=[
                str(mocks_bin / "stubllm"),
                "serve",
                "--fixture-file",
                str(fixtures),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            port=port,
            log=interop_dir / "stubllm.log",
            ready_path="/health",
        )
    )
    yield server
    server.stop()


@dataclass
class LiteLLM:
    server: Server
    dying_upstream_port: int  # "up-dying" routes here: a test starts (and kills) a server on it


@pytest.fixture(scope="package")
def litellm(litellm_bin: Path, interop_dir: Path, fakellm: Server) -> Iterator[LiteLLM]:
    """The LiteLLM proxy: mock models (mock_response) and models routed to fakellm upstream."""
    dying = free_port()
    upstream = fakellm.origin
    models = [
        ("gpt-4o-mock", {"model": "openai/gpt-4o", "mock_response": ANSWER}),
        ("claude-mock", {"model": "anthropic/claude-3-5-haiku-20241022", "mock_response": ANSWER}),
        ("up-openai", {"model": "openai/gpt-4o-mini", "api_base": upstream + "/v1"}),
        ("up-claude", {"model": "anthropic/claude-3-5-haiku-20241022", "api_base": upstream}),
        ("up-dying", {"model": "openai/gpt-4o-mini", "api_base": f"http://127.0.0.1:{dying}/v1"}),
    ]
    config = {
        "model_list": [
            {"model_name": name, "litellm_params": {"api_key": "sk-upstream-unused", **params}}
            for name, params in models
        ],
        "general_settings": {"master_key": LITELLM_KEY},
        "litellm_settings": {"telemetry": False, "num_retries": 0},
        "router_settings": {"num_retries": 0},
    }
    path = interop_dir / "litellm.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    server = _start(
        Server(
            name="litellm",
            argv=[
                str(litellm_bin / "litellm"),
                "--config",
                str(path),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--telemetry",
                "False",
            ],
            port=port,
            log=interop_dir / "litellm.log",
            # The model price map ships in the package; without this LiteLLM fetches it online.
            env=clean_env(LITELLM_LOCAL_MODEL_COST_MAP="True"),
            ready_path="/health/liveliness",
        ),
        timeout_s=120.0,
    )
    yield LiteLLM(server, dying)
    server.stop()


# llmock paces its streams by one pause between chunks (the ground truth for inter-token gaps).
LLMOCK_CHUNK_DELAY_MS = 20


@pytest.fixture(scope="package")
def llmock_bin() -> Path:
    return _bin("llmock")


@pytest.fixture(scope="package")
def llmock(llmock_bin: Path, interop_dir: Path) -> Iterator[Server]:
    """llmock as its CLI serves it (uvicorn), answering with scripted replies (its admin API,
    /_llmock/scenario) or, unscripted, with an echo of the prompt."""
    port = free_port()
    server = _start(
        Server(
            name="llmock",
            argv=[
                str(llmock_bin / "llmock"),
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--response-style",
                "echo",
                "--tool-mode",
                "off",
                "--stream-chunk-delay-ms",
                str(LLMOCK_CHUNK_DELAY_MS),
            ],
            port=port,
            log=interop_dir / "llmock.log",
            ready_path="/health",
        )
    )
    yield server
    server.stop()
