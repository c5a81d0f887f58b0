"""A probe spec (what to call and how) and a probe result (what was measured).

Result field names follow PRODUCT.md's metric table; units are in the names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from probes.errors import Kind

OK = "ok"
ERROR = "error"

# Every kind the engine can return (the monitor adds "missed" itself, for slots with no result).
ERROR_KINDS: tuple[str, ...] = tuple(k.value for k in Kind if k is not Kind.MISSED)

BODY_JSON = "json"
BODY_MSGPACK_GZIP = "msgpack-gzip"
# The registry of request body encodings, each with what the admin calls it (monitor.models
# reads it).
BODY_ENCODINGS: dict[str, str] = {BODY_JSON: "JSON", BODY_MSGPACK_GZIP: "msgpack + gzip"}

# The parameter that caps output: chat models take max_tokens; OpenAI's reasoning models
# (o-series, GPT-5) refuse it with 400 unsupported_parameter and take max_completion_tokens.
MAX_TOKENS = "max_tokens"
MAX_COMPLETION_TOKENS = "max_completion_tokens"
TOKEN_LIMIT_PARAMS = (MAX_TOKENS, MAX_COMPLETION_TOKENS)

# The gaps between content chunks a result keeps, one per chunk after the first (OpenTelemetry's
# gen_ai.client.operation.time_per_output_chunk is recorded per chunk). Bounded: a longer stream
# keeps its first MAX_CHUNK_GAPS gaps (itl_p50_ms / itl_max_ms still cover every chunk).
MAX_CHUNK_GAPS = 256

# How output_tokens was counted (token_source) and how tps's tokens were (tps_token_source).
# These name a count's origin, they are not passwords (S105).
SOURCE_USAGE = "usage"
SOURCE_TOKENIZER = "tokenizer"
SOURCE_USAGE_MINUS_HIDDEN = "usage-minus-hidden-reasoning"


@dataclass
class ProbeSpec:
    """One call to make. `base_url` is the provider's base: `.../v1` for OpenAI-compatible
    servers, the URL before `/v1` for Anthropic, the deployment URL for Azure OpenAI
    (`https://RESOURCE.openai.azure.com/openai/deployments/DEPLOYMENT`)."""

    base_url: str
    format: str  # a key of probes.formats.WIRE_FORMATS: "openai", "anthropic", "bedrock"...
    model: str
    api_key: str = field(default="", repr=False)
    user_prompt: str = "Say hello."
    system_prompt: str = ""
    input_tokens: int = 0  # target prompt size; 0 = the prompts as given
    max_tokens: int = 256  # the output cap, sent under token_limit_param
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
    # Per-route request settings, sent as the real APIs name them ("" counts as not set).
    token_limit_param: str = MAX_TOKENS  # or MAX_COMPLETION_TOKENS
    reasoning_effort: str | None = None  # OpenAI formats: reasoning_effort
    thinking_budget_tokens: int | None = None  # Anthropic: thinking.budget_tokens
    service_tier: str | None = None  # sent as service_tier
    temperature: float | None = None  # None: not sent (reasoning models refuse non-defaults)
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged last; see formats
    api_version: str | None = None  # Azure OpenAI: the api-version query parameter
    # Headers that carry credentials (gateway keys...): like api_key, never in repr, redacted
    # from every detail.
    secret_headers: dict[str, str] = field(default_factory=dict, repr=False)
    # Amazon Bedrock: the region, and SigV4 credentials (used when api_key, a Bedrock API key
    # sent as a bearer token, is empty).
    aws_region: str = ""
    aws_access_key_id: str = ""
    aws_secret_access_key: str = field(default="", repr=False)
    aws_session_token: str = field(default="", repr=False)

    def secrets(self) -> tuple[str, ...]:
        """Every value this spec must never leak: the keys and the secret headers' values."""
        return tuple(
            s
            for s in (
                self.api_key,
                self.aws_secret_access_key,
                self.aws_session_token,
                *self.secret_headers.values(),
            )
            if s
        )

    def __repr__(self) -> str:  # never a secret
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}
        hidden = ", ".join(f"{f.name}=[redacted]" for f in dataclasses.fields(self) if not f.repr)
        return f"ProbeSpec({shown!r}, {hidden})"


@dataclass
class Measurement:
    outcome: str = OK
    error_kind: str = ""  # a probes.errors.Kind value
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
    # A failed probe: request sent -> the failure was known (e2e_ms is for completed streams).
    failed_after_ms: float | None = None
    output_tokens: int | None = None  # billed output, hidden reasoning included
    token_source: str = ""  # "usage" | "tokenizer"
    tps: float | None = None  # streamed tokens only: (streamed_output_tokens - 1) / window
    tpot_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_max_ms: float | None = None
    # Each gap between content chunks (ms, arrival to arrival), in order, at most MAX_CHUNK_GAPS.
    chunk_gaps_ms: list[float] | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    http_version: str = ""
    ratelimit_remaining_requests: int | None = None
    ratelimit_remaining_tokens: int | None = None
    retry_after_s: float | None = None
    text: str = ""
    reasoning_tokens: int | None = None  # reported (or derived), streamed or hidden
    request_id: str = ""  # the provider's request id header, else the response's id
    t0_perf: float | None = None  # perf_counter at t0, to compare with a server's ground truth
    # Speed counts only what streamed: how its tokens were counted, and how many there were.
    tps_token_source: str = ""  # "usage" | "usage-minus-hidden-reasoning" | "tokenizer"
    streamed_output_tokens: int | None = None
    hidden_reasoning_tokens: int | None = None  # billed but never streamed (0: all streamed)
    # What actually served the probe.
    served_model: str = ""  # the response's model id
    service_tier: str = ""  # the tier the provider reports having used
    connection_reused: bool | None = None  # None when no request got as far as a connection
    # The provider's own time, as it reports it: Bedrock's metrics.latencyMs (the whole
    # request), else a processing-time header (openai-processing-ms: up to the headers). The
    # rest of e2e is the path's.
    server_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == OK

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
