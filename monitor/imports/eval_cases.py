"""What an eval file gives (monitor.imports.evals): its cases, as rows to check and store, and
the notes on what it could not express.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from monitor.models import (
    GRADER_CONTAINS,
    GRADER_REGEX,
    GRADERS,
    EvalCase,
)

FORMATS = ("csv", "jsonl", "promptfoo")


EXTENSIONS = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".yaml": "promptfoo",
    ".yml": "promptfoo",
}


GRADER_NAMES = {key for key, _ in GRADERS}


NAME_MAX = EvalCase._meta.get_field("name").max_length or 100


CSV_COLUMNS = {"name", "input", "grader", "expected", "ideal", "tolerance", "json_schema"}


@dataclass
class CaseRow:
    """One eval case read from a file, with the line it starts on."""

    line: int
    name: str
    input: str
    grader: str
    expected: str = ""
    tolerance: float = 0.0
    json_schema: dict[str, Any] | None = None


@dataclass
class EvalFile:
    cases: list[CaseRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # What rendering {{ var }} has written so far (bounded by MAX_RENDERED_CHARS).
    rendered_chars: int = 0


def case_name(given: Any, stem: str, line: int, suffix: str = "") -> str:
    base = str(given).strip() if given not in (None, "") else f"{stem}:{line}"
    return (base + suffix)[:NAME_MAX]


def expected_for(grader: str, ideal: list[str]) -> tuple[str, str]:
    """(grader, expected) for an answer given as one text or several acceptable ones."""
    if len(ideal) == 1:
        return grader, ideal[0]
    alternatives = "|".join(re.escape(text) for text in ideal)
    if grader == GRADER_CONTAINS:
        return GRADER_REGEX, f"(?:{alternatives})"
    # exact: the answer (after the last ANSWER:, else the whole text) is one of them
    return GRADER_REGEX, rf"(?:\A|ANSWER:)\s*(?:{alternatives})\s*\Z"
