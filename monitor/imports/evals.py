"""Eval cases from CSV, JSONL (OpenAI evals' `input` / `ideal`) and promptfoo YAML.

Our graders (probes.graders): exact, contains, regex, json_schema, numeric (with a
tolerance). An eval case has one grader, so a promptfoo test with several assertions becomes
one case per assertion it can express; assertions it cannot (model-graded, scripts, `not-`
forms...) are reported with their line, never dropped silently.

Formats, by file extension (or `fmt`):
- CSV with a header: `input` (required; or the only column that is not one of ours), and
  optionally `name`, `grader`, `expected` (or `ideal`), `tolerance`, `json_schema`, and
  promptfoo's `__expected` assertion strings (`contains: Paris`, `regex: ^\\d+$`, `is-json`).
- JSONL, one object a line: OpenAI evals' `{"input": [chat messages] or text, "ideal": text
  or [texts]}`, or ours: `{"input", "expected", "grader", "tolerance", "json_schema", "name"}`.
- promptfoo YAML: a config with `tests` (and `defaultTest`), or a bare list of tests; each
  test's `vars` give the input (the var named by `input_var`, else the one var the config's
  prompts insert, else `input`, else the only var) and its `assert` list the graders. YAML
  aliases (`*name`) are refused: write the value out.

The cases a file gives are monitor.imports.eval_cases; promptfoo's YAML and assertions are
monitor.imports.promptfoo.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import PurePath
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from monitor.imports.base import ImportFileError, Report, decode, parse_json
from monitor.imports.eval_cases import (
    CSV_COLUMNS,
    EXTENSIONS,
    FORMATS,
    GRADER_NAMES,
    CaseRow,
    EvalFile,
    case_name,
    expected_for,
)
from monitor.imports.promptfoo import (
    add_assertion_cases,
    parse_promptfoo,
    promptfoo_string,
    render_vars,
)
from monitor.models import (
    GRADER_EXACT,
    EvalCase,
    Task,
)


def format_of(filename: str) -> str | None:
    return EXTENSIONS.get(PurePath(filename).suffix.lower())


def parse(
    data: bytes,
    source: str,
    *,
    fmt: str | None = None,
    grader: str = GRADER_EXACT,
    tolerance: float = 0.0,
    input_var: str = "",
) -> EvalFile:
    """Read a whole file of eval cases; ImportFileError (naming the line) if it is malformed.

    `grader` and `tolerance` apply to cases whose file gives only an expected answer (OpenAI
    evals' `ideal`, a CSV without a grader column)."""
    fmt = fmt or format_of(source)
    if fmt not in FORMATS:
        raise ImportFileError(
            "unknown format: name the file .csv, .jsonl or .yaml (promptfoo), or give the format",
            source=source,
        )
    if grader not in GRADER_NAMES:
        raise ImportFileError(f"unknown grader {grader!r}", source=source)
    text = decode(data, source)
    stem = PurePath(source).stem or "case"
    if fmt == "csv":
        parsed = _parse_csv(text, source, stem, grader, tolerance, input_var)
    elif fmt == "jsonl":
        parsed = _parse_jsonl(text, source, stem, grader, tolerance)
    else:
        parsed = parse_promptfoo(text, source, stem, input_var)
    seen: dict[str, int] = {}
    for case in parsed.cases:
        if case.name in seen:
            raise ImportFileError(
                f"two cases named {case.name!r} (the first on line {seen[case.name]})",
                line=case.line,
                source=source,
            )
        seen[case.name] = case.line
    return parsed


def _parse_csv(
    text: str, source: str, stem: str, default_grader: str, tolerance: float, input_var: str
) -> EvalFile:
    result = EvalFile()
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h.strip() for h in reader.fieldnames or []]
    if not header:
        raise ImportFileError("empty file: expected a header line", line=1, source=source)
    reader.fieldnames = header
    assertion_columns = [
        h for h in header if h == "__expected" or re.fullmatch(r"__expected\d+", h)
    ]
    free = [h for h in header if h not in CSV_COLUMNS and h not in assertion_columns]
    input_column = input_var or ("input" if "input" in header else "")
    if not input_column:
        if len(free) != 1:
            raise ImportFileError(
                "no input column: name one `input` (or give the column to use)",
                line=1,
                source=source,
            )
        input_column = free[0]
    if input_column not in header:
        raise ImportFileError(f"no column {input_column!r}", line=1, source=source)
    ignored = [h for h in free if h != input_column and not h.startswith("__")]
    if ignored:
        result.notes.append(f"line 1: columns not imported: {', '.join(ignored)}")
    line = reader.line_num + 1
    try:
        for record in reader:
            if None in record:
                raise ImportFileError("more fields than the header has", line=line, source=source)
            if not any((v or "").strip() for v in record.values()):
                line = reader.line_num + 1
                continue
            _csv_record(
                record, line, source, stem, input_column, assertion_columns,
                default_grader, tolerance, result,
            )  # fmt: skip
            line = reader.line_num + 1
    except csv.Error as exc:
        raise ImportFileError(
            f"not valid CSV: {exc}", line=reader.line_num, source=source
        ) from None
    return result


def _csv_record(
    record: dict[str, str],
    line: int,
    source: str,
    stem: str,
    input_column: str,
    assertion_columns: list[str],
    default_grader: str,
    default_tolerance: float,
    result: EvalFile,
) -> None:
    text = record.get(input_column) or ""
    if not text.strip():
        raise ImportFileError(f"empty {input_column!r}", line=line, source=source)
    name = case_name(record.get("name"), stem, line)
    assertions = [record[c].strip() for c in assertion_columns if (record.get(c) or "").strip()]
    if assertions:
        variables = {input_column: text}
        mapped = [
            promptfoo_string(
                render_vars(value, variables, result, line, source), line, source, result.notes
            )
            for value in assertions
        ]
        add_assertion_cases(result, [m for m in mapped if m is not None], name, text, line)
        return
    grader = (record.get("grader") or "").strip() or default_grader
    if grader not in GRADER_NAMES:
        raise ImportFileError(
            f"unknown grader {grader!r} (one of {', '.join(sorted(GRADER_NAMES))})",
            line=line,
            source=source,
        )
    expected = record.get("expected") or record.get("ideal") or ""
    raw_tolerance = (record.get("tolerance") or "").strip()
    tolerance = default_tolerance
    if raw_tolerance:
        tolerance = _number(raw_tolerance, "tolerance", line, source)
    schema = None
    raw_schema = (record.get("json_schema") or "").strip()
    if raw_schema:
        schema = parse_json(raw_schema, source, line=line, what="json_schema is not valid JSON")
    result.cases.append(CaseRow(line, name, text, grader, expected, tolerance, schema))


def _number(raw: Any, what: str, line: int, source: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ImportFileError(f"{what} {raw!r} is not a number", line=line, source=source) from None
    if not math.isfinite(value):
        raise ImportFileError(f"{what} {raw!r} is not a finite number", line=line, source=source)
    return value


def _message_text(content: Any) -> str | None:
    """A chat message's text: a string, or the text parts of a content array."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        texts = [p for p in parts if isinstance(p, str)]
        if texts and len(texts) == len(parts):
            return "".join(texts)
    return None


def _jsonl_input(value: Any, line: int, source: str, notes: list[str]) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        users = [m for m in value if m.get("role") == "user"]
        if not users:
            raise ImportFileError("input has no user message", line=line, source=source)
        text = _message_text(users[-1].get("content"))
        if text is None:
            raise ImportFileError("the user message has no text content", line=line, source=source)
        others = [str(m.get("role")) for m in value if m is not users[-1]]
        if others:
            # The task holds the system prompt and the conversation shape; a case holds one input.
            notes.append(
                f"line {line}: kept the last user message; not imported: {', '.join(others)} "
                "message(s)"
            )
        return text
    raise ImportFileError("input must be text or a list of chat messages", line=line, source=source)


def _parse_jsonl(
    text: str, source: str, stem: str, default_grader: str, default_tolerance: float
) -> EvalFile:
    result = EvalFile()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        item = parse_json(raw, source, line=number)
        if not isinstance(item, dict):
            raise ImportFileError("expected a JSON object", line=number, source=source)
        if "input" not in item:
            raise ImportFileError("no `input`", line=number, source=source)
        case_input = _jsonl_input(item["input"], number, source, result.notes)
        name = case_name(item.get("name"), stem, number)
        if "ideal" in item:
            ideal = item["ideal"]
            ideals = ideal if isinstance(ideal, list) else [ideal]
            if not ideals or not all(isinstance(i, str | int | float) for i in ideals):
                raise ImportFileError(
                    "ideal must be text or a list of texts", line=number, source=source
                )
            grader, expected = expected_for(default_grader, [str(i) for i in ideals])
            tolerance = default_tolerance
            schema = None
        else:
            grader = item.get("grader") or default_grader
            if grader not in GRADER_NAMES:
                raise ImportFileError(f"unknown grader {grader!r}", line=number, source=source)
            expected = item.get("expected", "")
            if not isinstance(expected, str | int | float):
                raise ImportFileError("expected must be text", line=number, source=source)
            expected = str(expected)
            tolerance = (
                _number(item["tolerance"], "tolerance", number, source)
                if "tolerance" in item
                else default_tolerance
            )
            schema = item.get("json_schema")
            if schema is not None and not isinstance(schema, dict):
                raise ImportFileError("json_schema must be an object", line=number, source=source)
        unknown = sorted(
            set(item) - {"input", "ideal", "name", "grader", "expected", "tolerance", "json_schema"}
        )
        if unknown:
            result.notes.append(f"line {number}: fields not imported: {', '.join(unknown)}")
        result.cases.append(CaseRow(number, name, case_input, grader, expected, tolerance, schema))
    return result


def import_cases(
    task: Task, parsed: EvalFile, *, source: str = "", dry_run: bool = False
) -> Report:
    """Create or update the task's eval cases by name, in one transaction: a case the model
    refuses (a bad regex, a bad schema) raises ImportFileError naming its line and nothing is
    kept."""
    report = Report(dry_run=dry_run, notes=list(parsed.notes))
    with transaction.atomic():
        existing = {case.name: case for case in EvalCase.objects.filter(task=task)}
        for row in parsed.cases:
            case = existing.get(row.name) or EvalCase(task=task, name=row.name)
            values = {
                "input": row.input,
                "grader": row.grader,
                "expected": row.expected,
                "tolerance": row.tolerance,
                "json_schema": row.json_schema,
            }
            if case.pk is not None and all(getattr(case, k) == v for k, v in values.items()):
                report.unchanged += 1
                continue
            for attribute, value in values.items():
                setattr(case, attribute, value)
            try:
                case.full_clean()
            except ValidationError as exc:
                raise ImportFileError(
                    f"case {row.name!r}: " + "; ".join(exc.messages), line=row.line, source=source
                ) from None
            if case.pk is None:
                report.created += 1
                report.changes.append(f"new case {row.name!r} ({row.grader})")
            else:
                report.updated += 1
                report.changes.append(f"updated case {row.name!r} ({row.grader})")
            case.save()
        if dry_run:
            transaction.set_rollback(True)
    return report
