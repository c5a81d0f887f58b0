"""Prompts of a target size, with a stable or a fresh prefix.

Stable: the same padding text every time, so a provider's prompt cache can hit.
Fresh: a unique line at the very start, so no prefix cache can match anything.
The padding goes before the question (as documents do in real prompts). Sizes are counted with
o200k_base; other tokenizers differ a little, which is why results store the provider's count.
"""

from __future__ import annotations

import uuid
from functools import cache

from probes.tokenizer import count_tokens, encoding

_PARAGRAPH = (
    "Routewatch measures inference routes the way an application experiences them. "
    "Each probe records when the request left, when the headers came back, when the first "
    "token arrived and when the stream ended, so that time to first token, generation speed "
    "and end-to-end latency can be compared across providers, models and regions. "
)


@cache
def _padding_tokens() -> list[int]:
    return encoding().encode(_PARAGRAPH * 400)


def padding(tokens: int) -> str:
    if tokens <= 0:
        return ""
    source = _padding_tokens()
    while len(source) < tokens:
        source = source + source
    return encoding().decode(source[:tokens])


def build(system: str, user: str, target_tokens: int, fresh: bool) -> tuple[str, str]:
    """(system, user) whose total is about target_tokens (never less than the question)."""
    prefix = f"Request {uuid.uuid4().hex}.\n" if fresh else ""
    if target_tokens <= 0:
        return (prefix + system, user) if system else ("", prefix + user)
    used = count_tokens(prefix + system + user) + 8  # message framing
    pad = padding(max(0, target_tokens - used))
    document = f"{pad}\n\n" if pad else ""
    if system:
        return prefix + system, document + user
    return "", prefix + document + user
