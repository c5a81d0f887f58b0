"""A probe spec (what to call and how) and a probe result (what was measured).

Result field names follow PRODUCT.md's metric table; units are in the names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

OK = "ok"
ERROR = "error"

ERROR_KINDS = (
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
)

BODY_JSON = "json"
BODY_MSGPACK_GZIP = "msgpack-gzip"


@dataclass
class ProbeSpec:
    """One call to make. `base_url` is the provider's base: `.../v1` for OpenAI-compatible
    servers, the URL before `/v1` for Anthropic."""

    base_url: str
    format: str  # "openai" | "anthropic"
    model: str
    api_key: str = field(default="", repr=False)
    user_prompt: str = "Say hello."
    system_prompt: str = ""
    input_tokens: int = 0  # target prompt size; 0 = the prompts as given
    max_tokens: int = 256
    http2: bool = False
    body_encoding: str = BODY_JSON
    cold: bool = False
    fresh_prefix: bool = False
    extra_headers: dict[str, str] = field(default_factory=dict)
    stream_options: bool = True  # ask for usage in the stream (OpenAI include_usage)
    total_timeout_s: float = 120.0
    first_token_timeout_s: float = 60.0
    max_response_bytes: int = 16 * 1024 * 1024
    max_line_bytes: int = 1024 * 1024
    text_limit: int = 8000
    verify: bool | str = True  # TLS verification, or a CA bundle path
    allow_private: bool = True  # refuse private/loopback addresses when False (checked at connect)
    connect_to: str | None = None  # "host:port" to connect to instead (delay proxies, pinning)

    def __repr__(self) -> str:  # never the key
        shown = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "api_key"
        }
        return f"ProbeSpec({shown!r}, api_key=[redacted])"


@dataclass
class ProbeResult:
    outcome: str = OK
    error_kind: str = ""
    error_detail: str = ""
    dns_ms: float | None = None
    connect_ms: float | None = None
    tls_ms: float | None = None
    upload_ms: float | None = None
    request_bytes: int | None = None
    ttfb_ms: float | None = None
    ttft_ms: float | None = None
    ttfat_ms: float | None = None
    e2e_ms: float | None = None
    output_tokens: int | None = None
    token_source: str = ""  # "usage" | "tokenizer"
    tps: float | None = None
    tpot_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_max_ms: float | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    http_version: str = ""
    ratelimit_remaining_requests: int | None = None
    ratelimit_remaining_tokens: int | None = None
    retry_after_s: float | None = None
    text: str = ""
    reasoning_tokens: int | None = None
    request_id: str = ""  # the provider's request id header, when it sends one
    t0_perf: float | None = None  # perf_counter at t0, to compare with a server's ground truth

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
