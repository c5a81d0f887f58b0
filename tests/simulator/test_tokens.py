"""Generated text is counted the same by the simulator and by o200k_base; hidden reasoning
takes time but is not sent.
"""

from __future__ import annotations

import random

import pytest

from probes.tokenizer import DATA, encoding
from simulator import generation, tasks
from simulator.config import load
from simulator.testing import CONFIGS

PROFILES = load(CONFIGS / "test.toml").providers["fastchip"].models


def test_the_tokenizer_file_ships_with_the_project() -> None:
    # Not skipped when absent: the vocabulary check below must really run.
    assert DATA.exists()


def test_every_vocabulary_word_is_one_o200k_token() -> None:
    enc = encoding()
    vocab = generation.vocabulary()
    assert len(vocab) >= 80
    for text in vocab:
        assert text.startswith(" ")
        assert len(enc.encode(text)) == 1, text


@pytest.mark.parametrize("seed", range(40))
def test_a_plans_text_counts_as_its_reported_tokens(seed: int) -> None:
    rng = random.Random(seed)
    profile = PROFILES["mid-think"]
    question = rng.choice(tasks.questions(10, seed=seed))
    prompt = question.prompt if seed % 3 else "Say something."
    plan = generation.plan(profile, prompt, rng.randint(1, 80), 0, 10, rng)
    enc = encoding()
    answer, reasoning = "".join(plan.answer), "".join(plan.reasoning)
    assert len(enc.encode(answer)) == len(plan.answer)
    assert len(enc.encode(reasoning)) == len(plan.reasoning)
    assert len(plan.offsets_s) == plan.output_tokens


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.25, 1.0])
def test_hidden_reasoning_takes_time_but_is_not_sent(seed: int, ratio: float) -> None:
    rng = random.Random(seed)
    profile = PROFILES["mid-think"]
    budget = rng.randint(1, 120)
    shape = generation.Shape(
        max_tokens=budget,
        reasoning_tokens=rng.randint(0, 90),
        reasoning_in_max=True,
        answer_room=0,
        shown_ratio=ratio,
    )
    plan = generation.plan(profile, "What is 3 * 3?", budget, 0, 10, rng, shape)
    assert plan.output_tokens <= budget
    assert len(plan.offsets_s) == plan.shown_tokens == len(plan.reasoning) + len(plan.answer)
    assert plan.offsets_s == sorted(plan.offsets_s)
    n = plan.reasoning_tokens
    if ratio == 1.0:
        assert plan.hidden_reasoning == 0
        assert plan.hidden_before is None
    elif n and ratio == 0.0:
        assert plan.reasoning == []
        assert plan.hidden_reasoning == n
    if plan.hidden_before is not None:
        assert len(plan.hidden_before) == plan.shown_tokens
        # Hidden tokens are accounted for before the answer; with no answer, at the end.
        trailing = 0 if plan.answer else plan.hidden_reasoning - sum(plan.hidden_before)
        assert sum(plan.hidden_before) + trailing == plan.hidden_reasoning
    # The first shown token waits for the hidden tokens before it, at the plan's rate.
    if plan.offsets_s and plan.hidden_before:
        gap = plan.offsets_s[0] - plan.queue_s - plan.prefill_s
        assert gap == pytest.approx(plan.hidden_before[0] / plan.decode_tokens_per_s)
    assert plan.end_s >= (plan.offsets_s[-1] if plan.offsets_s else 0)


def test_summaries_spread_over_the_thinking_and_end_it() -> None:
    assert generation.shown_indices(200, 0.25)[:3] == [3, 7, 11]
    assert generation.shown_indices(200, 0.25)[-1] == 199
    assert len(generation.shown_indices(200, 0.25)) == 50
    assert generation.shown_indices(3, 0.01) == [2]
    assert generation.shown_indices(0, 0.5) == []
