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
  aliases (`*name`) are refused: write the value out."""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction

from monitor.imports.base import MAX_IMPORT_BYTES, ImportFileError, Report, decode, parse_json
from monitor.models import (
    GRADER_CONTAINS,
    GRADER_EXACT,
    GRADER_JSON_SCHEMA,
    GRADER_NUMERIC,
    GRADER_REGEX,
    GRADERS,
    EvalCase,
    Task,
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
        parsed = _parse_promptfoo(text, source, stem, input_var)
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


def _name(given: Any, stem: str, line: int, suffix: str = "") -> str:
    base = str(given).strip() if given not in (None, "") else f"{stem}:{line}"
    return (base + suffix)[:NAME_MAX]


def _expected_for(grader: str, ideal: list[str]) -> tuple[str, str]:
    """(grader, expected) for an answer given as one text or several acceptable ones."""
    if len(ideal) == 1:
        return grader, ideal[0]
    alternatives = "|".join(re.escape(text) for text in ideal)
    if grader == GRADER_CONTAINS:
        return GRADER_REGEX, f"(?:{alternatives})"
    # exact: the answer (after the last ANSWER:, else the whole text) is one of them
    return GRADER_REGEX, rf"(?:\A|ANSWER:)\s*(?:{alternatives})\s*\Z"


# --- CSV -----------------------------------------------------------------------------------


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
    name = _name(record.get("name"), stem, line)
    assertions = [record[c].strip() for c in assertion_columns if (record.get(c) or "").strip()]
    if assertions:
        variables = {input_column: text}
        mapped = [
            _promptfoo_string(
                _render(value, variables, result, line, source), line, source, result.notes
            )
            for value in assertions
        ]
        _add_assertion_cases(result, [m for m in mapped if m is not None], name, text, line)
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


# --- JSONL ---------------------------------------------------------------------------------


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
        name = _name(item.get("name"), stem, number)
        if "ideal" in item:
            ideal = item["ideal"]
            ideals = ideal if isinstance(ideal, list) else [ideal]
            if not ideals or not all(isinstance(i, str | int | float) for i in ideals):
                raise ImportFileError(
                    "ideal must be text or a list of texts", line=number, source=source
                )
            grader, expected = _expected_for(default_grader, [str(i) for i in ideals])
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


# --- promptfoo -----------------------------------------------------------------------------


class _Located(dict[Any, Any]):
    """A YAML mapping that remembers the line it starts on."""

    line: int = 0


# A document is bounded in what it can make, not only in bytes: aliases are refused (ten
# lines of `&a [*b, *b, ...]` are a billion values once expanded), and so are documents of
# more nodes, or nested deeper, than any eval set needs (each node costs far more memory than
# its bytes; each level of nesting, stack).
MAX_YAML_NODES = 250_000
MAX_YAML_DEPTH = 64
# What rendering {{ var }} may write over a whole import: a short reference to a long var,
# repeated, is a multiple of the file's size.
MAX_RENDERED_CHARS = MAX_IMPORT_BYTES


class _LineLoader(yaml.SafeLoader):
    """promptfoo YAML as plain data (a SafeLoader), within the bounds above."""

    def __init__(self, stream: str, source: str) -> None:
        super().__init__(stream)
        self.source = source
        self._nodes = 0
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]  # (in the stubs)
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, yaml.AliasEvent):
            raise ImportFileError(
                f"YAML aliases are not accepted (*{event.anchor}): write the value out",
                line=line,
                source=self.source,
            )
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise ImportFileError(
                f"more than {MAX_YAML_NODES} YAML values; refused", line=line, source=self.source
            )
        if self._depth >= MAX_YAML_DEPTH:
            raise ImportFileError(
                f"nested more than {MAX_YAML_DEPTH} levels deep; refused",
                line=line,
                source=self.source,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _construct_located(loader: yaml.SafeLoader, node: yaml.MappingNode) -> _Located:
    mapping = _Located(loader.construct_mapping(node, deep=True))
    mapping.line = node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_located)


@dataclass(frozen=True)
class _Mapped:
    """One promptfoo assertion as one of our graders."""

    line: int
    label: str
    grader: str
    expected: str = ""
    tolerance: float = 0.0
    json_schema: dict[str, Any] | None = None


# `javascript: Math.abs(Number(output) - 42) < 0.5`, the usual way to ask for a number within
# a tolerance in promptfoo (it has no numeric assertion of its own).
_JS_TOLERANCE = re.compile(
    r"\s*Math\.abs\(\s*(?:Number|parseFloat)\(\s*output(?:\.trim\(\))?\s*\)\s*-\s*"
    r"(?P<target>-?\d+(?:\.\d+)?)\s*\)\s*<=?\s*(?P<tolerance>\d+(?:\.\d+)?)\s*;?\s*"
)
_TEMPLATE_VAR = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def _render(value: Any, variables: dict[str, Any], result: EvalFile, line: int, source: str) -> Any:
    """promptfoo renders {{ var }} in assertion values with the test's vars (in texts and
    lists of texts; schemas are left as written). What it writes is counted in `result`,
    and refused before it is written when the import's total would pass MAX_RENDERED_CHARS."""
    if isinstance(value, list):
        return [_render(item, variables, result, line, source) for item in value]
    if not isinstance(value, str):
        return value
    found = list(_TEMPLATE_VAR.finditer(value))
    texts = {m.group(1): str(variables[m.group(1)]) for m in found if m.group(1) in variables}
    size = len(value) + sum(
        len(texts[m.group(1)]) - len(m.group(0)) for m in found if m.group(1) in texts
    )
    result.rendered_chars += size
    if result.rendered_chars > MAX_RENDERED_CHARS:
        raise ImportFileError(
            f"{{{{ var }}}} references make more than {MAX_RENDERED_CHARS} characters of "
            "assertions; refused",
            line=line,
            source=source,
        )
    return _TEMPLATE_VAR.sub(lambda m: texts.get(m.group(1), m.group(0)), value)


def _texts(value: Any) -> list[str] | None:
    if isinstance(value, list) and value and all(isinstance(v, str | int | float) for v in value):
        return [str(v) for v in value]
    return None


def _map_assertion(kind: str, value: Any, line: int) -> _Mapped | str:
    """Our grader for a promptfoo assertion, or why there is none."""
    if isinstance(value, str) and value.startswith("file://"):
        return "values read from files (file://) are not followed; inline the value"
    scalar = value if isinstance(value, str | int | float) and not isinstance(value, bool) else None
    if kind == "equals":
        if scalar is None:
            return "equals with a structured (JSON) value has no grader here"
        return _Mapped(line, kind, GRADER_EXACT, str(scalar))
    if kind == "contains":
        if scalar is None:
            return "contains needs a text value"
        return _Mapped(line, kind, GRADER_CONTAINS, str(scalar))
    if kind == "icontains":
        if scalar is None:
            return "icontains needs a text value"
        return _Mapped(line, kind, GRADER_REGEX, "(?i)" + re.escape(str(scalar)))
    if kind in ("contains-any", "icontains-any", "contains-all", "icontains-all"):
        texts = _texts(value)
        if texts is None:
            return f"{kind} needs a list of texts"
        flags = "(?i)" if kind.startswith("i") else ""
        if kind.endswith("any"):
            return _Mapped(
                line, kind, GRADER_REGEX, flags + "(?:" + "|".join(map(re.escape, texts)) + ")"
            )
        lookaheads = "".join(f"(?=.*?{re.escape(t)})" for t in texts)
        return _Mapped(line, kind, GRADER_REGEX, flags + r"\A" + lookaheads)
    if kind == "starts-with":
        if scalar is None:
            return "starts-with needs a text value"
        return _Mapped(line, kind, GRADER_REGEX, r"\A" + re.escape(str(scalar)))
    if kind == "regex":
        if scalar is None:
            return "regex needs a pattern"
        return _Mapped(line, kind, GRADER_REGEX, str(scalar))
    if kind in ("is-json", "contains-json"):
        if value is None:
            return _Mapped(line, kind, GRADER_JSON_SCHEMA, json_schema={})
        if isinstance(value, dict):
            return _Mapped(line, kind, GRADER_JSON_SCHEMA, json_schema=dict(value))
        return f"{kind} takes a JSON schema object"
    if kind == "javascript" and isinstance(value, str):
        match = _JS_TOLERANCE.fullmatch(value)
        if match:
            return _Mapped(
                line,
                "javascript (number within tolerance)",
                GRADER_NUMERIC,
                match["target"],
                float(match["tolerance"]),
            )
    if kind.startswith("not-"):
        return "negated assertions have no grader here"
    return "no grader here for this assertion type"


def _promptfoo_string(assertion: str, line: int, source: str, notes: list[str]) -> _Mapped | None:
    """A promptfoo `__expected` CSV cell: `type: value`, a bare type, or plain text (equals)."""
    if assertion.startswith("javascript:") or assertion.startswith("fn:"):
        kind, _, rest = assertion.partition(":")
        return _note_or_mapped(_map_assertion("javascript", rest.strip(), line), kind, line, notes)
    match = re.fullmatch(r"(?P<kind>[a-z][a-z-]*)(?::\s?(?P<value>.*))?", assertion, re.DOTALL)
    if match is None or (
        match["value"] is None and match["kind"] not in ("is-json", "contains-json")
    ):
        return _Mapped(line, "equals", GRADER_EXACT, assertion)
    kind, value = match["kind"], match["value"]
    if kind in ("contains-any", "icontains-any", "contains-all", "icontains-all") and value:
        parsed: Any = next(csv.reader([value], skipinitialspace=True))
    elif kind in ("is-json", "contains-json") and value:
        parsed = parse_json(value, source, line=line, what=f"{kind}: the schema is not valid JSON")
    else:
        parsed = value
    return _note_or_mapped(_map_assertion(kind, parsed, line), kind, line, notes)


def _note_or_mapped(
    mapped: _Mapped | str, kind: str, line: int, notes: list[str]
) -> _Mapped | None:
    if isinstance(mapped, str):
        notes.append(f"line {line}: assertion {kind!r} not imported: {mapped}")
        return None
    return mapped


def _add_assertion_cases(
    result: EvalFile,
    mapped: list[_Mapped],
    name: str,
    case_input: str,
    line: int,
) -> None:
    if not mapped:
        result.notes.append(f"line {line}: test {name!r} not imported: no assertion it can grade")
        return
    if len(mapped) > 1:
        result.notes.append(
            f"line {line}: test {name!r} has {len(mapped)} assertions: one eval case each "
            "(a probe is graded by one)"
        )
    for position, assertion in enumerate(mapped, start=1):
        suffix = f" [{position}: {assertion.label}]" if len(mapped) > 1 else ""
        result.cases.append(
            CaseRow(
                line=line,
                name=(name[: NAME_MAX - len(suffix)] + suffix),
                input=case_input,
                grader=assertion.grader,
                expected=assertion.expected,
                tolerance=assertion.tolerance,
                json_schema=assertion.json_schema,
            )
        )


def _line(node: Any, fallback: int) -> int:
    return node.line if isinstance(node, _Located) else fallback


def _prompt_var(prompts: Any) -> str:
    """The one var the config's prompts insert, if there is exactly one: the case's input."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, list):
        return ""
    names = {m.group(1) for p in prompts if isinstance(p, str) for m in _TEMPLATE_VAR.finditer(p)}
    return names.pop() if len(names) == 1 else ""


def _parse_promptfoo(text: str, source: str, stem: str, input_var: str) -> EvalFile:
    result = EvalFile()
    try:
        loader = _LineLoader(text, source)
        try:
            document = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ImportFileError(f"not valid YAML: {exc.problem}", line=line, source=source) from None
    except yaml.YAMLError as exc:
        raise ImportFileError(f"not valid YAML: {exc}", source=source) from None
    default_asserts: list[Any] = []
    default_vars: dict[str, Any] = {}
    if isinstance(document, list):
        tests: Any = document
    elif isinstance(document, dict):
        tests = document.get("tests")
        if isinstance(tests, str):
            raise ImportFileError(
                f"tests refers to {tests!r}: import that file itself",
                line=_line(document, 1),
                source=source,
            )
        default = document.get("defaultTest") or {}
        if not isinstance(default, dict):
            raise ImportFileError(
                "defaultTest must be a mapping", line=_line(document, 1), source=source
            )
        default_asserts = default.get("assert") or []
        default_vars = default.get("vars") or {}
        if not isinstance(default_asserts, list) or not isinstance(default_vars, dict):
            raise ImportFileError(
                "defaultTest: assert must be a list and vars a mapping",
                line=_line(default, 1),
                source=source,
            )
        skipped = sorted(k for k in document if k not in ("tests", "defaultTest", "description"))
        if skipped:
            result.notes.append(
                f"line 1: not imported: {', '.join(skipped)} (the task holds the prompt; "
                "its routes are the providers)"
            )
    else:
        raise ImportFileError(
            "expected a promptfoo config (with tests) or a list of tests", line=1, source=source
        )
    if not input_var and isinstance(document, dict):
        input_var = _prompt_var(document.get("prompts"))
    if not isinstance(tests, list) or not tests:
        raise ImportFileError("no tests in the file", line=_line(document, 1), source=source)
    for test in tests:
        if not isinstance(test, _Located):
            raise ImportFileError(
                "each test must be a mapping (vars, assert)", line=_line(test, 1), source=source
            )
        _promptfoo_test(test, default_asserts, default_vars, source, stem, input_var, result)
    return result


def _promptfoo_test(
    test: _Located,
    default_asserts: list[Any],
    default_vars: dict[str, Any],
    source: str,
    stem: str,
    input_var: str,
    result: EvalFile,
) -> None:
    line = test.line
    variables = test.get("vars") or {}
    if not isinstance(variables, dict):
        raise ImportFileError("vars must be a mapping", line=line, source=source)
    variables = {**default_vars, **variables}
    key = input_var or ("input" if "input" in variables else "")
    if not key:
        if len(variables) != 1:
            raise ImportFileError(
                f"cannot tell which var is the input among {', '.join(map(str, variables)) or 'none'}"
                " (name it `input`, or give the var to use)",
                line=line,
                source=source,
            )
        key = next(iter(variables))
    if key not in variables:
        raise ImportFileError(f"no var {key!r}", line=line, source=source)
    value = variables[key]
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise ImportFileError(f"var {key!r} must be text", line=line, source=source)
    asserts = test.get("assert") or []
    if not isinstance(asserts, list):
        raise ImportFileError("assert must be a list", line=line, source=source)
    mapped: list[_Mapped] = []
    for assertion in [*asserts, *default_asserts]:
        at = _line(assertion, line)
        if not isinstance(assertion, dict) or not isinstance(assertion.get("type"), str):
            raise ImportFileError("an assertion needs a type", line=at, source=source)
        kind = assertion["type"]
        rendered = _render(assertion.get("value"), variables, result, at, source)
        found = _note_or_mapped(_map_assertion(kind, rendered, at), kind, at, result.notes)
        if found is not None:
            mapped.append(found)
    name = _name(test.get("description"), stem, line)
    _add_assertion_cases(result, mapped, name, str(value), line)


# --- writing -------------------------------------------------------------------------------


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
