"""The simulator's configuration: providers, their models and latency profiles, from TOML.

[[providers]]
slug = "fastchip"              # reached at /fastchip/v1/... (OpenAI) or /fastchip/v1/messages
format = "openai"              # or "anthropic", "responses", "gemini", "bedrock"
profile = "azure-openai"       # provider profile (optional): the format's own API by default;
                               # "azure-openai" = api-key header, /openai/deployments/<id>/...
api_keys = ["sk-sim-fastchip"]
allow_fault_header = true      # honour x-sim-fault (tests); false in a real demo
region = "us-east-1"           # bedrock: the region requests are signed for
aws_keys = { AKIDSIM = "secret" }  # bedrock: SigV4 access key id -> secret access key
accepts_msgpack = false        # true: application/vnd.msgpack bodies are read (Cerebras does)
requests_per_minute = 600      # 0 = unlimited; past it: 429 with retry-after
tokens_per_minute = 0
advertised_requests_per_minute = 1000000   # the limit headers show when none is enforced
advertised_tokens_per_minute = 1000000000  # (10**12 and values past 2**31-1 are allowed)
[providers.faults]             # probabilities per request (demo realism)
http_500 = 0.01
[[providers.models]]
id = "wafer-70b"
profile = "openai-reasoning"   # model profile (optional): see MODEL_PROFILES
served_model = ""              # the model id responses report (default: id)
queue_ms = 20                  # median queue delay; lognormal with queue_sigma (long tail)
queue_sigma = 0.5
prefill_tokens_per_s = 8000    # TTFT grows with uncached input tokens
decode_tokens_per_s = 1800     # generation speed; per-request lognormal jitter decode_sigma
decode_sigma = 0.05
itl_sigma = 0.2                # per-token gap jitter (lognormal, mean kept)
reasoning_tokens = 0           # generated before the answer (reasoning models; at medium
                               # effort for openai-reasoning; the most a thinking model uses)
output_tokens = 200            # typical answer length (max_tokens caps it)
quality = 0.95                 # probability of answering an eval question right
keepalive_interval_ms = 1000   # deepseek-/openrouter-reasoning: SSE comments while waiting
min_cacheable_tokens = 1024    # anthropic: shortest prefix a cache_control breakpoint caches
thinking_summary_ratio = 1.0   # anthropic, gemini, responses: streamed / billed thinking
chunk_tokens = 8               # gemini: tokens per streamed chunk
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS = (
    "http_500",
    "http_503",
    "http_529",
    "http_429",
    "stall_headers",
    "stall_mid",
    "trickle",
    "malformed_chunk",
    "no_usage",
    "usage_after_done",
    "reject_stream_options",
    "stream_error",
    "huge_response",
    "huge_line",
    "truncated",
    "ratelimit_inf",
    "stream_throttled",  # an in-stream rate-limit error (Responses, Gemini, Bedrock)
    "prompt_blocked",  # Gemini: promptFeedback.blockReason
    "sequence_gap",  # Responses: one event's sequence_number skipped
    "bad_signature",  # Bedrock: SigV4 checked against a different secret (403)
)

# Model profiles each format allows; the first is the default.
MODEL_PROFILES: dict[str, tuple[str, ...]] = {
    "openai": (
        "openai-compatible",  # a generic server (vLLM and the like); reasoning streamed
        "openai-reasoning",  # o-series / GPT-5: hidden reasoning, max_completion_tokens
        "deepseek-reasoning",  # reasoning_content deltas, ": keep-alive" while queued
        "openrouter-reasoning",  # reasoning deltas, ": OPENROUTER PROCESSING" while waiting
    ),
    "anthropic": ("anthropic",),
    "responses": ("openai-responses",),  # OpenAI Responses: hidden reasoning, summaries
    "gemini": ("gemini",),  # Gemini native: thought parts, cumulative usageMetadata
    "bedrock": ("bedrock",),  # Bedrock ConverseStream: reasoningContent, latency modes
}
PROVIDER_PROFILES: dict[str, tuple[str, ...]] = {
    "openai": ("openai", "azure-openai"),
    "anthropic": ("anthropic",),
    "responses": ("responses",),
    "gemini": ("gemini",),
    "bedrock": ("bedrock",),
}


class ConfigFileError(Exception):
    """The simulator's TOML is malformed."""


@dataclass(frozen=True)
class Profile:
    id: str
    profile: str = ""
    served_model: str = ""
    queue_ms: float = 20.0
    queue_sigma: float = 0.3
    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 100.0
    decode_sigma: float = 0.05
    # Per-token gap jitter (lognormal, mean kept): inter-token latency varies within a response.
    itl_sigma: float = 0.0
    reasoning_tokens: int = 0
    # Generic servers: whether reasoning counts against max_tokens (many do not). Reasoning
    # profiles decide for themselves (OpenAI and Anthropic always count it).
    max_tokens_includes_reasoning: bool = False
    output_tokens: int = 200
    quality: float = 0.9
    keepalive_interval_ms: float = 1000.0
    min_cacheable_tokens: int = 1024
    thinking_summary_ratio: float = 1.0
    # Gemini: tokens per streamed chunk (a chunk carries many).
    chunk_tokens: int = 8
    label: str = "simulated"
    # Not used by the server; the demo data loader copies them onto its Routes.
    price_input_per_mtok: float = 0.0
    price_output_per_mtok: float = 0.0
    quality_index: float | None = None

    @property
    def model_name(self) -> str:
        """The model id responses report."""
        return self.served_model or self.id


@dataclass(frozen=True)
class Provider:
    slug: str
    format: str
    api_keys: tuple[str, ...]
    models: dict[str, Profile]
    profile: str = ""
    allow_fault_header: bool = False
    accepts_msgpack: bool = False
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    advertised_requests_per_minute: int = 1_000_000
    advertised_tokens_per_minute: int = 1_000_000_000
    cache_ttl_s: float = 300.0
    # False: response headers go out as soon as the request is read (most providers);
    # True: after the queue delay, so time to headers includes queueing.
    headers_after_queue: bool = False
    faults: dict[str, float] = field(default_factory=dict)
    name: str = ""
    # Bedrock: the region it signs for, and SigV4 credentials (access key id -> secret);
    # api_keys are then Bedrock API keys (bearer tokens).
    region: str = "us-east-1"
    aws_keys: dict[str, str] = field(default_factory=dict)

    @property
    def wire(self) -> str:
        """The key of this provider's wire format in simulator.formats.FORMATS."""
        return "azure" if self.profile == "azure-openai" else self.format


@dataclass(frozen=True)
class Config:
    providers: dict[str, Provider]


def _profile(raw: dict[str, Any], fmt: str, where: str) -> Profile:
    known = set(Profile.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ConfigFileError(f"{where}: unknown keys {sorted(unknown)}")
    if "id" not in raw:
        raise ConfigFileError(f"{where}: a model needs an id")
    profile = Profile(**raw)
    allowed = MODEL_PROFILES[fmt]
    if not profile.profile:
        profile = dataclasses.replace(profile, profile=allowed[0])
    if profile.profile not in allowed:
        raise ConfigFileError(f"{where}: profile must be one of {', '.join(allowed)} for {fmt}")
    if profile.decode_tokens_per_s <= 0 or profile.prefill_tokens_per_s <= 0:
        raise ConfigFileError(f"{where}: rates must be positive")
    if not 0.0 <= profile.quality <= 1.0:
        raise ConfigFileError(f"{where}: quality must be between 0 and 1")
    if not 0.0 <= profile.thinking_summary_ratio <= 1.0:
        raise ConfigFileError(f"{where}: thinking_summary_ratio must be between 0 and 1")
    if profile.keepalive_interval_ms <= 0:
        raise ConfigFileError(f"{where}: keepalive_interval_ms must be positive")
    if profile.chunk_tokens < 1:
        raise ConfigFileError(f"{where}: chunk_tokens must be at least 1")
    if profile.min_cacheable_tokens < 0 or profile.reasoning_tokens < 0:
        raise ConfigFileError(f"{where}: token counts cannot be negative")
    return profile


def parse(data: dict[str, Any]) -> Config:
    providers: dict[str, Provider] = {}
    for i, raw in enumerate(data.get("providers", [])):
        where = f"providers[{i}]"
        raw = dict(raw)
        models_raw = raw.pop("models", [])
        faults = {str(k): float(v) for k, v in raw.pop("faults", {}).items()}
        for name, probability in faults.items():
            if name not in FAULTS:
                raise ConfigFileError(f"{where}: unknown fault {name!r}")
            if not 0.0 <= probability <= 1.0:
                raise ConfigFileError(f"{where}: fault {name} probability must be between 0 and 1")
        fmt = raw.get("format")
        if fmt not in MODEL_PROFILES:
            raise ConfigFileError(f"{where}: format must be one of {', '.join(MODEL_PROFILES)}")
        raw["profile"] = raw.get("profile") or PROVIDER_PROFILES[fmt][0]
        if raw["profile"] not in PROVIDER_PROFILES[fmt]:
            allowed = ", ".join(PROVIDER_PROFILES[fmt])
            raise ConfigFileError(f"{where}: profile must be one of {allowed} for {fmt}")
        keys = raw.pop("api_keys", [])
        if isinstance(keys, str):
            keys = [keys]
        if "api_key" in raw:
            keys = [*keys, str(raw.pop("api_key"))]
        models = {}
        for j, m in enumerate(models_raw):
            profile = _profile(dict(m), fmt, f"{where}.models[{j}]")
            models[profile.id] = profile
        try:
            provider = Provider(api_keys=tuple(keys), models=models, faults=faults, **raw)
        except TypeError as exc:
            raise ConfigFileError(f"{where}: {exc}") from None
        for limit in ("advertised_requests_per_minute", "advertised_tokens_per_minute"):
            if getattr(provider, limit) < 1:
                raise ConfigFileError(f"{where}: {limit} must be at least 1")
        providers[provider.slug] = provider
    if not providers:
        raise ConfigFileError("no [[providers]] configured")
    return Config(providers=providers)


def load(path: Path | str) -> Config:
    try:
        with open(path, "rb") as fh:
            return parse(tomllib.load(fh))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigFileError(f"{path}: {exc}") from None
