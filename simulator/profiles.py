"""Model profiles: how one kind of real model reads a request, in a registry by name.

A profile checks the request's model parameters the way its real API does (refusing what that
API refuses, with its error) and decides the response's shape: the token limit, how much
reasoning, how much of it is streamed, the service tier's queueing, and what the stream sends
while the request waits. The wire format (simulator/wire.py) renders the result.

Sources for every behaviour are in simulator/README.md ("Profiles", "Sources").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from simulator.config import Profile
from simulator.generation import Shape
from simulator.wire import HttpError, Waiting

# The OpenAI reasoning models' default output ceiling, when the request sets none.
OPENAI_REASONING_MAX_TOKENS = 100_000
# Hidden reasoning tokens per effort, as a multiple of the profile's reasoning_tokens (medium).
REASONING_EFFORT = {"minimal": 0.05, "low": 0.4, "medium": 1.0, "high": 2.5}
# Service tiers: (queue delay factor, decode rate factor, tier reported back).
SERVICE_TIERS = {
    "auto": (1.0, 1.0, "default"),
    "default": (1.0, 1.0, "default"),
    "scale": (1.0, 1.0, "default"),
    "priority": (0.25, 1.5, "priority"),
    "flex": (4.0, 0.75, "flex"),
}
THINKING_MIN_BUDGET = 1024
EXTENDED_THINKING_DOCS = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"


@dataclass(slots=True)
class ShapedRequest:
    """What a profile made of a request: its shape, and how the stream renders it."""

    shape: Shape
    reasoning_key: str = "reasoning_content"  # the delta field visible reasoning goes in
    waiting: Waiting | None = None
    thinking: bool = False  # Anthropic: thinking blocks (only when asked for)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise HttpError(400, f"Invalid type for '{name}': expected an integer.", param=name)
    return int(value)


class ModelProfile:
    name: ClassVar[str]

    def read(self, body: dict[str, Any], profile: Profile) -> ShapedRequest:
        raise NotImplementedError


class OpenAICompatible(ModelProfile):
    """A generic OpenAI-compatible server (vLLM, llama.cpp...): takes max_tokens or
    max_completion_tokens, streams reasoning (if any) as `reasoning_content` deltas."""

    name = "openai-compatible"
    reasoning_key = "reasoning_content"

    def read(self, body: dict[str, Any], profile: Profile) -> ShapedRequest:
        raw = body.get("max_tokens") or body.get("max_completion_tokens")
        max_tokens = 4096 if raw is None else _int(raw, "max_tokens")
        if max_tokens < 1:
            raise HttpError(400, "max_tokens must be at least 1.", param="max_tokens")
        shape = Shape(
            max_tokens=max_tokens,
            reasoning_tokens=profile.reasoning_tokens,
            reasoning_in_max=profile.max_tokens_includes_reasoning,
        )
        return ShapedRequest(shape, self.reasoning_key, self._waiting(profile))

    def _waiting(self, profile: Profile) -> Waiting | None:
        return None


class DeepSeekReasoning(OpenAICompatible):
    """DeepSeek's API: `reasoning_content` deltas; `: keep-alive` comments while queued."""

    name = "deepseek-reasoning"

    def _waiting(self, profile: Profile) -> Waiting | None:
        return Waiting(b": keep-alive\n\n", profile.keepalive_interval_ms / 1000, False)


class OpenRouterReasoning(OpenAICompatible):
    """OpenRouter: `reasoning` deltas; `: OPENROUTER PROCESSING` comments until the first
    token (it waits on the upstream provider)."""

    name = "openrouter-reasoning"
    reasoning_key = "reasoning"

    def _waiting(self, profile: Profile) -> Waiting | None:
        return Waiting(b": OPENROUTER PROCESSING\n\n", profile.keepalive_interval_ms / 1000, True)


class OpenAIReasoning(ModelProfile):
    """OpenAI o-series / GPT-5 in Chat Completions: reasoning is hidden (billed in
    completion_tokens and completion_tokens_details.reasoning_tokens, never streamed);
    max_tokens and non-default temperature are refused; max_completion_tokens bounds reasoning
    and answer together; reasoning_effort sets how much it reasons; service_tier its queue."""

    name = "openai-reasoning"

    def read(self, body: dict[str, Any], profile: Profile) -> ShapedRequest:
        if body.get("max_tokens") is not None:
            raise HttpError(
                400,
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                param="max_tokens",
                code="unsupported_parameter",
            )
        temperature = body.get("temperature")
        if temperature is not None and temperature != 1:
            raise HttpError(
                400,
                f"Unsupported value: 'temperature' does not support {json.dumps(temperature)} "
                "with this model. Only the default (1) value is supported.",
                param="temperature",
                code="unsupported_value",
            )
        effort = body.get("reasoning_effort")
        if effort is None:
            effort = "medium"
        if effort not in REASONING_EFFORT:
            raise HttpError(
                400,
                f"Unsupported value: 'reasoning_effort' does not support {json.dumps(effort)} "
                "with this model. Supported values are: 'minimal', 'low', 'medium', and 'high'.",
                param="reasoning_effort",
                code="unsupported_value",
            )
        tier = body.get("service_tier")
        if tier is None:
            tier = "auto"
        if tier not in SERVICE_TIERS:
            raise HttpError(
                400,
                f"Invalid value: {json.dumps(tier)}. Supported values are: 'auto', 'default', "
                "'flex', 'scale', and 'priority'.",
                param="service_tier",
                code="invalid_value",
            )
        raw = body.get("max_completion_tokens")
        limit = OPENAI_REASONING_MAX_TOKENS
        if raw is not None:
            limit = _int(raw, "max_completion_tokens")
            if limit < 1:
                raise HttpError(
                    400,
                    f"Invalid 'max_completion_tokens': integer below minimum value. Expected a "
                    f"value >= 1, but got {limit} instead.",
                    param="max_completion_tokens",
                    code="integer_below_min_value",
                )
        queue_factor, rate_factor, served_tier = SERVICE_TIERS[tier]
        shape = Shape(
            max_tokens=limit,
            reasoning_tokens=round(profile.reasoning_tokens * REASONING_EFFORT[effort]),
            reasoning_in_max=True,
            answer_room=0,  # reasoning can use the whole budget: an empty answer, "length"
            shown_ratio=0.0,
            queue_factor=queue_factor,
            rate_factor=rate_factor,
            service_tier=served_tier,
        )
        return ShapedRequest(shape)


class Anthropic(ModelProfile):
    """Anthropic Messages: max_tokens required; extended thinking only when `thinking` is
    enabled with 1024 <= budget_tokens < max_tokens; the streamed thinking may be a summary of
    the billed thinking tokens (thinking_summary_ratio)."""

    name = "anthropic"

    def read(self, body: dict[str, Any], profile: Profile) -> ShapedRequest:
        if "max_completion_tokens" in body:
            raise HttpError(400, "max_completion_tokens: Extra inputs are not permitted")
        if body.get("max_tokens") is None:
            raise HttpError(400, "max_tokens: Field required")
        max_tokens = _int(body["max_tokens"], "max_tokens")
        if max_tokens < 1:
            raise HttpError(400, "max_tokens: Input should be greater than or equal to 1")
        thinking = body.get("thinking")
        budget = 0
        if thinking is not None:
            kind = thinking.get("type") if isinstance(thinking, dict) else None
            if kind not in ("enabled", "disabled"):
                raise HttpError(
                    400,
                    "thinking: Input tag does not match any of the expected tags: "
                    "'enabled', 'disabled'",
                )
            if kind == "enabled":
                assert isinstance(thinking, dict)
                if "budget_tokens" not in thinking:
                    raise HttpError(400, "thinking.enabled.budget_tokens: Field required")
                budget = _int(thinking["budget_tokens"], "thinking.enabled.budget_tokens")
                if budget < THINKING_MIN_BUDGET:
                    raise HttpError(
                        400,
                        "thinking.enabled.budget_tokens: Input should be greater than or "
                        f"equal to {THINKING_MIN_BUDGET}",
                    )
                if max_tokens <= budget:
                    raise HttpError(
                        400,
                        "`max_tokens` must be greater than `thinking.budget_tokens`. Please "
                        "consult our documentation at "
                        f"{EXTENDED_THINKING_DOCS}#max-tokens-and-context-window-size",
                    )
                temperature = body.get("temperature")
                if temperature is not None and temperature != 1:
                    raise HttpError(
                        400,
                        "`temperature` may only be set to 1 when thinking is enabled. Please "
                        f"consult our documentation at {EXTENDED_THINKING_DOCS}"
                        "#feature-compatibility",
                    )
                if profile.reasoning_tokens == 0:
                    raise HttpError(
                        400, f"The model `{profile.id}` does not support extended thinking."
                    )
        shape = Shape(
            max_tokens=max_tokens,
            reasoning_tokens=min(profile.reasoning_tokens, budget),
            reasoning_in_max=True,
            answer_room=0,
            shown_ratio=profile.thinking_summary_ratio,
        )
        return ShapedRequest(shape, thinking=budget > 0)


PROFILES: dict[str, ModelProfile] = {
    p.name: p
    for p in (
        OpenAICompatible(),
        OpenAIReasoning(),
        DeepSeekReasoning(),
        OpenRouterReasoning(),
        Anthropic(),
    )
}
