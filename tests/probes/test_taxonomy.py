"""One failure taxonomy: every failure gets the kind that says what happened, and failures
that are ours (config, engine) are never blamed on the provider."""

from __future__ import annotations

import ast
import inspect
import logging
import socket
from pathlib import Path

import pytest

import probes.errors
from probes import ProbeSpec
from probes.errors import Blame, Kind, ProbeError
from probes.formats import WIRE_FORMATS, OpenAIChat
from probes.model import ERROR_KINDS
from probes.sse import Event
from simulator.testing import SimulatorProcess
from tests.probes.loopback import LoopbackServer, Reply, sse
from tests.probes.real_apis import (
    MAX_TOKENS_REFUSED,
    SSE_HEADERS,
    TEMPERATURE_REFUSED,
    openai_error,
)
from tests.probes.support import run
from tests.sim_fixtures import OPENAI_KEY

PROBES = Path(probes.errors.__file__).resolve().parent
GOOD_STREAM = sse(
    {"choices": [{"index": 0, "delta": {"content": " hello"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
)


def _spec(url: str, **kw: object) -> ProbeSpec:
    return ProbeSpec(
        base_url=url + "/v1",
        format="openai",
        model="m",
        api_key="sk-test-loopback-0123456789",
        cold=True,
        max_tokens=20,
        first_token_timeout_s=5,
        total_timeout_s=5,
        **kw,  # type: ignore[arg-type]
    )


def _serving(reply: Reply) -> LoopbackServer:
    return LoopbackServer(lambda request: reply)


def test_every_kind_has_a_meaning_and_a_blame_and_ours_never_count() -> None:
    for kind in Kind:
        assert kind.meaning.endswith("."), kind
        assert len(kind.meaning) > 20, kind
        assert isinstance(kind.blame, Blame)
    ours = {k for k in Kind if not k.counts_against_provider}
    assert ours == {Kind.CONFIG, Kind.ENGINE, Kind.MISSED, Kind.BLOCKED_URL}
    assert Kind.HTTP_5XX.counts_against_provider
    assert Kind.CONNECT.counts_against_provider  # the route is down from that region


def test_error_kinds_are_the_stored_strings_of_today_plus_config_and_engine() -> None:
    assert isinstance(ERROR_KINDS, tuple)
    assert all(type(k) is str for k in ERROR_KINDS)
    today = [
        "dns",
        "connect",
        "tls",
        "timeout_headers",
        "timeout_first_token",
        "timeout_total",
        "http_4xx",
        "http_429",
        "http_5xx",
        "stream_error",
        "malformed_stream",
        "too_large",
        "truncated",
        "blocked_url",
    ]
    assert list(ERROR_KINDS) == [*today, "config", "engine"]
    assert "missed" not in ERROR_KINDS  # the monitor's, never the engine's
    assert Kind("missed").blame is Blame.MONITOR


def test_every_exception_in_the_tree_carries_its_kind_and_is_drawn() -> None:
    drawing = probes.errors.__doc__ or ""
    classes = [
        c
        for _, c in inspect.getmembers(probes.errors, inspect.isclass)
        if issubclass(c, ProbeError)
    ]
    assert len(classes) >= 15
    for cls in classes:
        assert isinstance(cls.kind, Kind)
        assert cls.__name__ in drawing, cls
    for name in ("LineTooLong", "GraderError", "TokenizerError", "BlockedAddress"):
        assert name in drawing


def test_no_kind_is_written_as_a_bare_string_in_the_engine() -> None:
    kinds = {k.value for k in Kind}
    offenders = []
    for path in PROBES.glob("*.py"):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in kinds:
                offenders.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert offenders == []


@pytest.mark.parametrize(
    ("content_type", "body", "said"),
    [
        (
            "text/html; charset=utf-8",
            b"<!DOCTYPE html>\n<html><head><title>Sign in to Guest Wi-Fi</title></head>"
            b"<body>key sk-live-portal0123456789</body></html>",
            "text/html",
        ),
        ("application/json", b'{"id": "chatcmpl-1", "choices": [{"message": {}}]}', "json"),
        # Labelled as an event stream, but a gateway's error page all the same.
        ("text/event-stream", b"<html><body>502 Bad Gateway</body></html>\n", "event-stream"),
    ],
)
def test_a_200_that_is_not_an_event_stream_is_malformed_and_says_what_came(
    content_type: str, body: bytes, said: str
) -> None:
    with _serving(Reply(200, [("content-type", content_type)], [(0.0, body)])) as server:
        result = run(_spec(server.url))
    assert result.error_kind == Kind.MALFORMED_STREAM, result.error_detail
    assert "not an event stream" in result.error_detail
    assert said in result.error_detail
    assert body[:12].decode() in result.error_detail  # an excerpt of what it was
    assert "portal0123456789" not in result.error_detail  # redacted


def test_an_unlabelled_event_stream_is_still_measured() -> None:
    with _serving(Reply(200, [], [(0.0, b"".join(GOOD_STREAM))])) as server:
        result = run(_spec(server.url))
    assert result.ok, result.error_detail
    assert result.text == " hello"


def test_a_server_that_closes_before_answering_is_truncated_not_connect() -> None:
    with _serving(Reply(close_before_headers=True)) as server:
        result = run(_spec(server.url))
    assert result.error_kind == Kind.TRUNCATED, result.error_detail
    assert "before the response headers" in result.error_detail
    assert result.connection_reused is False  # it did open a connection


def test_bytes_that_are_not_http_are_malformed() -> None:
    with _serving(Reply(raw=b"SSH-2.0-OpenSSH_9.6\r\n\r\n")) as server:
        result = run(_spec(server.url))
    assert result.error_kind == Kind.MALFORMED_STREAM, result.error_detail


def test_a_refused_connection_is_connect() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    result = run(_spec(f"http://127.0.0.1:{closed_port}"))
    assert result.error_kind == Kind.CONNECT


def test_a_redirect_is_our_configuration() -> None:
    reply = Reply(301, [("location", "https://api.example.com/v1/chat/completions")])
    with _serving(reply) as server:
        result = run(_spec(server.url))
    assert result.error_kind == Kind.CONFIG
    assert "api.example.com" in result.error_detail


@pytest.mark.parametrize(
    ("reply", "param", "hint"),
    [
        (
            openai_error(400, MAX_TOKENS_REFUSED, "max_tokens", "unsupported_parameter"),
            "max_tokens",
            "use 'max_completion_tokens'",
        ),
        (
            openai_error(400, TEMPERATURE_REFUSED, "temperature", "unsupported_value"),
            "temperature",
            "does not accept the value sent",
        ),
        # Azure, in the same words but no param field.
        (openai_error(400, MAX_TOKENS_REFUSED, None, None), "max_tokens", "max_completion_tokens"),
        # Strict OpenAI-compatible servers.
        (
            openai_error(
                400, "Unrecognized request argument supplied: reasoning_effort", None, None
            ),
            "reasoning_effort",
            "is not supported",
        ),
        # Anthropic: "field: message".
        (
            Reply(
                400,
                [("content-type", "application/json")],
                [
                    (
                        0.0,
                        b'{"type":"error","error":{"type":"invalid_request_error","message":'
                        b'"`temperature` may only be set to 1 when thinking is enabled."}}',
                    )
                ],
            ),
            "temperature",
            "thinking",
        ),
    ],
)
def test_a_refused_parameter_is_config_naming_it(reply: Reply, param: str, hint: str) -> None:
    with _serving(reply) as server:
        result = run(
            _spec(server.url, temperature=0.2, reasoning_effort="low", stream_options=False)
        )
    assert result.error_kind == Kind.CONFIG, result.error_detail
    assert result.error_detail.startswith(
        f"the route's request settings are wrong for this model: {param!r}"
    )
    assert hint in result.error_detail
    assert not Kind(result.error_kind).counts_against_provider


@pytest.mark.parametrize(
    "reply",
    [
        openai_error(
            400,
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130000 tokens.",
            "messages",
            "context_length_exceeded",
        ),
        # Names a parameter we did not send: not our settings.
        openai_error(400, "Unsupported parameter: 'logprobs' is not supported.", None, None),
        openai_error(401, "Incorrect API key provided.", None, "invalid_api_key"),
    ],
)
def test_other_4xx_stay_http_4xx(reply: Reply) -> None:
    with _serving(reply) as server:
        result = run(_spec(server.url, stream_options=False))
    assert result.error_kind == Kind.HTTP_4XX, result.error_detail


def test_an_unknown_wire_format_is_config() -> None:
    result = run(ProbeSpec(base_url="http://127.0.0.1:9/v1", format="grpc", model="m"))
    assert result.error_kind == Kind.CONFIG
    assert "'grpc'" in result.error_detail
    assert "openai" in result.error_detail


@pytest.mark.parametrize(
    ("fmt", "settings", "said"),
    [
        ("openai", {"token_limit_param": "max_output_tokens"}, "token-limit"),
        ("openai", {"extra_body": {"model": "other", "top_p": 1}}, "extra_body may not set model"),
        ("openai", {"thinking_budget_tokens": 2048}, "Anthropic setting"),
        ("anthropic", {"reasoning_effort": "low"}, "OpenAI setting"),
        ("anthropic", {"thinking_budget_tokens": 2048, "max_tokens": 1024}, "must exceed"),
        ("anthropic", {"token_limit_param": "max_completion_tokens"}, "max_tokens only"),
        ("openai", {"body_encoding": "protobuf"}, "body encoding"),
        ("openai", {"connect_to": "nowhere"}, "host:port"),
    ],
)
def test_settings_a_format_cannot_send_are_config_before_any_request(
    fmt: str, settings: dict[str, object], said: str
) -> None:
    with _serving(Reply(200, SSE_HEADERS, [(0.0, b"".join(GOOD_STREAM))])) as server:
        result = run(ProbeSpec(**{"base_url": server.url, "format": fmt, "model": "m", **settings}))  # type: ignore[arg-type]
        assert server.received == []
    assert result.error_kind == Kind.CONFIG, result.error_detail
    assert said in result.error_detail


class _BuggyFormat(OpenAIChat):
    """An engine bug, planted in a real format: it fails on the first content event."""

    name = "buggy"
    secret = ""

    def parse(self, event: Event) -> list:  # type: ignore[type-arg]
        pieces = super().parse(event)
        if any(p.kind == "answer" for p in pieces):
            raise KeyError(f"planted bug holding {self.secret}")
        return pieces


def test_an_engine_bug_is_engine_keeps_the_timings_and_logs_a_redacted_traceback(
    sim: SimulatorProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    buggy = _BuggyFormat()
    buggy.secret = OPENAI_KEY
    monkeypatch.setitem(WIRE_FORMATS, "buggy", buggy)
    caplog.set_level(logging.ERROR, logger="probes")
    result = run(
        ProbeSpec(
            base_url=sim.base_url + "/fastchip/v1",
            format="buggy",
            model="fast-small",
            api_key=OPENAI_KEY,
            max_tokens=10,
        )
    )
    assert result.error_kind == Kind.ENGINE
    assert not Kind(result.error_kind).counts_against_provider
    assert "KeyError" in result.error_detail
    assert OPENAI_KEY not in result.error_detail
    assert result.ttfb_ms is not None  # what was measured before the bug is kept
    assert "Traceback" in caplog.text
    assert "_BuggyFormat" in caplog.text or "parse" in caplog.text
    assert OPENAI_KEY not in caplog.text


def test_an_engine_bug_after_the_stream_is_engine_too(
    sim: SimulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    class BadUsage(OpenAIChat):
        name = "bad-usage"

        def usage(self, raw: dict) -> object:  # type: ignore[override, type-arg]
            raise ZeroDivisionError("planted")

    monkeypatch.setitem(WIRE_FORMATS, "bad-usage", BadUsage())
    result = run(
        ProbeSpec(
            base_url=sim.base_url + "/fastchip/v1",
            format="bad-usage",
            model="fast-small",
            api_key=OPENAI_KEY,
            max_tokens=10,
        )
    )
    assert result.error_kind == Kind.ENGINE
    assert result.ttft_ms is not None


def test_a_body_encoding_the_provider_refuses_is_config() -> None:
    reply = Reply(415, [("content-type", "text/plain")], [(0.0, b"Unsupported Media Type")])
    with _serving(reply) as server:
        result = run(_spec(server.url, body_encoding="msgpack-gzip"))
    assert result.error_kind == Kind.CONFIG
    assert "application/vnd.msgpack" in result.error_detail
