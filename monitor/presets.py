"""Presets for the common providers and kinds of route, offered in the admin.

A preset fills in fields the admin would otherwise look up in each provider's documentation;
every value stays editable afterwards. Provider base URLs are the providers' documented API
roots; the route presets follow each API's documented parameters (OpenAI reasoning models
refuse `max_tokens` and any non-default `temperature`; Anthropic thinking needs a budget of at
least 1024 tokens)."""

from __future__ import annotations

from typing import Any, TypedDict


class ProviderPreset(TypedDict):
    label: str
    base_url: str
    wire_format: str
    http2: bool


class RoutePreset(TypedDict):
    label: str
    settings: dict[str, Any]


PROVIDER_PRESETS: dict[str, ProviderPreset] = {
    "openai": {
        "label": "OpenAI",
        "base_url": "https://api.openai.com/v1",
        "wire_format": "openai",
        "http2": True,
    },
    "anthropic": {
        "label": "Anthropic",
        "base_url": "https://api.anthropic.com",
        "wire_format": "anthropic",
        "http2": True,
    },
    "azure": {
        "label": "Azure OpenAI (replace RESOURCE and DEPLOYMENT)",
        "base_url": "https://RESOURCE.openai.azure.com/openai/deployments/DEPLOYMENT",
        "wire_format": "azure",
        "http2": True,
    },
    "openrouter": {
        "label": "OpenRouter",
        "base_url": "https://openrouter.ai/api/v1",
        "wire_format": "openai",
        "http2": True,
    },
    "groq": {
        "label": "Groq",
        "base_url": "https://api.groq.com/openai/v1",
        "wire_format": "openai",
        "http2": True,
    },
    "cerebras": {
        "label": "Cerebras",
        "base_url": "https://api.cerebras.ai/v1",
        "wire_format": "openai",
        "http2": True,
    },
    "deepseek": {
        "label": "DeepSeek",
        "base_url": "https://api.deepseek.com/v1",
        "wire_format": "openai",
        "http2": True,
    },
    "together": {
        "label": "Together AI",
        "base_url": "https://api.together.xyz/v1",
        "wire_format": "openai",
        "http2": True,
    },
    "fireworks": {
        "label": "Fireworks AI",
        "base_url": "https://api.fireworks.ai/inference/v1",
        "wire_format": "openai",
        "http2": True,
    },
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
}


def provider_choices() -> list[tuple[str, str]]:
    return [("", "none: fill in by hand")] + [(k, p["label"]) for k, p in PROVIDER_PRESETS.items()]


def route_choices() -> list[tuple[str, str]]:
    return [("", "none: keep the settings below")] + [
        (k, p["label"]) for k, p in ROUTE_PRESETS.items()
    ]
