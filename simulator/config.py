"""The simulator's configuration: providers, their models and latency profiles, from TOML.

[[providers]]
slug = "fastchip"              # reached at /fastchip/v1/... (OpenAI) or /fastchip/v1/messages
format = "openai"              # or "anthropic"
api_keys = ["sk-sim-fastchip"]
allow_fault_header = true      # honour x-sim-fault (tests); false in a real demo
requests_per_minute = 600      # 0 = unlimited; past it: 429 with retry-after
tokens_per_minute = 0
[providers.faults]             # probabilities per request (demo realism)
http_500 = 0.01
[[providers.models]]
id = "wafer-70b"
queue_ms = 20                  # median queue delay; lognormal with queue_sigma (long tail)
queue_sigma = 0.5
prefill_tokens_per_s = 8000    # TTFT grows with uncached input tokens
decode_tokens_per_s = 1800     # generation speed; per-request lognormal jitter decode_sigma
decode_sigma = 0.05
itl_sigma = 0.2                # per-token gap jitter (lognormal, mean kept)
reasoning_tokens = 0           # generated before the answer (reasoning models)
output_tokens = 200            # typical answer length (max_tokens caps it)
quality = 0.95                 # probability of answering an eval question right
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS = (
    "http_500",
    "http_503",
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
)


class ConfigError(Exception):
    """The simulator's TOML is malformed."""


@dataclass(frozen=True)
class Profile:
    id: str
    queue_ms: float = 20.0
    queue_sigma: float = 0.3
    prefill_tokens_per_s: float = 10_000.0
    decode_tokens_per_s: float = 100.0
    decode_sigma: float = 0.05
    # Per-token gap jitter (lognormal, mean kept): inter-token latency varies within a response.
    itl_sigma: float = 0.0
    reasoning_tokens: int = 0
    # OpenAI o-series and Anthropic count reasoning against max_tokens; many servers do not.
    max_tokens_includes_reasoning: bool = False
    output_tokens: int = 200
    quality: float = 0.9
    label: str = "simulated"
    # Not used by the server; the demo data loader copies them onto its Routes.
    price_input_per_mtok: float = 0.0
    price_output_per_mtok: float = 0.0
    quality_index: float | None = None


@dataclass(frozen=True)
class Provider:
    slug: str
    format: str
    api_keys: tuple[str, ...]
    models: dict[str, Profile]
    allow_fault_header: bool = False
    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    cache_ttl_s: float = 300.0
    # False: response headers go out as soon as the request is read (most providers);
    # True: after the queue delay, so time to headers includes queueing.
    headers_after_queue: bool = False
    faults: dict[str, float] = field(default_factory=dict)
    name: str = ""


@dataclass(frozen=True)
class Config:
    providers: dict[str, Provider]


def _profile(raw: dict[str, Any], where: str) -> Profile:
    known = set(Profile.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    if "id" not in raw:
        raise ConfigError(f"{where}: a model needs an id")
    profile = Profile(**raw)
    if profile.decode_tokens_per_s <= 0 or profile.prefill_tokens_per_s <= 0:
        raise ConfigError(f"{where}: rates must be positive")
    if not 0.0 <= profile.quality <= 1.0:
        raise ConfigError(f"{where}: quality must be between 0 and 1")
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
                raise ConfigError(f"{where}: unknown fault {name!r}")
            if not 0.0 <= probability <= 1.0:
                raise ConfigError(f"{where}: fault {name} probability must be between 0 and 1")
        if raw.get("format") not in ("openai", "anthropic"):
            raise ConfigError(f"{where}: format must be openai or anthropic")
        keys = raw.pop("api_keys", [])
        if isinstance(keys, str):
            keys = [keys]
        if "api_key" in raw:
            keys = [*keys, str(raw.pop("api_key"))]
        models = {}
        for j, m in enumerate(models_raw):
            profile = _profile(dict(m), f"{where}.models[{j}]")
            models[profile.id] = profile
        try:
            provider = Provider(api_keys=tuple(keys), models=models, faults=faults, **raw)
        except TypeError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        providers[provider.slug] = provider
    if not providers:
        raise ConfigError("no [[providers]] configured")
    return Config(providers=providers)


def load(path: Path | str) -> Config:
    try:
        with open(path, "rb") as fh:
            return parse(tomllib.load(fh))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
