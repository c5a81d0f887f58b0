"""Graders."""

from __future__ import annotations

import pytest

from probes import grade


@pytest.mark.parametrize(
    ("grader", "text", "expected", "schema", "tolerance", "passes"),
    [
        ("exact", "thinking...\nANSWER: 42", "42", None, 0, True),
        ("exact", "ANSWER: 43", "42", None, 0, False),
        ("contains", "the route is fast", "fast", None, 0, True),
        ("regex", "words\nANSWER: 1517", r"ANSWER:\s*1517\b", None, 0, True),
        ("regex", "ANSWER: 15170", r"ANSWER:\s*1517\b", None, 0, False),
        ("numeric", "ANSWER: 3.14159", "3.14", None, 0.01, True),
        ("numeric", "ANSWER: 3.2", "3.14", None, 0.01, False),
        (
            "json_schema",
            'text\nANSWER: {"name": "Ada", "age": 36}',
            "",
            {"type": "object", "required": ["name"]},
            0,
            True,
        ),
        (
            "json_schema",
            'so {"name": "Ada"} and more',
            "",
            {"type": "object", "required": ["age"]},
            0,
            False,
        ),
    ],
)
def test_graders(
    grader: str, text: str, expected: str, schema: dict | None, tolerance: float, passes: bool
) -> None:
    assert grade(grader, text, expected, schema, tolerance) is passes
