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
    """The right answer to the first demo question found in the prompt, if any."""
    if m := ARITHMETIC.search(prompt):
        return str(int(m.group(1)) * int(m.group(2)))
    if m := EXTRACTION.search(prompt):
        return json.dumps({"name": m.group(1), "age": int(m.group(2))})
    return None


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
