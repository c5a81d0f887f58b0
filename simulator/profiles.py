"""Model profiles: how one kind of real model reads a request, in a registry by name.

A profile checks the request's model parameters the way its real API does (refusing what that
API refuses, with its error) and decides the response's shape: the token limit, how much
reasoning, how much of it is streamed, the service tier's queueing, and what the stream sends
while the request waits. The wire format (simulator/wire.py) renders the result.

Sources for every behaviour are in simulator/README.md ("Profiles", "Sources").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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
    options: dict[str, Any] = field(default_factory=dict)  # rendering options (StreamContext)


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


def _effort_tokens(profile: Profile, effort: str, name: str) -> int:
    if effort not in REASONING_EFFORT:
        raise HttpError(
            400,
            f"Unsupported value: '{name}' does not support {json.dumps(effort)} with this "
            "model. Supported values are: 'minimal', 'low', 'medium', and 'high'.",
            param=name,
            code="unsupported_value",
        )
    return round(profile.reasoning_tokens * REASONING_EFFORT[effort])


class OpenAIResponses(ModelProfile):
    """OpenAI Responses: `max_output_tokens` (at least 16) bounds reasoning and answer;
    unknown parameters (`max_tokens`, `messages`) are refused; reasoning is hidden unless
    `reasoning.summary` asks for a summary (streamed as reasoning_summary_text deltas, a
    thinking_summary_ratio share of the billed reasoning); `stream_options.include_obfuscation`
    (default true) pads every delta."""

    name = "openai-responses"
    MIN_OUTPUT_TOKENS = 16

    def read(self, body: dict[str, Any], profile: Profile) -> ShapedRequest:
        for unknown in ("max_tokens", "max_completion_tokens", "messages", "reasoning_effort"):
            if unknown in body:
                raise HttpError(
                    400,
                    f"Unknown parameter: '{unknown}'.",
                    param=unknown,
                    code="unknown_parameter",
                )
        thinks = profile.reasoning_tokens > 0
        reasoning = body.get("reasoning") or {}
        if not isinstance(reasoning, dict):
            raise HttpError(400, "Invalid type for 'reasoning': expected an object.")
        if reasoning and not thinks:
            raise HttpError(
                400,
                "Unsupported parameter: 'reasoning.effort' is not supported with this model.",
                param="reasoning.effort",
                code="unsupported_parameter",
            )
        temperature = body.get("temperature")
        if thinks and temperature is not None and temperature != 1:
            raise HttpError(
                400,
                "Unsupported parameter: 'temperature' is not supported with this model.",
                param="temperature",
                code="unsupported_parameter",
            )
        limit = OPENAI_REASONING_MAX_TOKENS
        if body.get("max_output_tokens") is not None:
            limit = _int(body["max_output_tokens"], "max_output_tokens")
            if limit < self.MIN_OUTPUT_TOKENS:
                raise HttpError(
                    400,
                    "Invalid 'max_output_tokens': integer below minimum value. Expected a value "
                    f">= {self.MIN_OUTPUT_TOKENS}, but got {limit} instead.",
                    param="max_output_tokens",
                    code="integer_below_min_value",
                )
        tier = body.get("service_tier") or "auto"
        if tier not in SERVICE_TIERS:
            raise HttpError(
                400,
                f"Invalid value: {json.dumps(tier)}. Supported values are: 'auto', 'default', "
                "'flex', 'scale', and 'priority'.",
                param="service_tier",
                code="invalid_value",
            )
        queue_factor, rate_factor, served_tier = SERVICE_TIERS[tier]
        tokens = _effort_tokens(profile, reasoning.get("effort") or "medium", "reasoning.effort")
        options = body.get("stream_options") or {}
        shape = Shape(
            max_tokens=limit,
            reasoning_tokens=tokens if thinks else 0,
            reasoning_in_max=True,
            answer_room=0,
            shown_ratio=profile.thinking_summary_ratio if reasoning.get("summary") else 0.0,
            queue_factor=queue_factor,
            rate_factor=rate_factor,
            service_tier=served_tier,
        )
        obfuscate = not (isinstance(options, dict) and options.get("include_obfuscation") is False)
        # `store` defaults to true: the response is kept (and says so) unless told not to.
        store = body.get("store", True)
        if not isinstance(store, bool):
            raise HttpError(
                400,
                "Invalid type for 'store': expected a boolean, but got "
                f"{_json_type(store)} instead.",
                param="store",
                code="invalid_type",
            )
        return ShapedRequest(shape, options={"obfuscation": obfuscate, "store": store})


def _json_type(value: Any) -> str:
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"


class Gemini(ModelProfile):
    """Gemini native: `generationConfig.maxOutputTokens` bounds thinking and answer;
    `thinkingConfig` takes `thinkingBudget` (0 turns thinking off, -1 lets the model choose)
    or `thinkingLevel` ("low", "high"), never both; thoughts are billed in thoughtsTokenCount
    and streamed as `thought: true` parts (a thinking_summary_ratio share) only with
    `includeThoughts`."""

    name = "gemini"
    LEVELS: ClassVar[dict[str, float]] = {"minimal": 0.05, "low": 0.4, "medium": 1.0, "high": 1.0}

    def read(self, body: dict[str, Any], profile: Profile) -> ShapedRequest:
        config = body.get("generationConfig") or {}
        if not isinstance(config, dict):
            raise _gemini_invalid("Invalid value at 'generation_config'")
        limit = 65_536
        if config.get("maxOutputTokens") is not None:
            limit = _int(config["maxOutputTokens"], "generationConfig.maxOutputTokens")
            if limit < 1:
                raise _gemini_invalid("max_output_tokens must be positive.")
        thinking = config.get("thinkingConfig") or {}
        if not isinstance(thinking, dict):
            raise _gemini_invalid("Invalid value at 'generation_config.thinking_config'")
        budget, level = thinking.get("thinkingBudget"), thinking.get("thinkingLevel")
        if budget is not None and level is not None:
            raise _gemini_invalid(
                "You can only set either thinking budget or thinking level, not both."
            )
        tokens = profile.reasoning_tokens
        if budget is not None:
            budget = _int(budget, "thinkingConfig.thinkingBudget")
            if budget != -1:
                tokens = min(tokens, max(0, budget))
        elif level is not None:
            # The enum's name: the SDKs send "LOW", the documentation's examples "low".
            if not isinstance(level, str) or level.lower() not in self.LEVELS:
                raise _gemini_invalid(f"Invalid value at 'thinking_level' ({json.dumps(level)})")
            tokens = round(tokens * self.LEVELS[level.lower()])
        if (budget or level) and profile.reasoning_tokens == 0 and budget != -1:
            raise _gemini_invalid("Thinking is not supported by this model.")
        shown = profile.thinking_summary_ratio if thinking.get("includeThoughts") else 0.0
        shape = Shape(
            max_tokens=limit,
            reasoning_tokens=tokens,
            reasoning_in_max=True,
            answer_room=0,
            shown_ratio=shown,
        )
        return ShapedRequest(shape, options={"chunk_tokens": profile.chunk_tokens})


def _gemini_invalid(message: str) -> HttpError:
    return HttpError(
        400,
        message,
        body={"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}},
    )


# Bedrock's latency-optimized inference: (queue delay factor, decode rate factor).
BEDROCK_LATENCY = {"standard": (1.0, 1.0), "optimized": (0.5, 1.6)}


class Bedrock(ModelProfile):
    """Bedrock Converse: `inferenceConfig.maxTokens`; Claude's extended thinking through
    `additionalModelRequestFields.thinking` (as Anthropic's: 1024 <= budget < maxTokens);
    `performanceConfig.latency` "optimized" (faster, where offered) or "standard";
    `serviceTier.type` priority, default or flex; echoed in the metadata event."""

    name = "bedrock"

    def read(self, body: dict[str, Any], profile: Profile) -> ShapedRequest:
        inference = body.get("inferenceConfig") or {}
        if not isinstance(inference, dict):
            raise _bedrock_invalid("inferenceConfig must be an object")
        limit = 4096
        if inference.get("maxTokens") is not None:
            limit = _int(inference["maxTokens"], "inferenceConfig.maxTokens")
            if limit < 1:
                raise _bedrock_invalid(
                    "1 validation error detected: Value at 'inferenceConfig.maxTokens' failed "
                    "to satisfy constraint: Member must have value greater than or equal to 1"
                )
        extra = body.get("additionalModelRequestFields") or {}
        thinking = extra.get("thinking") if isinstance(extra, dict) else None
        budget = 0
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            budget = _int(thinking.get("budget_tokens"), "thinking.budget_tokens")
            if budget < THINKING_MIN_BUDGET or budget >= limit or not profile.reasoning_tokens:
                raise _bedrock_invalid(
                    "The model returned the following errors: thinking.budget_tokens must be "
                    f">= {THINKING_MIN_BUDGET} and less than max_tokens"
                )
        latency = (body.get("performanceConfig") or {}).get("latency", "standard")
        if latency not in BEDROCK_LATENCY:
            raise _bedrock_invalid(f"performanceConfig.latency: unknown value {latency!r}")
        tier = (body.get("serviceTier") or {}).get("type", "default")
        if tier not in ("priority", "default", "flex"):
            raise _bedrock_invalid(f"serviceTier.type: unknown value {tier!r}")
        queue_factor, rate_factor = BEDROCK_LATENCY[latency]
        tier_queue, tier_rate, _ = SERVICE_TIERS[tier]
        shape = Shape(
            max_tokens=limit,
            reasoning_tokens=min(profile.reasoning_tokens, budget),
            reasoning_in_max=True,
            answer_room=0,
            shown_ratio=profile.thinking_summary_ratio,
            queue_factor=queue_factor * tier_queue,
            rate_factor=rate_factor * tier_rate,
            service_tier=tier,
        )
        return ShapedRequest(shape, thinking=budget > 0, options={"latency": latency})


def _bedrock_invalid(message: str) -> HttpError:
    return HttpError(400, message, code="ValidationException")


PROFILES: dict[str, ModelProfile] = {
    p.name: p
    for p in (
        OpenAICompatible(),
        OpenAIReasoning(),
        DeepSeekReasoning(),
        OpenRouterReasoning(),
        Anthropic(),
        OpenAIResponses(),
        Gemini(),
        Bedrock(),
    )
}
