"""`python -m probes` (a fresh process each time) against independent servers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.interop.conftest import ANSWER, LITELLM_KEY, LiteLLM
from tests.interop.probing import cli, overhead_ms
from tests.interop.servers import Server
from tests.support import ROOT

# The first use installs the servers (LiteLLM: minutes); pytest-timeout counts fixture setup.
pytestmark = [pytest.mark.interop, pytest.mark.timeout(1800)]
KEY_ENV = {"RW_INTEROP_KEY": LITELLM_KEY}


def test_cli_json_against_the_gateway_with_the_key_from_the_environment(litellm: LiteLLM) -> None:
    code, rows, stderr = cli(
        "--url",
        litellm.server.origin + "/v1",
        "--format",
        "openai",
        "--model",
        "gpt-4o-mock",
        "--api-key-env",
        "RW_INTEROP_KEY",
        "-n",
        "2",
        env=KEY_ENV,
    )
    assert code == 0, stderr
    assert len(rows) == 2
    for row in rows:
        assert row["outcome"] == "ok"
        assert row["text"] == ANSWER
        assert row["token_source"] == "usage"
        assert row["http_version"] == "HTTP/1.1"
        assert 0 < row["ttfb_ms"] <= row["ttft_ms"] <= row["e2e_ms"]
    assert rows[1]["connect_ms"] is None  # the second probe reused the connection


def test_cli_anthropic_format(fakellm: Server) -> None:
    code, rows, stderr = cli(
        "--url", fakellm.origin, "--format", "anthropic", "--model", "claude-x"
    )
    assert code == 0, stderr
    (row,) = rows
    assert row["outcome"] == "ok"
    assert row["text"] == ANSWER
    assert row["output_tokens"] == len(ANSWER) // 4  # fakellm's usage


def test_cli_failure_exits_1_and_never_prints_the_key(litellm: LiteLLM) -> None:
    wrong = "sk-not-the-key-0123456789"
    code, rows, stderr = cli(
        "--url",
        litellm.server.origin + "/v1",
        "--format",
        "openai",
        "--model",
        "gpt-4o-mock",
        "--api-key-env",
        "RW_INTEROP_KEY",
        env={"RW_INTEROP_KEY": wrong},
    )
    assert code == 1
    (row,) = rows
    assert (row["outcome"], row["error_kind"]) == ("error", "http_4xx")
    assert wrong not in str(rows) + stderr


def test_cli_readable_summary(fakellm: Server) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "probes",
            "--url",
            fakellm.origin + "/v1",
            "--format",
            "openai",
            "--model",
            "m",
            "--prompt",
            "latency?",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("1/1 ok")
    assert "HTTP/1.1 (new connection), output tokens" in proc.stdout


def test_the_first_probe_of_a_process_is_timed_like_the_next(fakellm: Server) -> None:
    """Three cold probes from one fresh CLI process: the client's own time before the body is
    sent (upload - dns - connect) must not be larger for the first."""
    code, rows, stderr = cli(
        "--url", fakellm.origin + "/v1", "--format", "openai", "--model", "m", "--cold", "-n", "3"
    )
    assert code == 0, stderr
    first, *rest = (overhead_ms(row) for row in rows)
    assert first <= min(rest) + 15, (first, rest)


def test_cli_can_leave_stream_options_out(litellm: LiteLLM) -> None:
    code, rows, stderr = cli(
        "--url",
        litellm.server.origin + "/v1",
        "--format",
        "openai",
        "--model",
        "gpt-4o-mock",
        "--api-key-env",
        "RW_INTEROP_KEY",
        "--no-stream-options",
        env=KEY_ENV,
    )
    assert code == 0, stderr
    (row,) = rows
    assert row["outcome"] == "ok"
    assert row["token_source"] == "tokenizer"  # LiteLLM sends usage only when asked
