"""Demo questions have answers the simulator works out, and a model answers them right with its
configured quality.
"""

from __future__ import annotations

import asyncio
import json
import random

import httpx2

from simulator import tasks
from simulator.testing import SimulatorProcess
from tests.sim_fixtures import OPENAI_KEY


def test_answers_are_computed_from_the_prompt() -> None:
    assert tasks.answer_for("What is 37 * 41?") == "1517"
    assert tasks.answer_for("What is 37*41? Answer with the number only.") == "1517"
    assert json.loads(
        tasks.answer_for('Extract name and age as JSON from: "Ada is 36."') or ""
    ) == {
        "name": "Ada",
        "age": 36,
    }
    assert tasks.answer_for("Tell me a story.") is None


def test_questions_are_repeatable_and_answerable() -> None:
    first, again = tasks.questions(10), tasks.questions(10)
    assert first == again
    assert {q.kind for q in first} == {"arithmetic", "extraction"}
    for q in first:
        assert tasks.answer_for(q.prompt + "\n" + tasks.INSTRUCTION) == q.answer


def test_wrong_answers_are_plausible_but_wrong() -> None:
    rng = random.Random(1)
    for q in tasks.questions(20):
        wrong = tasks.wrong_answer_for(q.prompt, rng)
        assert wrong is not None
        assert wrong != q.answer


def _final_answers(sim: SimulatorProcess, model: str, prompts: list[str]) -> list[str]:
    async def one(client: httpx2.AsyncClient, prompt: str, seed: int) -> str:
        response = await client.post(
            f"{sim.base_url}/fastchip/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 200,
            },
            headers={"authorization": f"Bearer {OPENAI_KEY}", "x-sim-seed": str(seed)},
        )
        text: str = response.json()["choices"][0]["message"]["content"]
        return text.rsplit("ANSWER: ", 1)[1]

    async def run() -> list[str]:
        async with httpx2.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(one(client, p, i) for i, p in enumerate(prompts)))

    return asyncio.run(run())


def test_a_model_answers_right_with_its_quality(sim: SimulatorProcess) -> None:
    questions = tasks.questions(40, seed=3)
    prompts = [q.prompt + "\n" + tasks.INSTRUCTION for q in questions]
    perfect = _final_answers(sim, "fast-small", prompts)
    assert perfect == [q.answer for q in questions]  # quality 1.0
    coin = _final_answers(sim, "slow-large", prompts)
    right = sum(a == q.answer for a, q in zip(coin, questions, strict=True))
    assert 8 <= right <= 32  # quality 0.5: binomial(40, 0.5) is inside this 99.9% of the time
