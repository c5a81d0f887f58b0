"""Presets for the common providers and kinds of route, offered in the admin.

A preset fills in fields the admin would otherwise look up in each provider's documentation;
every value stays editable afterwards. Provider base URLs are the providers' documented API
roots; the route presets follow each API's documented parameters (OpenAI reasoning models
refuse `max_tokens` and any non-default `temperature`; Anthropic thinking needs a budget of at
least 1024 tokens)."""

from __future__ import annotations

from typing import Any, TypedDict
from urllib.parse import urlsplit

# How a provider reuses a prompt prefix it has seen (shown in admin; what the probe measures as
# cache hits). Automatic: the provider caches prefixes by itself and reports cached input tokens;
# explicit: the request marks the cached prefix (Anthropic's cache_control, which the engine
# sends); server: a self-hosted server's own prefix cache, on or off by its launch flags.
CACHE_AUTOMATIC = "automatic prefix cache"
CACHE_EXPLICIT = "explicit cache_control breakpoints"
CACHE_SERVER = "the server's prefix cache (launch option)"
# How a reasoning model is told how hard to think (the route fields that carry it).
REASONING_EFFORT = "reasoning_effort"
REASONING_THINKING = "thinking budget"
REASONING_BUDGET_OR_LEVEL = "thinking budget, or a thinking level (reasoning_effort)"
REASONING_NONE = "none"
CACHE_POINTS = "explicit cachePoint blocks"


class ProviderPreset(TypedDict):
    label: str
    base_url: str
    wire_format: str
    # How the key is sent: follows from the wire format (probes.formats), stated for the admin.
    auth: str
    http2: bool
    accepts_msgpack: bool
    cache_style: str
    reasoning_style: str
    # The route preset (ROUTE_PRESETS) a new route of this provider starts from, and settings
    # that provider needs on top of it.
    route_preset: str
    route_settings: dict[str, Any]
    # The provider's name in LiteLLM's price file (`litellm_provider`; manage.py import_prices).
    litellm_provider: str
    docs: str


class RoutePreset(TypedDict):
    label: str
    settings: dict[str, Any]


def _preset(
    label: str,
    base_url: str,
    *,
    litellm_provider: str,
    docs: str,
    wire_format: str = "openai",
    auth: str = "Authorization: Bearer <key>",
    http2: bool = True,
    cache_style: str = CACHE_AUTOMATIC,
    reasoning_style: str = REASONING_EFFORT,
    route_preset: str = "chat",
    route_settings: dict[str, Any] | None = None,
) -> ProviderPreset:
    return {
        "label": label,
        "base_url": base_url,
        "wire_format": wire_format,
        "auth": auth,
        "http2": http2,
        # No hosted API documents msgpack request bodies; only the simulator takes them.
        "accepts_msgpack": False,
        "cache_style": cache_style,
        "reasoning_style": reasoning_style,
        "route_preset": route_preset,
        "route_settings": route_settings or {},
        "litellm_provider": litellm_provider,
        "docs": docs,
    }


# Base URLs are the documented API roots (the engine appends /chat/completions or /v1/messages).
# Self-hosted servers listen on their documented default ports over plain HTTP/1.1 (uvicorn,
# llama-server and Ollama's server do not speak h2c); a private address needs
# PROVIDER_ALLOW_PRIVATE_NETWORKS=true.
PROVIDER_PRESETS: dict[str, ProviderPreset] = {
    "openai": _preset(
        "OpenAI",
        "https://api.openai.com/v1",
        litellm_provider="openai",
        docs="https://platform.openai.com/docs/api-reference/chat",
    ),
    "azure": _preset(
        "Azure OpenAI (replace RESOURCE and DEPLOYMENT)",
        "https://RESOURCE.openai.azure.com/openai/deployments/DEPLOYMENT",
        wire_format="azure",
        auth="api-key: <key>",
        route_settings={"api_version": "2024-10-21"},
        litellm_provider="azure",
        docs="https://learn.microsoft.com/azure/ai-foundry/openai/reference",
    ),
    "openai-responses": _preset(
        "OpenAI (Responses API)",
        "https://api.openai.com/v1",
        wire_format="responses",
        litellm_provider="openai",
        docs="https://platform.openai.com/docs/api-reference/responses",
    ),
    "anthropic": _preset(
        "Anthropic",
        "https://api.anthropic.com",
        wire_format="anthropic",
        auth="x-api-key: <key> (with anthropic-version: 2023-06-01)",
        cache_style=CACHE_EXPLICIT,
        reasoning_style=REASONING_THINKING,
        litellm_provider="anthropic",
        docs="https://docs.anthropic.com/en/api/messages",
    ),
    "gemini": _preset(
        "Google Gemini (OpenAI-compatible endpoint)",
        "https://generativelanguage.googleapis.com/v1beta/openai",
        litellm_provider="gemini",
        docs="https://ai.google.dev/gemini-api/docs/openai",
    ),
    "gemini-native": _preset(
        "Google AI Studio (Gemini native API)",
        "https://generativelanguage.googleapis.com/v1beta",
        wire_format="gemini",
        auth="x-goog-api-key: <key>",
        reasoning_style=REASONING_BUDGET_OR_LEVEL,
        litellm_provider="gemini",
        docs="https://ai.google.dev/api/generate-content",
    ),
    "bedrock": _preset(
        "Amazon Bedrock (replace us-east-1 with your region)",
        "https://bedrock-runtime.us-east-1.amazonaws.com",
        wire_format="bedrock",
        auth="SigV4 (AWS access key id + secret) or a Bedrock API key as a bearer token",
        # The SDKs speak HTTP/1.1 to bedrock-runtime for ConverseStream.
        http2=False,
        cache_style=CACHE_POINTS,
        reasoning_style=REASONING_THINKING,
        litellm_provider="bedrock",
        docs="https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ConverseStream.html",
    ),
    "groq": _preset(
        "Groq",
        "https://api.groq.com/openai/v1",
        litellm_provider="groq",
        docs="https://console.groq.com/docs/openai",
    ),
    "together": _preset(
        "Together AI",
        "https://api.together.xyz/v1",
        litellm_provider="together_ai",
        docs="https://docs.together.ai/docs/openai-api-compatibility",
    ),
    "fireworks": _preset(
        "Fireworks AI",
        "https://api.fireworks.ai/inference/v1",
        litellm_provider="fireworks_ai",
        docs="https://docs.fireworks.ai/tools-sdks/openai-compatibility",
    ),
    "cerebras": _preset(
        "Cerebras",
        "https://api.cerebras.ai/v1",
        litellm_provider="cerebras",
        docs="https://inference-docs.cerebras.ai/resources/openai",
    ),
    "mistral": _preset(
        "Mistral AI",
        "https://api.mistral.ai/v1",
        litellm_provider="mistral",
        docs="https://docs.mistral.ai/api/",
    ),
    "deepseek": _preset(
        "DeepSeek",
        "https://api.deepseek.com/v1",
        litellm_provider="deepseek",
        docs="https://api-docs.deepseek.com/",
    ),
    "openrouter": _preset(
        "OpenRouter",
        "https://openrouter.ai/api/v1",
        litellm_provider="openrouter",
        docs="https://openrouter.ai/docs/api-reference/overview",
    ),
    "vllm": _preset(
        "vLLM server (local)",
        "http://localhost:8000/v1",
        auth="Authorization: Bearer <key> (only if started with --api-key)",
        http2=False,
        cache_style=CACHE_SERVER,
        reasoning_style=REASONING_NONE,
        litellm_provider="hosted_vllm",
        docs="https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html",
    ),
    "llamacpp": _preset(
        "llama.cpp server (local)",
        "http://localhost:8080/v1",
        auth="Authorization: Bearer <key> (only if started with --api-key)",
        http2=False,
        cache_style=CACHE_SERVER,
        reasoning_style=REASONING_NONE,
        litellm_provider="llamafile",
        docs="https://github.com/ggml-org/llama.cpp/tree/master/tools/server",
    ),
    "ollama": _preset(
        "Ollama (local)",
        "http://localhost:11434/v1",
        auth="none (any key is accepted and ignored)",
        http2=False,
        cache_style=CACHE_SERVER,
        reasoning_style=REASONING_NONE,
        litellm_provider="ollama",
        docs="https://ollama.com/blog/openai-compatibility",
    ),
}

_CHAT: dict[str, Any] = {
    "token_limit_param": "max_tokens",
    "reasoning_effort": "",
    "thinking_budget_tokens": None,
    "service_tier": "",
    "temperature": None,
    "api_version": "",
}

ROUTE_PRESETS: dict[str, RoutePreset] = {
    "chat": {
        "label": "Chat model (max_tokens; OpenAI-compatible servers, Anthropic)",
        "settings": _CHAT,
    },
    "openai-reasoning": {
        "label": "OpenAI reasoning model: o-series, GPT-5 (max_completion_tokens, low effort)",
        "settings": {
            **_CHAT,
            "token_limit_param": "max_completion_tokens",
            "reasoning_effort": "low",
        },
    },
    "openai-reasoning-priority": {
        "label": "OpenAI reasoning model, priority tier",
        "settings": {
            **_CHAT,
            "token_limit_param": "max_completion_tokens",
            "reasoning_effort": "low",
            "service_tier": "priority",
        },
    },
    "openai-reasoning-flex": {
        "label": "OpenAI reasoning model, flex tier (cheaper, slower: batch work)",
        "settings": {
            **_CHAT,
            "token_limit_param": "max_completion_tokens",
            "reasoning_effort": "low",
            "service_tier": "flex",
        },
    },
    "azure-reasoning": {
        "label": "Azure OpenAI reasoning deployment (max_completion_tokens, api-version 2024-10-21)",
        "settings": {
            **_CHAT,
            "token_limit_param": "max_completion_tokens",
            "api_version": "2024-10-21",
        },
    },
    "anthropic-thinking": {
        "label": "Anthropic with extended thinking (1024-token budget)",
        "settings": {**_CHAT, "thinking_budget_tokens": 1024},
    },
    "responses-reasoning": {
        "label": "OpenAI Responses, reasoning model (low effort; max_output_tokens with room "
        "for the reasoning)",
        "settings": {**_CHAT, "reasoning_effort": "low"},
    },
    "gemini-thinking": {
        "label": "Gemini native, thinking with a 1024-token budget (thought summaries shown)",
        "settings": {**_CHAT, "thinking_budget_tokens": 1024},
    },
    "bedrock-latency-optimized": {
        "label": "Bedrock, latency-optimized inference (where the model offers it)",
        "settings": {**_CHAT, "extra_body": {"performanceConfig": {"latency": "optimized"}}},
    },
}


# A route preset choice that means "what the route's provider preset says".
PROVIDER_DEFAULTS = "provider"


def describe(preset: ProviderPreset) -> str:
    """One line for the admin's preset menu: what choosing it sets."""
    transport = "HTTP/2" if preset["http2"] else "HTTP/1.1"
    return (
        f"{preset['label']}: {preset['wire_format']} format, {preset['auth']}, {transport}, "
        f"{preset['cache_style']}, reasoning by {preset['reasoning_style']}"
    )


def provider_choices() -> list[tuple[str, str]]:
    return [("", "none: fill in by hand")] + [(k, describe(p)) for k, p in PROVIDER_PRESETS.items()]


def route_choices() -> list[tuple[str, str]]:
    return [
        ("", "none: keep the settings below"),
        (PROVIDER_DEFAULTS, "the provider's defaults (from its preset)"),
    ] + [(k, p["label"]) for k, p in ROUTE_PRESETS.items()]


def provider_route_settings(provider_preset: str) -> dict[str, Any] | None:
    """The request settings a new route of a provider made from this preset starts with."""
    preset = PROVIDER_PRESETS.get(provider_preset)
    if preset is None:
        return None
    return {**ROUTE_PRESETS[preset["route_preset"]]["settings"], **preset["route_settings"]}


def litellm_provider_for(provider_preset: str, base_url: str) -> str | None:
    """The provider's name in LiteLLM's price file: from the preset it was made from, else
    from a hosted preset with the same host (self-hosted servers have no fixed host)."""
    preset = PROVIDER_PRESETS.get(provider_preset)
    if preset is not None:
        return preset["litellm_provider"]
    host = (urlsplit(base_url).hostname or "").lower()
    for candidate in PROVIDER_PRESETS.values():
        candidate_host = urlsplit(candidate["base_url"]).hostname or ""
        if candidate_host in ("localhost", "") or "RESOURCE" in candidate["base_url"]:
            continue
        if host == candidate_host:
            return candidate["litellm_provider"]
    if host.endswith(".openai.azure.com"):
        return "azure"
    return None
