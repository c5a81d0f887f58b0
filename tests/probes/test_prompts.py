"""Prompt padding: sized in o200k tokens exactly, compressible like real prose (not 86x), the
same text every stable probe (so caches hit) and a different one every fresh probe."""

from __future__ import annotations

import gzip
import random
import time

import pytest

from probes import prompts
from probes.tokenizer import count_tokens


@pytest.mark.parametrize("tokens", [2000, 10_000, 50_000])
@pytest.mark.parametrize("fresh", [False, True])
def test_padding_compresses_like_real_prose(tokens: int, fresh: bool) -> None:
    text = prompts.padding(tokens, fresh).encode()
    ratio = len(text) / len(gzip.compress(text, compresslevel=6))  # the body encoder's level
    assert 2.5 <= ratio <= 4.0, ratio


def test_padding_is_exactly_the_tokens_asked_for() -> None:
    rng = random.Random(5)
    for tokens in [1, 2, 7, 100, 999, *(rng.randrange(1, 80_000) for _ in range(40))]:
        assert count_tokens(prompts.padding(tokens)) == tokens
        assert count_tokens(prompts.padding(tokens, fresh=True)) == tokens


def test_stable_padding_never_changes_and_fresh_padding_always_does() -> None:
    assert prompts.padding(5000) == prompts.padding(5000)
    assert prompts.padding(8000).startswith(prompts.padding(5000)[:-40])  # one shared prefix
    fresh = {prompts.padding(5000, fresh=True) for _ in range(5)}
    assert len(fresh) == 5
    assert prompts.padding(5000) not in fresh


def test_a_prompt_is_about_its_target_size_with_its_parts_apart() -> None:
    prompt = prompts.build("Be brief.", "What is 2 + 2?", 3000, fresh=True)
    assert prompt.head.startswith("Request ")
    assert prompt.system == "Be brief."
    assert prompt.question == "What is 2 + 2?"
    whole = prompt.head + prompt.system + prompt.document + prompt.question
    assert count_tokens(whole) == pytest.approx(3000 - 8, abs=4)
    assert prompts.build("", "Hi", 0, fresh=False) == prompts.Prompt("", "", "", "Hi")


def test_a_batch_of_fresh_prompts_is_cheap_to_build() -> None:
    prompts.padding(10)  # the pool is built once per process
    started = time.process_time()
    for _ in range(200):
        prompts.build("", "Question?", 10_000, fresh=True)
    assert time.process_time() - started < 5.0
