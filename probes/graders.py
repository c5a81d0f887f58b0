"""Graders for eval cases. They run after the probe, outside the timed path.

The answer of a response is what follows its last "ANSWER:" (the demo tasks' convention), or
the whole text when there is none. `exact` and `numeric` look at the answer; `contains` and
`regex` at the whole text; `json_schema` at the answer if it is JSON, else at the last JSON
object in the text.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from probes.errors import ConfigError

GRADER_EXACT = "exact"
GRADER_CONTAINS = "contains"
GRADER_REGEX = "regex"
GRADER_JSON_SCHEMA = "json_schema"
GRADER_NUMERIC = "numeric"
# The registry of graders, each with what the admin calls it (monitor.models.GRADERS reads it).
GRADERS: dict[str, str] = {
    GRADER_EXACT: "exact match",
    GRADER_CONTAINS: "contains",
    GRADER_REGEX: "regular expression",
    GRADER_JSON_SCHEMA: "JSON schema",
    GRADER_NUMERIC: "number within tolerance",
}
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")


class GraderError(ConfigError, ValueError):
    """The eval case itself is unusable (bad regex, bad schema, unknown grader): ours to fix,
    kind `config`. Still a ValueError, as callers catch it as one."""


def answer_of(text: str) -> str:
    marker = text.rfind("ANSWER:")
    return (text[marker + len("ANSWER:") :] if marker >= 0 else text).strip()


def _last_json_object(text: str) -> Any:
    decoder = json.JSONDecoder()
    found = None
    for i, ch in enumerate(text):
        if ch == "{":
            try:
                found, _ = decoder.raw_decode(text[i:])
            except ValueError:
                continue
    return found


def grade(
    grader: str,
    text: str,
    expected: str = "",
    schema: dict[str, Any] | None = None,
    tolerance: float = 0.0,
) -> bool:
    answer = answer_of(text)
    if grader == GRADER_EXACT:
        return answer == expected.strip()
    if grader == GRADER_CONTAINS:
        return expected in text
    if grader == GRADER_REGEX:
        try:
            return re.search(expected, text, re.DOTALL) is not None
        except re.error as exc:
            raise GraderError(f"bad regular expression: {exc}") from None
    if grader == GRADER_NUMERIC:
        try:
            target = float(expected)
        except ValueError:
            raise GraderError(f"expected value {expected!r} is not a number") from None
        numbers = _NUMBER.findall(answer) or _NUMBER.findall(text)
        if not numbers:
            return False
        value = float(numbers[-1].replace(",", ""))
        return math.isclose(value, target, rel_tol=0.0, abs_tol=tolerance)
    if grader == GRADER_JSON_SCHEMA:
        if schema is None:
            raise GraderError("the JSON schema grader needs a schema")
        try:
            validator = Draft202012Validator(schema)
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise GraderError(f"bad schema: {exc.message}") from None
        try:
            value = json.loads(answer)
        except ValueError:
            value = _last_json_object(text)
        return value is not None and validator.is_valid(value)
    raise GraderError(f"unknown grader {grader!r}")
