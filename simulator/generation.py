"""What a simulated model says and when: token texts, timings, prompt cache, rate limits.

Every generated token is exactly one o200k_base token, so a client that counts the streamed
text with o200k_base gets the count the simulator reports in `usage`.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from functools import cache

from probes.tokenizer import encoding
from simulator import tasks
from simulator.config import Profile

# Very common short English words: each is one token, with its leading space, in every GPT
# BPE (r50k, cl100k, o200k). tests/simulator/test_tokens.py checks them against o200k_base.
WORDS = (
    "the", "model", "route", "speed", "token", "answer", "time", "stream", "region", "cache",
    "prompt", "fast", "slow", "value", "result", "first", "number", "reason", "check", "step",
    "think", "because", "then", "so", "we", "can", "see", "that", "this", "is", "a", "good",
    "way", "to", "find", "it", "and", "more", "data", "test", "code", "run", "call", "work",
    "make", "use", "new", "one", "two", "three", "four", "five", "when", "where", "which",
    "what", "how", "of", "in", "for", "on", "with", "as", "at", "by", "from", "or", "not",
    "all", "but", "have", "will", "each", "some", "other", "into", "only", "also", "after",
    "before", "over", "under", "long", "short", "next", "last", "best", "well", "just", "now",
)  # fmt: skip
BLOCK_TOKENS = 256
MIN_CACHEABLE_TOKENS = 1024


@cache
def vocabulary() -> tuple[str, ...]:
    """The filler vocabulary: WORDS with a leading space, each checked to be one o200k token."""
    enc = encoding()
    texts = tuple(dict.fromkeys(" " + word for word in WORDS))
    several = [t for t in texts if len(enc.encode(t)) != 1]
    if several:
        raise RuntimeError(f"not single o200k_base tokens: {several}")
    return texts


def filler(n: int, rng: random.Random) -> list[str]:
    vocab = vocabulary()
    return [rng.choice(vocab) for _ in range(n)]


def split_tokens(text: str) -> list[str]:
    enc = encoding()
    return [enc.decode([t]) for t in enc.encode(text, disallowed_special=())]


def prompt_tokens(text: str) -> list[int]:
    """Input tokens: the o200k_base encoding of the request's text (system + message contents,
    joined by newlines; roles and message framing are not counted)."""
    return encoding().encode(text, disallowed_special=())


def lognormal_factor(sigma: float, rng: random.Random) -> float:
    """A factor with median 1: exp(sigma * N(0, 1))."""
    return math.exp(sigma * rng.gauss(0.0, 1.0)) if sigma > 0 else 1.0


@dataclass
class Plan:
    """Everything about one response, decided when the request arrives."""

    input_tokens: int
    cached_tokens: int
    queue_s: float
    prefill_s: float
    decode_tokens_per_s: float
    reasoning: list[str]
    answer: list[str]
    correct: bool | None
    finish_reason: str
    offsets_s: list[float]  # send time of each output token, relative to request receipt

    @property
    def output_tokens(self) -> int:
        return len(self.reasoning) + len(self.answer)

    @property
    def ttft_s(self) -> float:
        return self.queue_s + self.prefill_s


def _offsets(
    start_s: float, count: int, rate: float, itl_sigma: float, rng: random.Random
) -> list[float]:
    step = 1.0 / rate
    if itl_sigma <= 0:
        return [start_s + i * step for i in range(count)]
    # Per-token gaps: lognormal with mean `step` (so the rate over a response stays `rate`).
    mean_fix = -0.5 * itl_sigma * itl_sigma
    out, at = [], start_s
    for i in range(count):
        if i:
            at += step * math.exp(itl_sigma * rng.gauss(0.0, 1.0) + mean_fix)
        out.append(at)
    return out


def plan(
    profile: Profile,
    prompt: str,
    max_tokens: int,
    cached_tokens: int,
    input_tokens: int,
    rng: random.Random,
) -> Plan:
    queue_s = profile.queue_ms / 1000.0 * lognormal_factor(profile.queue_sigma, rng)
    uncached = max(0, input_tokens - cached_tokens)
    prefill_s = uncached / profile.prefill_tokens_per_s
    rate = profile.decode_tokens_per_s * lognormal_factor(profile.decode_sigma, rng)
    budget = max(1, max_tokens)
    if profile.max_tokens_includes_reasoning:
        n_reasoning = min(profile.reasoning_tokens, max(0, budget - 8))
        room = budget - n_reasoning
    else:
        n_reasoning, room = profile.reasoning_tokens, budget
    reasoning = filler(n_reasoning, rng)
    right = tasks.answer_for(prompt)
    correct: bool | None = None
    tail: list[str] = []
    if right is not None:
        correct = rng.random() < profile.quality
        answer = right if correct else (tasks.wrong_answer_for(prompt, rng) or right)
        tail = split_tokens("\nANSWER: " + answer)
    # The answer the model would give; max_tokens cuts it off (and its ANSWER line with it).
    answer_tokens = filler(max(0, profile.output_tokens - len(tail)), rng) + tail
    finish = "stop"
    if len(answer_tokens) > room:
        answer_tokens = answer_tokens[:room]
        finish = "length"
    if not answer_tokens:
        answer_tokens = filler(1, rng)
    count = len(reasoning) + len(answer_tokens)
    return Plan(
        input_tokens=input_tokens,
        cached_tokens=cached_tokens,
        queue_s=queue_s,
        prefill_s=prefill_s,
        decode_tokens_per_s=rate,
        reasoning=reasoning,
        answer=answer_tokens,
        correct=correct,
        finish_reason=finish,
        offsets_s=_offsets(queue_s + prefill_s, count, rate, profile.itl_sigma, rng),
    )


@dataclass
class PromptCache:
    """Prefix caching by blocks of BLOCK_TOKENS tokens, like real providers' prompt caches.

    Block i's key hashes every token up to the end of block i, so a block only hits when the
    whole prefix before it matches. Prompts under MIN_CACHEABLE_TOKENS are not cached (as with
    OpenAI's 1,024-token minimum). Entries expire ttl_s after their last use.
    """

    ttl_s: float
    _blocks: dict[bytes, float] = field(default_factory=dict)

    @staticmethod
    def _hashes(namespace: str, tokens: list[int]) -> list[bytes]:
        raw = array("I", tokens).tobytes()
        h = hashlib.blake2b(namespace.encode(), digest_size=16)
        out = []
        width = BLOCK_TOKENS * 4
        for start in range(0, len(raw) - width + 1, width):
            h.update(raw[start : start + width])
            out.append(h.copy().digest())
        return out

    def lookup_and_store(self, namespace: str, tokens: list[int]) -> int:
        """Length of the cached prefix in tokens; then the prompt's blocks are cached."""
        if len(tokens) < MIN_CACHEABLE_TOKENS:
            return 0
        now = time.monotonic()
        hashes = self._hashes(namespace, tokens)
        cached = 0
        for digest in hashes:
            expiry = self._blocks.get(digest)
            if expiry is None or expiry < now:
                break
            cached += BLOCK_TOKENS
        for digest in hashes:
            self._blocks[digest] = now + self.ttl_s
        if len(self._blocks) > 200_000:
            self._blocks = {k: v for k, v in self._blocks.items() if v >= now}
        return cached


@dataclass
class RateLimiter:
    """Sliding one-minute windows of requests and tokens (0 = unlimited)."""

    requests_per_minute: int
    tokens_per_minute: int
    _events: deque[tuple[float, int]] = field(default_factory=deque)
    _tokens: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute)

    def check(self, tokens: int) -> tuple[bool, int, int, float]:
        """(allowed, remaining requests, remaining tokens, retry-after seconds)."""
        now = time.monotonic()
        while self._events and self._events[0][0] <= now - 60:
            self._tokens -= self._events.popleft()[1]
        rpm = self.requests_per_minute or 1_000_000
        tpm = self.tokens_per_minute or 1_000_000_000
        allowed = len(self._events) < rpm and self._tokens + tokens <= tpm
        retry_after_s = 0.0
        if allowed:
            if self.enabled:
                self._events.append((now, tokens))
                self._tokens += tokens
        elif self._events:
            retry_after_s = max(1.0, 60 - (now - self._events[0][0]))
        else:  # a single request larger than the token budget
            retry_after_s = 60.0
        return allowed, max(0, rpm - len(self._events)), max(0, tpm - self._tokens), retry_after_s
