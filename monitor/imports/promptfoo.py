"""promptfoo YAML eval files (monitor.imports.evals): a config with `tests` (and `defaultTest`)
or a bare list of tests, each test's `vars` the input and its `assert` list the graders; its
assertion strings (`contains: Paris`) in CSV files too. Read with line numbers, bounded (nodes,
depth, rendered size), YAML aliases refused.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from typing import Any

import yaml

from monitor.imports.base import MAX_IMPORT_BYTES, ImportFileError, parse_json
from monitor.imports.eval_cases import NAME_MAX, CaseRow, EvalFile, case_name
from monitor.models import (
    GRADER_CONTAINS,
    GRADER_EXACT,
    GRADER_JSON_SCHEMA,
    GRADER_NUMERIC,
    GRADER_REGEX,
)


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


def render_vars(
    value: Any, variables: dict[str, Any], result: EvalFile, line: int, source: str
) -> Any:
    """promptfoo renders {{ var }} in assertion values with the test's vars (in texts and
    lists of texts; schemas are left as written). What it writes is counted in `result`,
    and refused before it is written when the import's total would pass MAX_RENDERED_CHARS."""
    if isinstance(value, list):
        return [render_vars(item, variables, result, line, source) for item in value]
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


def promptfoo_string(assertion: str, line: int, source: str, notes: list[str]) -> _Mapped | None:
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


def add_assertion_cases(
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


def parse_promptfoo(text: str, source: str, stem: str, input_var: str) -> EvalFile:
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
        rendered = render_vars(assertion.get("value"), variables, result, at, source)
        found = _note_or_mapped(_map_assertion(kind, rendered, at), kind, at, result.notes)
        if found is not None:
            mapped.append(found)
    name = case_name(test.get("description"), stem, line)
    add_assertion_cases(result, mapped, name, str(value), line)
