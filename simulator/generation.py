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
from typing import ClassVar

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
    """Everything about one response, decided when the request arrives.

    Billed output = reasoning (shown and hidden) + answer. Only `reasoning` and `answer` are
    ever sent; `hidden_reasoning` tokens are generated (they take time and are billed) but
    never streamed: an OpenAI reasoning model's reasoning, or the part of Anthropic's thinking
    its streamed summary leaves out.
    """

    input_tokens: int
    cached_tokens: int
    queue_s: float
    prefill_s: float
    decode_tokens_per_s: float
    reasoning: list[str]  # shown reasoning tokens (streamed)
    answer: list[str]
    correct: bool | None
    finish_reason: str
    offsets_s: list[float]  # send time of each shown token (reasoning, then answer)
    hidden_reasoning: int = 0
    # Per shown token, the hidden tokens generated just before it; None when nothing is hidden.
    hidden_before: list[int] | None = None
    end_s: float = 0.0  # when the last billed token is generated
    cache_creation_tokens: int = 0
    service_tier: str | None = None

    @property
    def output_tokens(self) -> int:
        """Billed output tokens, as usage reports them."""
        return len(self.reasoning) + self.hidden_reasoning + len(self.answer)

    @property
    def reasoning_tokens(self) -> int:
        return len(self.reasoning) + self.hidden_reasoning

    @property
    def shown_tokens(self) -> int:
        return len(self.reasoning) + len(self.answer)

    def hold_back(self, seconds: float) -> None:
        """Queue the response `seconds` longer: every token comes that much later."""
        if seconds > 0:
            self.queue_s += seconds
            self.offsets_s = [t + seconds for t in self.offsets_s]
            self.end_s += seconds

    @property
    def ttft_s(self) -> float:
        """To the first shown token (hidden reasoning delays it)."""
        return self.offsets_s[0] if self.offsets_s else self.queue_s + self.prefill_s


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


def shown_indices(total: int, ratio: float) -> list[int]:
    """Which of `total` reasoning tokens a stream shows: all (ratio 1), none (0), or an evenly
    spread summary ending with the last one (Anthropic's summarized thinking)."""
    if total <= 0 or ratio <= 0:
        return []
    if ratio >= 1:
        return list(range(total))
    shown = max(1, round(total * ratio))
    return [(k + 1) * total // shown - 1 for k in range(shown)]


@dataclass(slots=True)
class Shape:
    """What a model profile made of one request (simulator/profiles.py)."""

    max_tokens: int
    reasoning_tokens: int  # the reasoning the model wants to do, before max_tokens cuts it
    reasoning_in_max: bool  # reasoning counts against max_tokens
    answer_room: int = 8  # reasoning leaves this much of max_tokens for the answer (0: none)
    shown_ratio: float = 1.0  # reasoning streamed / reasoning billed
    queue_factor: float = 1.0
    rate_factor: float = 1.0
    service_tier: str | None = None


def plan(
    profile: Profile,
    prompt: str,
    max_tokens: int,
    cached_tokens: int,
    input_tokens: int,
    rng: random.Random,
    shape: Shape | None = None,
) -> Plan:
    if shape is None:
        shape = Shape(
            max_tokens=max_tokens,
            reasoning_tokens=profile.reasoning_tokens,
            reasoning_in_max=profile.max_tokens_includes_reasoning,
        )
    queue_s = profile.queue_ms / 1000.0 * lognormal_factor(profile.queue_sigma, rng)
    queue_s *= shape.queue_factor
    uncached = max(0, input_tokens - cached_tokens)
    prefill_s = uncached / profile.prefill_tokens_per_s
    rate = profile.decode_tokens_per_s * lognormal_factor(profile.decode_sigma, rng)
    rate *= shape.rate_factor
    budget = max(1, shape.max_tokens)
    if shape.reasoning_in_max:
        n_reasoning = min(shape.reasoning_tokens, max(0, budget - shape.answer_room))
        room = budget - n_reasoning
    else:
        n_reasoning, room = shape.reasoning_tokens, budget
    shown = shown_indices(n_reasoning, shape.shown_ratio)
    reasoning = filler(len(shown), rng)
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
    if not answer_tokens and room > 0:
        answer_tokens = filler(1, rng)
    # Every billed token takes its time; only the shown ones get a send time.
    billed = _offsets(
        queue_s + prefill_s, n_reasoning + len(answer_tokens), rate, profile.itl_sigma, rng
    )
    hidden_before: list[int] | None = None
    if len(shown) == n_reasoning:
        offsets = billed
    else:
        offsets = [billed[i] for i in shown] + billed[n_reasoning:]
        hidden_before, previous = [], -1
        for i in shown:
            hidden_before.append(i - previous - 1)
            previous = i
        if answer_tokens:
            hidden_before.append(n_reasoning - previous - 1)
            hidden_before += [0] * (len(answer_tokens) - 1)
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
        offsets_s=offsets,
        hidden_reasoning=n_reasoning - len(shown),
        hidden_before=hidden_before,
        end_s=billed[-1] if billed else queue_s + prefill_s,
        service_tier=shape.service_tier,
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
class BreakpointCache:
    """Anthropic's prompt cache: only prefixes ending at a `cache_control` breakpoint are
    written, and a prefix hits only when it matches exactly up to a block boundary.

    A request's prefix for a breakpoint is every token up to the end of the block carrying it
    (tools, then system, then messages). A prefix shorter than the model's minimum cacheable
    length is not cached. On lookup the cache is checked at each breakpoint and at up to 20
    block boundaries before it (the API's lookback); the longest hit is read. Entries live
    their TTL (5 minutes, or "1h") after their last use.
    """

    _entries: dict[bytes, tuple[float, float]] = field(default_factory=dict)  # expiry, ttl

    LOOKBACK_BLOCKS: ClassVar[int] = 20

    def lookup_and_store(
        self,
        namespace: str,
        tokens: list[int],
        block_ends: list[int],
        breakpoints: list[tuple[int, float]],
        min_tokens: int,
    ) -> tuple[int, int]:
        """(cache read tokens, cache creation tokens). `block_ends[i]` is the token count up
        to the end of block i; `breakpoints` are (block index, ttl seconds)."""
        if not breakpoints:
            return 0, 0
        candidates: set[int] = set()
        for block, _ in breakpoints:
            start = max(0, block - self.LOOKBACK_BLOCKS)
            candidates.update(block_ends[start : block + 1])
        positions = sorted(p for p in candidates if p >= max(1, min_tokens))
        if not positions:
            return 0, 0
        hashes = _prefix_hashes(namespace, tokens, positions)
        now = time.monotonic()
        read = 0
        for position in reversed(positions):
            entry = self._entries.get(hashes[position])
            if entry is not None and entry[0] >= now:
                read = position
                self._entries[hashes[position]] = (now + entry[1], entry[1])
                break
        written = 0
        for block, ttl_s in breakpoints:
            position = block_ends[block]
            if position < max(1, min_tokens):
                continue
            digest = hashes[position]
            entry = self._entries.get(digest)
            if entry is None or entry[0] < now:
                written = max(written, position)
            self._entries[digest] = (now + ttl_s, ttl_s)
        if len(self._entries) > 200_000:
            self._entries = {k: v for k, v in self._entries.items() if v[0] >= now}
        return read, max(0, written - read)


def _prefix_hashes(namespace: str, tokens: list[int], positions: list[int]) -> dict[int, bytes]:
    """Digest of the first p tokens for each p in `positions` (sorted ascending)."""
    raw = array("I", tokens).tobytes()
    h = hashlib.blake2b(namespace.encode(), digest_size=16)
    out, done = {}, 0
    for position in positions:
        h.update(raw[done * 4 : position * 4])
        done = position
        out[position] = h.copy().digest()
    return out


def tokenize_parts(parts: list[str]) -> tuple[list[int], list[int]]:
    """Tokens of blocks joined by newlines, and the token count up to the end of each block.
    Each block is encoded on its own, so a block boundary is a token boundary."""
    enc = encoding()
    newline = enc.encode("\n")
    tokens: list[int] = []
    ends: list[int] = []
    for i, text in enumerate(parts):
        if i:
            tokens += newline
        tokens += enc.encode(text, disallowed_special=())
        ends.append(len(tokens))
    return tokens, ends


@dataclass(slots=True)
class Usage:
    """A rate limiter's state after a request: what the window holds now."""

    allowed: bool
    retry_after_s: float
    requests: int
    input_tokens: int
    output_tokens: int

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class RateLimiter:
    """Sliding one-minute windows of requests and tokens (0 = unlimited). A request counts
    its input tokens and its max_tokens (output is estimated from it, as providers do)."""

    requests_per_minute: int
    tokens_per_minute: int
    _events: deque[tuple[float, int, int]] = field(default_factory=deque)
    _input: int = 0
    _output: int = 0

    def check(self, input_tokens: int, max_tokens: int) -> Usage:
        now = time.monotonic()
        while self._events and self._events[0][0] <= now - 60:
            _, used_in, used_out = self._events.popleft()
            self._input -= used_in
            self._output -= used_out
        rpm = self.requests_per_minute
        tpm = self.tokens_per_minute
        tokens = input_tokens + max_tokens
        allowed = (not rpm or len(self._events) < rpm) and (
            not tpm or self._input + self._output + tokens <= tpm
        )
        retry_after_s = 0.0
        if allowed:
            self._events.append((now, input_tokens, max_tokens))
            self._input += input_tokens
            self._output += max_tokens
        elif self._events:
            retry_after_s = max(1.0, 60 - (now - self._events[0][0]))
        else:  # a single request larger than the token budget
            retry_after_s = 60.0
        return Usage(allowed, retry_after_s, len(self._events), self._input, self._output)
