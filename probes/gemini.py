"""Gemini's native API (`POST {base}/models/{model}:streamGenerateContent?alt=sse`).

What the format relies on, from Google's Gemini API reference (`models.streamGenerateContent`,
`GenerateContentResponse`, `UsageMetadata`, "Thinking"):
- The key goes in `x-goog-api-key`. The base is `https://generativelanguage.googleapis.com/v1beta`.
- With `alt=sse` each `data:` line is one whole GenerateContentResponse; there are no event
  names and no `[DONE]`. The last chunk carries `candidates[].finishReason`; the connection
  then closes.
- A part with `"thought": true` is a thought summary (sent only with
  `thinkingConfig.includeThoughts`); every other text part is the answer.
- `thinkingConfig` takes a thinking budget (`thinkingBudget`, Gemini 2.5) or a thinking level
  (`thinkingLevel`, Gemini 3), never both: the API refuses the pair with 400.
- `usageMetadata` rides on every chunk on newer models and is cumulative: the last one is the
  response's, and summing them would count tokens many times. Its fields are proto3 JSON, so a
  count of 0 is left out: `promptTokenCount` (cached tokens included),
  `cachedContentTokenCount`, `candidatesTokenCount` (the answer), `thoughtsTokenCount` (all
  thinking, billed as output, whether summarized or hidden).
- A chunk carries many tokens: speed is the answer's tokens after its first chunk over the time
  from that chunk to the last (figures.chunk_speed).
- `promptFeedback.blockReason` means the prompt was blocked and nothing will be generated; a
  `finishReason` of SAFETY, BLOCKLIST, PROHIBITED_CONTENT or SPII means the answer was. Either
  is about our prompt (config). An error mid-stream arrives as `{"error": {"code", "message",
  "status"}}`, its code an HTTP status: 429 (RESOURCE_EXHAUSTED) is a rate limit, any other a
  stream error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from probes.errors import InvalidSpec, Kind, MalformedStream
from probes.model import MAX_TOKENS, ProbeSpec
from probes.prompts import Prompt
from probes.sse import Event
from probes.wire import (
    ANSWER,
    ERROR,
    FINISH,
    REASONING,
    TOOL,
    USAGE,
    Piece,
    Served,
    Usage,
    WireFormat,
    _label,
    count,
)

PROTECTED = frozenset({"contents", "systemInstruction"})
BLOCKED_FINISH = frozenset({"SAFETY", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"})


class GeminiNative(WireFormat):
    name = "gemini"
    label = "Gemini native (streamGenerateContent, x-goog-api-key)"
    path = ":streamGenerateContent?alt=sse"
    multi_token_chunks = True

    def url(self, spec: ProbeSpec) -> str:
        model = spec.model.removeprefix("models/")
        return f"{spec.base_url.rstrip('/')}/models/{quote(model, safe='')}{self.path}"

    def headers(self, spec: ProbeSpec) -> dict[str, str]:
        return {"x-goog-api-key": spec.api_key} if spec.api_key else {}

    def body(self, spec: ProbeSpec, prompt: Prompt, stream_options: bool) -> dict[str, Any]:
        if spec.token_limit_param != MAX_TOKENS:
            raise InvalidSpec("Gemini takes its output cap as generationConfig.maxOutputTokens")
        if spec.service_tier:
            raise InvalidSpec("Gemini's API takes no service_tier")
        config: dict[str, Any] = {"maxOutputTokens": spec.max_tokens}
        if spec.temperature is not None:
            config["temperature"] = spec.temperature
        if spec.thinking_budget_tokens is not None and spec.reasoning_effort:
            raise InvalidSpec(
                "Gemini takes a thinking budget (thinking_budget_tokens) or a thinking level "
                "(reasoning_effort), never both"
            )
        if spec.thinking_budget_tokens is not None:
            config["thinkingConfig"] = {
                "thinkingBudget": spec.thinking_budget_tokens,
                "includeThoughts": True,
            }
        elif spec.reasoning_effort:
            config["thinkingConfig"] = {
                "thinkingLevel": spec.reasoning_effort,
                "includeThoughts": True,
            }
        extra = dict(spec.extra_body)
        more = extra.pop("generationConfig", None)
        if isinstance(more, dict):  # merged key by key: the probe's own keys stay
            config = {**more, **config}
        body: dict[str, Any] = {}
        if prompt.system:
            body["systemInstruction"] = {"parts": [{"text": prompt.head + prompt.system}]}
            user = prompt.document + prompt.question
        else:
            user = prompt.head + prompt.document + prompt.question
        body["contents"] = [{"role": "user", "parts": [{"text": user}]}]
        body["generationConfig"] = config
        clash = sorted(PROTECTED & set(extra))
        if clash:
            raise InvalidSpec(f"extra_body may not set {', '.join(clash)}: the probe sets them")
        body.update(extra)
        return body

    def parse(self, event: Event) -> list[Piece]:
        data = self._json(event.data)
        err = data.get("error")
        if err is not None:
            return [_error(err)]
        pieces: list[Piece] = []
        feedback = data.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):
            reason = _label(feedback["blockReason"], 40)
            return [
                Piece(
                    ERROR,
                    f"the provider blocked the prompt (blockReason {reason}): the task's "
                    "prompt, not the route",
                    error_kind=Kind.CONFIG,
                )
            ]
        candidates = data.get("candidates") or []
        if not isinstance(candidates, list):
            raise MalformedStream("candidates is not a list")
        finish = ""
        for candidate in candidates:
            if not isinstance(candidate, dict):
                raise MalformedStream("a candidate is not an object")
            content = candidate.get("content") or {}
            parts = (content.get("parts") or []) if isinstance(content, dict) else None
            if not isinstance(parts, list):
                raise MalformedStream("content.parts is not a list")
            for part in parts:
                if not isinstance(part, dict):
                    raise MalformedStream("a part is not an object")
                text = part.get("text")
                if isinstance(text, str) and text:
                    pieces.append(Piece(REASONING if part.get("thought") else ANSWER, text))
                elif part.get("functionCall"):
                    pieces.append(Piece(TOOL, str(part["functionCall"])))
            finish = finish or _label(candidate.get("finishReason"), 40)
        usage = data.get("usageMetadata")
        if isinstance(usage, dict):
            pieces.append(Piece(USAGE, usage=usage, meta=data))
        if finish in BLOCKED_FINISH:
            pieces.append(
                Piece(
                    ERROR,
                    f"the provider stopped the answer (finishReason {finish}): the task's "
                    "prompt, not the route",
                    error_kind=Kind.CONFIG,
                )
            )
        elif finish and finish != "FINISH_REASON_UNSPECIFIED":
            pieces.append(Piece(FINISH, finish, meta=data))
        return pieces

    def usage(self, raw: dict[str, Any]) -> Usage:
        prompt = count(raw.get("promptTokenCount"))
        answer = count(raw.get("candidatesTokenCount")) or 0
        thoughts = count(raw.get("thoughtsTokenCount"))
        cached = count(raw.get("cachedContentTokenCount"))
        if cached is None and prompt is not None:
            cached = 0  # proto3 JSON leaves a 0 out: reported, and none was cached
        return Usage(
            input_tokens=prompt,
            cached_tokens=cached,
            output_tokens=count(answer + (thoughts or 0)),
            reasoning_tokens=thoughts,
            answer_tokens=answer,
        )

    def served(self, metas: Sequence[Mapping[str, Any]]) -> Served:
        served = Served()
        for meta in metas:
            served.model = served.model or _label(meta.get("modelVersion"), 200)
            served.response_id = served.response_id or _label(meta.get("responseId"), 100)
        return served


def _error(err: Any) -> Piece:
    if not isinstance(err, dict):
        return Piece(ERROR, str(err))
    code = err.get("code")
    status = _label(err.get("status"), 40)
    message = _label(err.get("message"), 300) or "the provider sent an error"
    # A rate limit is one wherever it arrives; any other error after the stream began is
    # stream_error, whatever HTTP status it names.
    kind = Kind.HTTP_429 if code == 429 or status == "RESOURCE_EXHAUSTED" else Kind.STREAM_ERROR
    return Piece(ERROR, f"{message} ({status or code})", error_kind=kind)
