"""Numbers a provider sends (rate-limit headers, usage) never fail a probe: out of range, they
are clamped or nulled, and every stored figure fits its column (finite; counts 0..2**31-1).

A property test: hypothesis draws the values, a real loopback server sends them, the real
engine probes it over a socket."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from probes import ProbeSpec
from probes.formats import MAX_COUNT
from tests.probes.loopback import LoopbackServer, Received, Reply, sse
from tests.probes.real_apis import SSE_HEADERS, anthropic_event
from tests.probes.support import run

COUNT_FIELDS = (
    "output_tokens",
    "input_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "hidden_reasoning_tokens",
    "streamed_output_tokens",
    "ratelimit_remaining_requests",
    "ratelimit_remaining_tokens",
)
FLOAT_FIELDS = ("tps", "tpot_ms", "retry_after_s", "ttft_ms", "e2e_ms")

# Header values: numbers of every kind, written as servers write them, and things that are not.
header_values = st.one_of(
    st.sampled_from(
        [
            "inf",
            "-inf",
            "Infinity",
            "NaN",
            "nan",
            "-1",
            "1e400",
            "2147483648",
            "9" * 40,
            "",
            "abc",
            "0x10",
            "12.5",
            "Wed, 21 Oct 2015 07:28:00 GMT",
            "Fri, 31 Dec 2100 23:59:59 GMT",
            "1_000",
        ]
    ),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=12),
)
# Usage values: JSON numbers of every size and sign (Python's json reads 1e400 as inf and
# accepts NaN/Infinity, as lenient servers write them), and what is not a number at all.
usage_values = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["12", None, True, [], {}, "1e400"]),
)
HEADERS = ("x-ratelimit-remaining-tokens", "x-ratelimit-remaining-requests", "retry-after")
case: dict[str, Any] = {}


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))  # NaN and Infinity as lenient servers write them


def _reply(request: Received) -> Reply:
    headers = [*SSE_HEADERS, *((n, v) for n, v in case["headers"].items())]
    u = case["usage"]
    if request.target.startswith("/v1/messages"):
        start = {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "model": "claude",
                "usage": {"input_tokens": u[0], "cache_read_input_tokens": u[1],
                          "cache_creation_input_tokens": u[2], "output_tokens": 1},
            },
        }  # fmt: skip
        events = [
            anthropic_event("message_start", start),
            anthropic_event(
                "content_block_delta",
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": " hi"}},
            ),
            anthropic_event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "delta": {"type": "thinking_delta", "thinking": " hm"},
                },
            ),
            anthropic_event(
                "content_block_delta",
                {"type": "content_block_delta", "delta": {"type": "text_delta", "text": " there"}},
            ),
            f"event: message_delta\ndata: {_json({'type': 'message_delta', 'delta': {'stop_reason': 'end_turn'}, 'usage': {'output_tokens': u[3]}})}\n\n".encode(),
            anthropic_event("message_stop", {"type": "message_stop"}),
        ]
        return Reply(200, headers, [(0.001, e) for e in events])
    usage = {
        "prompt_tokens": u[0],
        "prompt_tokens_details": {"cached_tokens": u[1]},
        "completion_tokens": u[3],
        "completion_tokens_details": {"reasoning_tokens": u[2]},
    }
    chunks = sse(
        {"choices": [{"index": 0, "delta": {"content": " hi"}}]},
        {"choices": [{"index": 0, "delta": {"content": " there"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        _json({"choices": [], "usage": usage}),
    )
    return Reply(200, headers, [(0.001, c) for c in chunks])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(["openai", "anthropic"]),
    headers=st.fixed_dictionaries({}, optional=dict.fromkeys(HEADERS, header_values)),
    usage=st.tuples(usage_values, usage_values, usage_values, usage_values),
)
def test_no_number_a_provider_sends_fails_a_probe_or_escapes_its_column(
    fmt: str, headers: dict[str, str], usage: tuple[Any, ...]
) -> None:
    case.update(headers=headers, usage=usage)
    with LoopbackServer(_reply) as server:
        result = run(
            ProbeSpec(
                base_url=server.url + ("/v1" if fmt == "openai" else ""),
                format=fmt,
                model="m",
                cold=True,
                total_timeout_s=5,
                first_token_timeout_s=5,
            )
        )
    assert result.ok, (result.error_kind, result.error_detail)
    for name in COUNT_FIELDS:
        value = getattr(result, name)
        assert value is None or (type(value) is int and 0 <= value <= MAX_COUNT), (name, value)
    for name in FLOAT_FIELDS:
        value = getattr(result, name)
        assert value is None or (isinstance(value, float) and math.isfinite(value)), (name, value)
    json.dumps(result.to_dict(), allow_nan=False)  # what crosses the broker is plain JSON


def test_out_of_range_values_are_clamped_or_nulled_as_documented() -> None:
    case.update(
        headers={
            "x-ratelimit-remaining-tokens": "inf",
            "x-ratelimit-remaining-requests": "-3",
            "retry-after": "1e400",
        },
        usage=(2**40, 12, -1, 2),
    )
    with LoopbackServer(_reply) as server:
        result = run(ProbeSpec(base_url=server.url + "/v1", format="openai", model="m", cold=True))
    assert result.ok, result.error_detail
    assert result.ratelimit_remaining_tokens == MAX_COUNT  # "unlimited": clamped
    assert result.ratelimit_remaining_requests is None  # not a count: null
    assert result.retry_after_s == 7 * 24 * 3600  # clamped to a week
    assert result.input_tokens is None  # a 2**40-token prompt is not a real count
    assert result.cached_tokens == 12
    assert result.reasoning_tokens is None
    assert result.output_tokens == 2
