"""Figures derived after a stream has ended (never in the timed loop): which tokens speed
counts, hidden reasoning, and numbers read from headers, each made safe to store.

Speed counts only tokens streamed inside its window (PRODUCT.md: tokens billed but never
streamed are not in it). Three ways to know how many streamed, recorded in tps_token_source:
- "usage": the provider's output count, when everything it bills was streamed;
- "usage-minus-hidden-reasoning": OpenAI reasoning models bill their reasoning in
  completion_tokens and report it in completion_tokens_details.reasoning_tokens, but never
  stream it; what streamed is the difference. (Counting 2,000 hidden tokens as speed turned
  ~99 tok/s into ~2,100.)
- "tokenizer": the streamed text counted with o200k, when the billed count exceeds what
  streamed by more than tokenizers differ (SUMMARY_RATIO): Claude 4 streams a summary of its
  thinking but bills all of it, OpenRouter may stream a summary of an OpenAI model's reasoning.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx2

from probes.formats import MAX_COUNT, Usage
from probes.model import SOURCE_TOKENIZER, SOURCE_USAGE, SOURCE_USAGE_MINUS_HIDDEN
from probes.tokenizer import count_tokens

# Billed/streamed above this means part of what was billed did not stream. o200k and the
# providers' own tokenizers differ by well under this on text (Claude's counts ~10-30% more);
# a summary of thinking is typically several times shorter than the thinking.
SUMMARY_RATIO = 1.5
# Slack for short texts, where one or two tokens of difference are a large ratio.
SUMMARY_SLACK_TOKENS = 8
# A retry-after longer than a week says "not soon"; beyond it the figure is clamped.
MAX_RETRY_AFTER_S = 7 * 24 * 3600.0


@dataclass
class Speed:
    streamed_tokens: int | None = None  # the tokens in speed's window
    source: str = ""
    reasoning_tokens: int | None = None  # reported, or derived where the provider bills it
    hidden_reasoning_tokens: int | None = None  # billed, never streamed


def speed_tokens(
    usage_output: int | None,
    usage: Usage | None,
    reasoning_text: Sequence[str],
    answer_text: str,
    thinking_requested: bool,
) -> Speed:
    """How many tokens streamed, and how that was counted. `usage_output` is the provider's
    output count (None when it sent none or the stream did not complete)."""
    reported = usage.reasoning_tokens if usage is not None else None
    if usage_output is None:
        reasoning = count_tokens("".join(reasoning_text)) if reasoning_text else 0
        streamed = reasoning + count_tokens(answer_text)
        hidden = None if reported is None else max(0, reported - reasoning)
        return Speed(
            streamed,
            SOURCE_TOKENIZER,
            reported if reported is not None else reasoning or None,
            hidden,
        )
    if reasoning_text:
        # Reasoning streamed: all of it, or a summary of what was billed?
        streamed_reasoning = count_tokens("".join(reasoning_text))
        answer = count_tokens(answer_text)
        billed_reasoning = reported if reported is not None else max(0, usage_output - answer)
        if billed_reasoning > SUMMARY_RATIO * streamed_reasoning + SUMMARY_SLACK_TOKENS:
            return Speed(
                streamed_reasoning + answer,
                SOURCE_TOKENIZER,
                billed_reasoning,
                billed_reasoning - streamed_reasoning,
            )
        return Speed(usage_output, SOURCE_USAGE, billed_reasoning, 0)
    if reported:
        # Reasoning billed and reported, none streamed: OpenAI's hidden reasoning.
        if reported < usage_output:
            return Speed(usage_output - reported, SOURCE_USAGE_MINUS_HIDDEN, reported, reported)
        # More reasoning than output is not a real report: count what streamed instead.
        return Speed(count_tokens(answer_text), SOURCE_TOKENIZER, reported, None)
    if thinking_requested:
        # Thinking asked for, none streamed and none reported (Anthropic's redacted or
        # omitted thinking): what was billed beyond the streamed answer was hidden thinking.
        answer = count_tokens(answer_text)
        if usage_output > SUMMARY_RATIO * answer + SUMMARY_SLACK_TOKENS:
            hidden = usage_output - answer
            return Speed(answer, SOURCE_TOKENIZER, hidden, hidden)
        return Speed(usage_output, SOURCE_USAGE, reported, 0 if reported == 0 else None)
    return Speed(usage_output, SOURCE_USAGE, reported, 0 if reported == 0 else None)


def chunk_speed(
    answer_tokens: int | None,
    first_chunk_tokens: int | None,
    answer_text: str,
    first_chunk_text: str,
    first_at: float | None,
    last_at: float | None,
) -> float | None:
    """Speed where a chunk carries many tokens (Gemini): the answer's tokens after its first
    chunk, over the time from that chunk to the last. (n - 1) / window would count a whole
    chunk of tokens as if it had taken no time. Counts come from usage (the answer's own count,
    cumulative at the first chunk) when both are reported, else from the tokenizer."""
    if first_at is None or last_at is None or last_at <= first_at:
        return None
    if answer_tokens is None or first_chunk_tokens is None:
        answer_tokens, first_chunk_tokens = (
            count_tokens(answer_text),
            count_tokens(first_chunk_text),
        )
    after_first = answer_tokens - first_chunk_tokens
    return after_first / (last_at - first_at) if after_first > 0 else None


def processing_ms(headers: httpx2.Headers) -> float | None:
    """The provider's processing time from a header (openai-processing-ms), in ms; null when
    absent or not a finite, non-negative number. On a stream it reaches up to the headers."""
    value = headers.get("openai-processing-ms")
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def header_count(headers: httpx2.Headers, *names: str) -> int | None:
    """A count from the first of these headers present (rate-limit headroom). Clamped, not
    nulled, when above 2**31-1 or infinite: "inf" or a huge number means "more than we can
    store", which is true of 2**31-1 too. Null when it is not a number (NaN included) or
    negative: no count is. Fractions are floored."""
    for name in names:
        value = headers.get(name)
        if value is None:
            continue
        try:
            number = float(value.strip())
        except ValueError:
            return None
        if math.isnan(number) or number < 0:
            return None
        return MAX_COUNT if number >= MAX_COUNT else int(number)
    return None


def retry_after_s(headers: httpx2.Headers) -> float | None:
    """retry-after as seconds: a number, or an HTTP date (RFC 9110) counted from now; OpenAI's
    and Azure's retry-after-ms when there is no retry-after. Clamped to a week when longer or
    infinite; a date in the past is 0; null when it is not a time (NaN, negative, garbage)."""
    value = headers.get("retry-after")
    scale = 1.0
    if value is None:
        value, scale = headers.get("retry-after-ms"), 0.001
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value) * scale
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = max(0.0, when.timestamp() - time.time())
    if math.isnan(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER_S)
