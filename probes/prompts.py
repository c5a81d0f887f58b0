"""Prompts of a target size, with a stable or a fresh prefix.

Stable: the same padding text every time, so a provider's prompt cache can hit.
Fresh: a unique line at the very start and the padding's paragraphs in a new order, so no
prefix cache can match anything (and no deduplication of the body either).
The padding goes before the question (as documents do in real prompts); each wire format
lays the parts out (probes.formats: Anthropic puts it in a cacheable system block). Sizes are
counted with o200k_base; other tokenizers differ a little, which is why results store the
provider's count.

Why not one repeated paragraph: it gzip-compressed 86x (53,706 -> 623 bytes), so msgpack+gzip
bodies were unrealistically small and their upload time meant nothing. The padding is varied
English prose instead: sentences drawn from templates and a vocabulary of ~500 words with a
skewed (Zipf-like) choice, as real text repeats its common words. Measured with gzip level 6
(the body encoder's): the 60k-token pool compresses 3.9x, a 10k-token padding 3.5x, a
3k-token one 3.0x, a 1k-token one 2.5x; real English prose is about 2.5x-4x. The skew (r ** 1.7) and the size of
the vocabulary were chosen to land there: uniform choice gave ~4.3x, no numbers or names
~4.6x.

Cheap to build: the pool of paragraphs is generated on demand and kept, already tokenized
(the whole pool, ~60k tokens, takes ~0.1 s; a 200-token prompt needs 32 paragraphs, ~3 ms,
so a worker's first probe is not held up); a prompt concatenates paragraph token lists
(stable: in pool order; fresh: 64 or more paragraphs in a random order) and decodes them once. A paragraph ends in "\\n\\n" and the
next starts with a capitalized word, a boundary o200k's pre-tokenizer never merges across, so
the concatenated tokens are exactly the tokens of the concatenated text.
"""

from __future__ import annotations

import random
import threading
import uuid
from dataclasses import dataclass

from probes.tokenizer import count_tokens, encoding

MAX_PARAGRAPHS = 1000  # ~60k tokens, ~290 KB: far past gzip's 32 KB window
GROW_PARAGRAPHS = 32
FRESH_PARAGRAPHS = 64


def _words(text: str) -> list[str]:
    return text.split()


_STABLE_SEED = 20_240_611  # the stable padding's text: change it and every cache goes cold

_NOUNS = _words(
    """
river city market harbor village farmer teacher engineer bridge road garden library museum
council festival season winter summer morning evening storm valley mountain forest island coast
factory railway station letter journal report survey study experiment result method question
answer problem solution family neighbor friend visitor traveler merchant sailor painter writer
student doctor nurse clerk mayor committee company workshop school college kitchen window door
wall roof field orchard vineyard meadow lake canal tower castle church square street lane avenue
district province country region border ship boat wagon engine machine clock lamp candle stove
table chair shelf basket barrel bottle glass stone brick timber iron copper silver wool cotton
grain wheat barley rice salt sugar coffee tea bread cheese fruit apple pear plum cherry olive
honey milk butter harvest crop herd flock horse cow sheep goat dog cat bird fish owl fox wolf
bear deer rabbit bee map compass chart record ledger account budget price wage tax loan debt
trade route cargo voyage journey path trail hill slope cliff cave spring well pond meeting
debate decision rule law custom habit tradition story legend song poem play book chapter page
picture painting sculpture photograph camera radio telephone newspaper magazine signal message
network system process pattern instrument measure scale weight distance height depth speed
volume"""
)
_ADJECTIVES = _words(
    """
old new small large quiet busy narrow wide early late bright dark warm cold dry wet long short
careful patient curious honest gentle steady strong weak heavy light simple complex rare common
local distant northern southern eastern western ancient modern rural urban famous modest plain
rich poor green golden silver grey pale deep shallow calm rough smooth sudden gradual regular
uneven useful practical detailed brief formal informal public private seasonal annual daily
weekly nearby remote"""
)
_PAST = _words(
    """
built opened crossed visited described measured recorded repaired painted studied reached
followed carried gathered planted harvested traded counted checked tested compared explained
noticed improved replaced moved collected delivered shared watched observed discovered reported
organized prepared finished started changed closed expanded protected cleaned restored designed
mapped"""
)
_PRESENT = _words(
    """
builds opens crosses visits describes measures records repairs paints studies reaches follows
carries gathers plants harvests trades counts checks tests compares explains notices improves
replaces moves collects delivers shares watches observes discovers reports organizes
prepares"""
)
_ADVERBS = _words(
    """
slowly quickly carefully quietly often rarely always usually seldom gladly openly briefly
together later soon again early finally gradually easily"""
)
_PREPOSITIONS = _words(
    """
near beside across behind above below along through around beyond under over toward
inside"""
)
_NAMES = _words(
    """
Anna Marta Tomas Elena Jonas Clara Peter Ines Oskar Lena Hugo Rosa Felix Ida Paul Nora Emil Vera
Arthur Greta"""
)
_TOWNS = _words(
    """
Ashford Brenton Calder Dunmore Elmstead Fairlow Glenbrook Harwick Ivydale Kestrel Larkhill
Marston Northcote Oakridge Pendle Ravensholm Stanway Thornbury Underhill Westmere"""
)
_PERIODS = ["spring", "summer", "autumn", "winter", "week", "month", "year"]
_OPENERS = ["Later", "Meanwhile", "Afterwards", "At first", "By then", "In the end"]


@dataclass(frozen=True)
class Prompt:
    """A prompt's parts; the wire format decides where each goes."""

    head: str  # the fresh-prefix line ("Request <hex>.\n"), or ""
    system: str  # the system prompt as given
    document: str  # the padding, ending in a blank line, or ""
    question: str  # the user prompt


def _pick(rng: random.Random, words: list[str]) -> str:
    return words[int(len(words) * rng.random() ** 1.7)]  # the head of each list is commoner


def _plural(word: str) -> str:
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + ("es" if word.endswith(("s", "sh", "ch", "x")) else "s")


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _sentence(rng: random.Random) -> str:
    noun, other, adj, adj2 = (
        _pick(rng, _NOUNS),
        _pick(rng, _NOUNS),
        _pick(rng, _ADJECTIVES),
        _pick(rng, _ADJECTIVES),
    )
    past, present = _pick(rng, _PAST), _pick(rng, _PRESENT)
    place, where, name = _pick(rng, _NOUNS), _pick(rng, _PREPOSITIONS), _pick(rng, _NAMES)
    town, how = _pick(rng, _TOWNS), _pick(rng, _ADVERBS)
    shapes = (
        f"the {adj} {noun} {past} the {other} {where} the {place}",
        f"{name} {past} {_a(adj)} {noun} in {town} {how}",
        f"every {rng.choice(_PERIODS)} the {noun} {present} the {adj2} {other}",
        f"in {rng.randrange(1820, 1990)} the {noun} of {town} was {how} {past} by {name}",
        f"{_a(adj)} {noun} and {_a(adj2)} {other} stood {where} the {place}",
        f"{name} said that the {noun} {present} about {rng.randrange(2, 90)} {_plural(other)} each "
        f"{rng.choice(_PERIODS)}",
        f"when the {noun} {past} the {other}, the {adj} {place} {_pick(rng, _PAST)} {how}",
        f"the {noun} {where} the {adj} {other} is {rng.choice(['still', 'now', 'often'])} {adj2}",
        f"nobody in {town} {past} the {adj} {noun} until {name} {_pick(rng, _PAST)} it",
        f"{rng.choice(_OPENERS).lower()}, the {noun} {past} {_a(adj)} {other} {where} the {place}",
    )
    text = rng.choice(shapes)
    return text[0].upper() + text[1:] + rng.choice(".....!")


class _Pool:
    """The paragraphs of padding, each as its o200k tokens, generated on demand (a 200-token
    prompt needs a few paragraphs, not the whole pool) in one deterministic sequence, so the
    stable text is the same whatever sizes were asked for first. Up to MAX_PARAGRAPHS; longer
    paddings cycle through them."""

    def __init__(self) -> None:
        self.rng = random.Random(_STABLE_SEED)
        self.paragraphs: list[tuple[int, ...]] = []
        self.tokens = 0
        self.lock = threading.Lock()

    def grow(self, tokens: int, paragraphs: int = 0) -> list[tuple[int, ...]]:
        """At least `tokens` tokens and `paragraphs` paragraphs, as far as the cap allows."""
        with self.lock:
            while (self.tokens < tokens or len(self.paragraphs) < paragraphs) and len(
                self.paragraphs
            ) < MAX_PARAGRAPHS:
                texts = [
                    " ".join(_sentence(self.rng) for _ in range(self.rng.randrange(3, 8))) + "\n\n"
                    for _ in range(GROW_PARAGRAPHS)
                ]
                for text in texts:
                    ids = tuple(encoding().encode_ordinary(text))
                    self.paragraphs.append(ids)
                    self.tokens += len(ids)
            return self.paragraphs


_pool = _Pool()


def padding(tokens: int, fresh: bool = False) -> str:
    """About `tokens` o200k tokens of prose (exactly, when re-encoded on its own): the same text
    every time unless fresh, when the paragraphs come in a new random order."""
    if tokens <= 0:
        return ""
    # A fresh padding shuffles at least FRESH_PARAGRAPHS paragraphs, so two are never alike.
    pool = _pool.grow(tokens, FRESH_PARAGRAPHS if fresh else 0)
    order = list(range(len(pool)))
    shuffle = random.Random(uuid.uuid4().int).shuffle if fresh else None
    ids: list[int] = []
    while len(ids) < tokens:
        if shuffle is not None:
            shuffle(order)
        for i in order:
            ids.extend(pool[i])
            if len(ids) >= tokens:
                break
    return encoding().decode(ids[:tokens])


def build(system: str, user: str, target_tokens: int, fresh: bool) -> Prompt:
    """A prompt whose total is about target_tokens (never less than the question)."""
    head = f"Request {uuid.uuid4().hex}.\n" if fresh else ""
    if target_tokens <= 0:
        return Prompt(head, system, "", user)
    used = count_tokens(head + system + user) + 8  # message framing
    pad = padding(max(0, target_tokens - used), fresh)
    return Prompt(head, system, f"{pad}\n\n" if pad else "", user)
