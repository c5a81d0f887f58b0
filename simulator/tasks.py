"""Demo eval questions whose right answers the simulator (and the graders) can work out.

Two kinds, both recognisable from the prompt text alone:
- arithmetic: "What is 37 * 41?"                                 -> "1517"
- extraction: 'Extract name and age as JSON from: "Ada is 36."'  -> {"name": "Ada", "age": 36}

The model answers on its last line as "ANSWER: <answer>", so graders can use a regex, a number
tolerance, or the JSON schema of the last JSON object. `answer_for(prompt)` is a pure function;
the demo data loader uses `questions()` to make EvalCases.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass

ARITHMETIC = re.compile(r"What is (\d+)\s*[*x\u00d7]\s*(\d+)\s*\?")
EXTRACTION = re.compile(r'Extract name and age as JSON from: "([A-Z][a-z]+) is (\d+)\."')
NAMES = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia", "Leslie"]

INSTRUCTION = 'Reason briefly, then give the final answer on the last line as "ANSWER: <answer>".'


@dataclass(frozen=True)
class Question:
    name: str
    prompt: str
    answer: str
    kind: str  # "arithmetic" | "extraction"


def answer_for(prompt: str) -> str | None:
    """The right answer to the last demo question in the prompt, if any: in a conversation
    (a scenario's growing context) the newest question is the one to answer, and a question
    may be built from an earlier answer ("What is {previous} * 3?")."""
    last_arithmetic = _last(ARITHMETIC, prompt)
    last_extraction = _last(EXTRACTION, prompt)
    if last_arithmetic is None and last_extraction is None:
        return None
    if last_extraction is None or (
        last_arithmetic is not None and last_arithmetic.start() > last_extraction.start()
    ):
        assert last_arithmetic is not None
        return str(int(last_arithmetic.group(1)) * int(last_arithmetic.group(2)))
    return json.dumps({"name": last_extraction.group(1), "age": int(last_extraction.group(2))})


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007 (the last one is wanted)
        pass
    return found


def wrong_answer_for(prompt: str, rng: random.Random) -> str | None:
    right = answer_for(prompt)
    if right is None:
        return None
    if right.isdigit():
        return str(int(right) + rng.choice([-10, -1, 1, 7, 100]))
    data = json.loads(right)
    return json.dumps({"name": data["name"].lower(), "age": str(data["age"] + 1)})


def questions(count: int = 10, seed: int = 7) -> list[Question]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if i % 2 == 0:
            a, b = rng.randint(12, 99), rng.randint(12, 99)
            prompt = f"What is {a} * {b}?"
            out.append(Question(f"multiply-{i}", prompt, str(a * b), "arithmetic"))
        else:
            name, age = rng.choice(NAMES), rng.randint(20, 90)
            prompt = f'Extract name and age as JSON from: "{name} is {age}."'
            out.append(
                Question(
                    f"extract-{i}", prompt, json.dumps({"name": name, "age": age}), "extraction"
                )
            )
    return out
