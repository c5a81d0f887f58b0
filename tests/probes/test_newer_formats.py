"""OpenAI Responses, Gemini native and Bedrock ConverseStream, measured through the real engine
over loopback HTTP against the simulator, and held to its ground truth: first token and first
answer token within 1 ms of when the simulator sent them, speed within 2%, hidden reasoning
apart, cached tokens read, every in-stream error with its kind, the provider's own time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import httpx2
import pytest

from probes import Measurement, ProbeSpec
from simulator.testing import SimulatorProcess
from tests.probes.support import run_all
from tests.support import ROOT

RESPONSES_KEY = "sk-test-oairesp-0123456789"
GEMINI_KEY = "test-gemsim-key-0123456789"
BEDROCK_API_KEY = "bedrock-api-key-test-0123456789"
AWS = {
    "aws_region": "us-west-2",
    "aws_access_key_id": "AKIDTESTBEDSIM01",
    "aws_secret_access_key": "test-secret-bedsim-0123456789",
}
CLAUDE = "anthropic.claude-sim-v1:0"  # a ':' in the model id, as Bedrock's have


def _spec(
    sim: SimulatorProcess, fmt: str, model: str = "", fault: str = "", **kw: Any
) -> ProbeSpec:
    base: dict[str, Any]
    if fmt == "responses":
        base = {
            "base_url": sim.base_url + "/oairesp/v1",
            "model": "resp-think",
            "api_key": RESPONSES_KEY,
        }
    elif fmt == "gemini":
        base = {
            "base_url": sim.base_url + "/gemsim/v1beta",
            "model": "gem-think",
            "api_key": GEMINI_KEY,
        }
    else:
        base = {"base_url": sim.base_url + "/bedsim", "model": CLAUDE, **AWS}
    if model:
        base["model"] = model
    base.setdefault("max_tokens", 600)
    headers = {"x-sim-fault": fault} if fault else {}
    return ProbeSpec(format=fmt, extra_headers=headers, **{**base, **kw})


def _truth(sim: SimulatorProcess, result: Measurement) -> dict[str, Any]:
    return dict(httpx2.get(f"{sim.base_url}/_sim/requests/{result.request_id}").json())


def _ms_after_sent(result: Measurement, ms: float | None, sent_at: float) -> float:
    assert result.t0_perf is not None
    assert ms is not None
    return (result.t0_perf + ms / 1000 - sent_at) * 1000


def _speed_truth(truth: dict[str, Any], chunks: bool) -> float:
    times = truth["token_times"]
    if not chunks:
        return (len(times) - 1) / (times[-1] - times[0])
    answer = times[len(times) - (truth["output_tokens"] - truth["reasoning_tokens"]) :]
    first = sum(1 for t in answer if t == answer[0])  # the tokens of the first answer chunk
    return (len(answer) - first) / (answer[-1] - answer[0])


# Each: format, request settings that make its model reason, and whether the reasoning streams.
REASONING = [
    pytest.param("responses", {}, id="responses-hidden-reasoning"),
    pytest.param(
        "responses", {"extra_body": {"reasoning": {"summary": "auto"}}}, id="responses-summary"
    ),
    pytest.param("gemini", {"thinking_budget_tokens": 1000}, id="gemini-thought-summaries"),
    pytest.param("gemini", {"extra_body": {"generationConfig": {}}}, id="gemini-hidden-thoughts"),
    pytest.param(
        "bedrock", {"thinking_budget_tokens": 1024, "max_tokens": 2000}, id="bedrock-sigv4"
    ),
    pytest.param(
        "bedrock",
        {
            "thinking_budget_tokens": 1024,
            "max_tokens": 2000,
            "api_key": BEDROCK_API_KEY,
            "http2": True,
        },
        id="bedrock-api-key-http2",
    ),
]


@pytest.mark.parametrize(("fmt", "settings"), REASONING)
def test_every_figure_matches_the_simulators_ground_truth(
    sim: SimulatorProcess, fmt: str, settings: dict[str, Any]
) -> None:
    spec = _spec(sim, fmt, input_tokens=1500, user_prompt="What is 12 * 12?", **settings)
    offsets_ms: list[float] = []
    for n, result in enumerate(run_all(spec, spec, spec)):
        assert result.ok, result.error_detail
        truth = _truth(sim, result)
        # A lifecycle event (response.created, a reasoning item, messageStart) is not a token:
        # the first token and the first answer token arrive when the simulator sent them.
        offsets_ms += [
            _ms_after_sent(result, result.ttft_ms, truth["first_token_at"]),
            _ms_after_sent(result, result.ttfat_ms, truth["first_answer_token_at"]),
        ]
        assert result.tps is not None
        speed = _speed_truth(truth, chunks=fmt == "gemini")
        assert result.tps == pytest.approx(speed, rel=0.02)
        # Billed output, the reasoning in it, and what of it never streamed, each apart.
        assert result.output_tokens == truth["output_tokens"]
        assert result.reasoning_tokens == truth["reasoning_tokens"] > 0
        assert result.hidden_reasoning_tokens == truth["hidden_tokens"]
        assert result.input_tokens == truth["input_tokens"]
        # The second probe's stable prefix is read from the cache, and reported so.
        assert result.cached_tokens == truth["cached_tokens"]
        if n == 1:
            assert result.cached_tokens is not None
            assert result.cached_tokens >= 1024
        assert result.e2e_ms is not None
        if fmt != "gemini":  # Gemini reports no time of its own
            assert result.server_ms == truth["server_ms"]
            assert 0 <= result.server_ms <= result.e2e_ms
        else:
            assert result.server_ms is None
        if fmt == "responses":  # kept out of the account's stored responses, and unpadded
            assert truth["options"]["store"] is False
            assert truth["options"]["obfuscation"] is False
    # Within 1 ms of the send times, read from the kernel's receive stamps; on a shared, busy
    # machine the simulator can be preempted between stamping a token and writing it, so one
    # stamp of six may be late by a few ms (never by more than the loopback bound, 25 ms).
    assert sorted(abs(o) for o in offsets_ms)[-2] < 1, offsets_ms
    assert max(abs(o) for o in offsets_ms) < 25, offsets_ms


def test_a_model_that_does_not_reason_has_the_same_first_token_and_first_answer(
    sim: SimulatorProcess,
) -> None:
    specs = [
        _spec(sim, "responses", "resp-plain"),
        _spec(sim, "gemini", "gem-flash"),
        _spec(sim, "bedrock", "us.meta.llama-sim-v1:0"),
    ]
    for result in run_all(*specs):
        assert result.ok, result.error_detail
        assert result.ttft_ms == result.ttfat_ms
        assert result.reasoning_tokens in (None, 0)
        truth = _truth(sim, result)
        assert result.output_tokens == truth["output_tokens"]


@pytest.mark.parametrize(
    ("fmt", "fault", "kind"),
    [
        ("responses", "stream_error", "stream_error"),
        ("responses", "stream_throttled", "http_429"),
        ("responses", "sequence_gap", "malformed_stream"),
        ("responses", "malformed_chunk", "malformed_stream"),
        ("responses", "truncated", "truncated"),
        ("gemini", "stream_error", "stream_error"),
        ("gemini", "stream_throttled", "http_429"),
        ("gemini", "prompt_blocked", "config"),
        ("gemini", "malformed_chunk", "malformed_stream"),
        ("gemini", "truncated", "truncated"),
        ("bedrock", "stream_error", "stream_error"),
        ("bedrock", "stream_throttled", "http_429"),
        ("bedrock", "malformed_chunk", "malformed_stream"),
        ("bedrock", "truncated", "truncated"),
        ("bedrock", "bad_signature", "http_4xx"),
        ("bedrock", "http_429", "http_429"),
    ],
)
def test_every_in_stream_error_has_its_kind(
    sim: SimulatorProcess, fmt: str, fault: str, kind: str
) -> None:
    (result,) = run_all(_spec(sim, fmt, fault=fault))
    assert result.error_kind == kind, result.error_detail
    if fault == "bad_signature":
        assert "signature we calculated does not match" in result.error_detail
    mid_stream = fault not in ("bad_signature", "http_429", "prompt_blocked")
    assert (result.ttft_ms is not None) == mid_stream  # output came before the failure


def test_responses_cut_at_max_output_tokens_is_our_configuration(sim: SimulatorProcess) -> None:
    # 40 tokens of hidden reasoning leave 10 of 50 for the answer: incomplete, ours to fix.
    (result,) = run_all(_spec(sim, "responses", max_tokens=50))
    assert result.error_kind == "config"
    assert "max_output_tokens" in result.error_detail
    assert result.reasoning_tokens == 40


def test_gemini_refuses_a_thinking_budget_and_level_together(sim: SimulatorProcess) -> None:
    spec = _spec(sim, "gemini", thinking_budget_tokens=100, reasoning_effort="low")
    (result,) = run_all(spec)
    assert result.error_kind == "config"
    assert "never both" in result.error_detail
    raw = httpx2.post(
        sim.base_url + "/gemsim/v1beta/models/gem-think:streamGenerateContent?alt=sse",
        headers={"x-goog-api-key": GEMINI_KEY},
        json={
            "contents": [{"parts": [{"text": "hi"}]}],
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 10, "thinkingLevel": "low"}},
        },
    )
    assert raw.status_code == 400
    assert raw.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_gemini_usage_is_cumulative_and_kept_not_summed(sim: SimulatorProcess) -> None:
    raw = httpx2.post(
        sim.base_url + "/gemsim/v1beta/models/gem-flash:streamGenerateContent?alt=sse",
        headers={"x-goog-api-key": GEMINI_KEY},
        json={"contents": [{"parts": [{"text": "hi"}]}]},
    )
    chunks = [json.loads(line[6:]) for line in raw.text.split("\r\n") if line.startswith("data: ")]
    counts = [c["usageMetadata"].get("candidatesTokenCount", 0) for c in chunks]
    assert len(chunks) > 2
    assert counts == sorted(counts)
    (result,) = run_all(_spec(sim, "gemini", "gem-flash"))
    assert result.output_tokens == counts[-1] < sum(counts)


def test_bedrock_refuses_a_request_signed_with_another_secret(sim: SimulatorProcess) -> None:
    (result,) = run_all(_spec(sim, "bedrock", aws_secret_access_key="not-the-secret"))
    assert result.error_kind == "http_4xx"
    assert "403" in result.error_detail
    assert "not-the-secret" not in result.error_detail


@pytest.mark.parametrize(
    ("fmt", "env", "extra"),
    [
        ("responses", {"KEY": RESPONSES_KEY}, ["--api-key-env", "KEY"]),
        ("gemini", {"KEY": GEMINI_KEY}, ["--api-key-env", "KEY"]),
        (
            "bedrock",
            {
                "AWS_ACCESS_KEY_ID": AWS["aws_access_key_id"],
                "AWS_SECRET_ACCESS_KEY": AWS["aws_secret_access_key"],
            },
            ["--aws-region", "us-west-2"],
        ),
    ],
)
def test_the_cli_probes_each_format(
    sim: SimulatorProcess, fmt: str, env: dict[str, str], extra: list[str]
) -> None:
    spec = _spec(sim, fmt)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "probes", "--url", spec.base_url, "--format", fmt),
            *("--model", spec.model, "--max-tokens", "600", "--json", *extra),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr + done.stdout
    row = json.loads(done.stdout)
    assert row["outcome"] == "ok"
    assert row["ttft_ms"] is not None
    assert row["output_tokens"] > 0


def test_a_done_sentinel_after_a_responses_stream_is_no_output() -> None:
    """LiteLLM's Responses bridge ends its streams with Chat Completions' `data: [DONE]`, as
    the openai SDK's stream tolerates: it neither fails the probe nor ends it (the terminal
    event does)."""
    from probes.formats import WIRE_FORMATS
    from probes.sse import Event

    read = WIRE_FORMATS["responses"].reader()
    completed = {
        "type": "response.completed",
        "sequence_number": 0,
        "response": {"model": "m", "usage": {"input_tokens": 3, "output_tokens": 2}},
    }
    kinds = [p.kind for p in read(Event("response.completed", json.dumps(completed)))]
    assert kinds[-1] == "done"
    assert read(Event("", "[DONE]")) == []
    fresh = WIRE_FORMATS["responses"].reader()
    assert fresh(Event("", "[DONE]")) == []  # and alone it says nothing about the end
