"""manage.py import_evals: eval cases from promptfoo YAML, OpenAI evals JSONL and CSV."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from monitor.imports import evals, promptfoo
from monitor.imports.base import ImportFileError
from monitor.models import EvalCase, Task
from probes.graders import grade
from tests.monitor import factories as f

FIXTURES = Path(__file__).parent / "fixtures"
PROMPTFOO = FIXTURES / "promptfooconfig.yaml"


@pytest.fixture
def task(db: None) -> Task:
    return f.task("facts", [], [])


def _run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("import_evals", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _cases(task: Task) -> dict[str, EvalCase]:
    return {c.name: c for c in EvalCase.objects.filter(task=task)}


def _line_of(path: Path, text: str) -> int:
    content = path.read_text()
    return content.count("\n", 0, content.index(text)) + 1


def _passes(case: EvalCase, output: str) -> bool:
    return grade(case.grader, output, case.expected, case.json_schema, case.tolerance)


def test_a_promptfoo_config_becomes_one_case_per_assertion_it_can_grade(task: Task) -> None:
    out, _ = _run("facts", str(PROMPTFOO))
    cases = _cases(task)
    colour_line = _line_of(PROMPTFOO, "  - vars:\n      question: Name a primary colour.")
    assert sorted(cases) == sorted(
        [
            "capital of France",
            "two plus two [1: equals]",
            "two plus two [2: javascript (number within tolerance)]",
            "a JSON answer [1: is-json]",
            "a JSON answer [2: contains-any]",
            f"promptfooconfig:{colour_line}",
        ]
    )
    assert cases["capital of France"].input == "What is the capital of France?"
    assert (
        cases["two plus two [1: equals]"].grader,
        cases["two plus two [1: equals]"].expected,
    ) == ("exact", "4")
    numeric = cases["two plus two [2: javascript (number within tolerance)]"]
    assert (numeric.grader, numeric.expected, numeric.tolerance) == ("numeric", "4", 0.01)
    assert cases["a JSON answer [1: is-json]"].json_schema == {
        "type": "object",
        "required": ["capital"],
        "properties": {"capital": {"type": "string"}},
    }
    assert "6 created" in out


def test_assertions_it_cannot_grade_are_reported_with_their_line(task: Task) -> None:
    _, err = _run("facts", str(PROMPTFOO))
    rubric_line = _line_of(PROMPTFOO, "    - type: llm-rubric")
    not_contains_line = _line_of(PROMPTFOO, "      - type: not-contains")
    similar_line = _line_of(PROMPTFOO, "      - type: similar")
    haiku_line = _line_of(PROMPTFOO, "  - description: rain haiku")
    assert f"line {rubric_line}: assertion 'llm-rubric' not imported" in err
    assert f"line {not_contains_line}: assertion 'not-contains' not imported: negated" in err
    assert f"line {similar_line}: assertion 'similar' not imported" in err
    assert f"line {haiku_line}: test 'rain haiku' not imported: no assertion it can grade" in err
    assert "not imported: prompts, providers" in err


def test_imported_promptfoo_cases_grade_outputs_as_promptfoo_would(task: Task) -> None:
    _run("facts", str(PROMPTFOO))
    cases = _cases(task)
    capital = cases["capital of France"]
    assert _passes(capital, "The capital is PARIS.")
    assert not _passes(capital, "The capital is Lyon.")
    numeric = cases["two plus two [2: javascript (number within tolerance)]"]
    assert _passes(numeric, "4.005")
    assert not _passes(numeric, "4.5")
    # {{city}} rendered from the test's vars, as promptfoo does.
    any_of = cases["a JSON answer [2: contains-any]"]
    assert _passes(any_of, '{"capital": "東京"}')
    assert _passes(any_of, '{"capital": "Tokyo"}')
    assert not _passes(any_of, '{"capital": "Kyoto"}')
    schema = cases["a JSON answer [1: is-json]"]
    assert _passes(schema, '{"capital": "Tokyo"}')
    assert not _passes(schema, '{"city": "Tokyo"}')


def test_openai_evals_jsonl_keeps_the_user_message_and_grades_the_ideal(task: Task) -> None:
    path = FIXTURES / "completions.jsonl"
    out, err = _run("facts", str(path), "--grader", "contains")
    cases = _cases(task)
    assert "3 created" in out
    first = cases["completions:1"]
    assert (first.input, first.grader, first.expected) == ("Once upon a ", "contains", "time")
    assert "line 1: kept the last user message; not imported: system message(s)" in err
    # Several ideal answers: any of them.
    several = cases["completions:3"]
    assert several.grader == "regex"
    assert _passes(several, "It was made by Open AI.")
    assert _passes(several, "OpenAI")
    assert not _passes(several, "Google")


def test_a_csv_of_our_graders_is_imported_as_written(task: Task) -> None:
    _run("facts", str(FIXTURES / "cases.csv"))
    cases = _cases(task)
    assert (cases["sum"].grader, cases["sum"].expected, cases["sum"].tolerance) == (
        "numeric",
        "42",
        0.5,
    )
    assert cases["capital"].grader == "contains"
    assert cases["json"].input == 'Reply with {"ok": true}'
    assert cases["json"].json_schema == {"type": "object", "required": ["ok"]}


def test_a_promptfoo_csv_maps_its_expected_column(task: Task) -> None:
    _, err = _run("facts", str(FIXTURES / "promptfoo_tests.csv"))
    cases = _cases(task)
    assert sorted(cases) == ["promptfoo_tests:2", "promptfoo_tests:3"]
    assert cases["promptfoo_tests:2"].grader == "regex"
    assert (cases["promptfoo_tests:3"].grader, cases["promptfoo_tests:3"].expected) == (
        "exact",
        "4",
    )
    assert "line 4: assertion 'llm-rubric' not imported" in err


def test_importing_again_updates_cases_by_name(task: Task, tmp_path: Path) -> None:
    _run("facts", str(FIXTURES / "cases.csv"))
    out, _ = _run("facts", str(FIXTURES / "cases.csv"))
    assert "0 created, 0 updated, 3 unchanged" in out
    changed = tmp_path / "cases.csv"
    changed.write_text((FIXTURES / "cases.csv").read_text().replace("Rome", "Roma"))
    out, _ = _run("facts", str(changed))
    assert "0 created, 1 updated, 2 unchanged" in out
    assert _cases(task)["capital"].expected == "Roma"


def test_a_dry_run_writes_nothing(task: Task) -> None:
    out, _ = _run("facts", str(PROMPTFOO), "--dry-run")
    assert "new case 'capital of France' (regex)" in out
    assert "dry run" in out
    assert not EvalCase.objects.exists()


def test_strict_refuses_a_file_with_anything_it_would_not_import(task: Task) -> None:
    with pytest.raises(CommandError, match="not imported \\(--strict\\)"):
        _run("facts", str(PROMPTFOO), "--strict")
    assert not EvalCase.objects.exists()


@pytest.fixture
def existing(task: Task) -> EvalCase:
    return EvalCase.objects.create(task=task, name="kept", input="x", grader="exact", expected="y")


def test_malformed_yaml_names_the_line_and_changes_nothing(
    task: Task, existing, tmp_path: Path
) -> None:
    broken = tmp_path / "promptfooconfig.yaml"
    broken.write_text(
        PROMPTFOO.read_text().replace(
            "      question: What is 2 + 2?", "      question: [What is 2 + 2?"
        )
    )
    line = _line_of(broken, "[What is 2 + 2?")
    with pytest.raises(CommandError, match=rf"promptfooconfig.yaml, line {line}: not valid YAML"):
        _run("facts", str(broken))
    assert list(EvalCase.objects.values_list("name", flat=True)) == ["kept"]


def test_a_bad_jsonl_line_is_named_and_the_good_lines_are_not_kept(
    task: Task, existing, tmp_path: Path
) -> None:
    broken = tmp_path / "cases.jsonl"
    lines = (FIXTURES / "completions.jsonl").read_text().splitlines()
    broken.write_text("\n".join([lines[0], lines[1], lines[2][:-2]]) + "\n")
    with pytest.raises(CommandError, match=r"cases.jsonl, line 3: not valid JSON"):
        _run("facts", str(broken))
    assert list(EvalCase.objects.values_list("name", flat=True)) == ["kept"]


def test_a_jsonl_line_nested_deeper_than_python_reads_is_named(
    task: Task, existing, tmp_path: Path
) -> None:
    deep = tmp_path / "cases.jsonl"
    deep.write_text('{"input": "a", "ideal": "b"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(
        CommandError, match=r"cases.jsonl, line 2: not valid JSON: nested too deeply"
    ):
        _run("facts", str(deep))
    assert list(EvalCase.objects.values_list("name", flat=True)) == ["kept"]


def test_a_case_the_model_refuses_is_named_by_line_and_nothing_is_kept(
    task: Task, existing, tmp_path: Path
) -> None:
    bad = tmp_path / "cases.csv"
    bad.write_text(
        "name,input,grader,expected\nok,What is 1+1?,exact,2\nbroken,Anything,regex,(unclosed\n"
    )
    with pytest.raises(
        CommandError, match=r"cases.csv, line 3: case 'broken': Not a valid regular expression"
    ):
        _run("facts", str(bad))
    assert list(EvalCase.objects.values_list("name", flat=True)) == ["kept"]


def test_an_unknown_grader_in_a_csv_is_named_by_line(task: Task, tmp_path: Path) -> None:
    bad = tmp_path / "cases.csv"
    bad.write_text('name,input,grader,expected\n"multi\nline",x,exact,1\nfuzzy,x,levenshtein,1\n')
    with pytest.raises(CommandError, match=r"line 4: unknown grader 'levenshtein'"):
        _run("facts", str(bad))
    assert not EvalCase.objects.exists()


def test_an_unknown_task_is_refused(db: None) -> None:
    with pytest.raises(CommandError, match="no task with the slug 'nope'"):
        _run("nope", str(PROMPTFOO))


# --- bounded YAML ----------------------------------------------------------------------------


def _promptfoo(tmp_path: Path, text: str) -> str:
    path = tmp_path / "promptfooconfig.yaml"
    path.write_text(text)
    return str(path)


def test_a_yaml_alias_is_refused_by_its_line_even_a_harmless_one(
    task: Task, existing, tmp_path: Path
) -> None:
    config = _promptfoo(
        tmp_path,
        "defaultTest:\n  vars: &shared {input: 'What is 2 + 2?'}\n"
        "tests:\n  - vars: *shared\n    assert: [{type: equals, value: '4'}]\n",
    )
    with pytest.raises(
        CommandError, match=r"line 4: YAML aliases are not accepted \(\*shared\): write the value"
    ):
        _run("facts", config)
    assert list(EvalCase.objects.values_list("name", flat=True)) == ["kept"]


def test_yaml_nested_deeper_than_any_eval_set_is_refused(task: Task, tmp_path: Path) -> None:
    depth = 5000  # deeper than Python's stack: without the bound, a RecursionError
    config = _promptfoo(tmp_path, "tests: " + "[" * depth + "]" * depth + "\n")
    with pytest.raises(CommandError, match=r"line 1: nested more than 64 levels deep; refused"):
        _run("facts", config)


def test_a_yaml_document_of_more_values_than_the_bound_is_refused(
    task: Task, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(promptfoo, "MAX_YAML_NODES", 50)
    tests = "".join(
        f"  - vars: {{input: q{n}}}\n    assert: [{{type: equals, value: a{n}}}]\n"
        for n in range(10)
    )
    config = _promptfoo(tmp_path, "tests:\n" + tests)
    with pytest.raises(CommandError, match=r"line \d+: more than 50 YAML values; refused"):
        _run("facts", config)
    monkeypatch.setattr(promptfoo, "MAX_YAML_NODES", 1000)
    _run("facts", config)
    assert EvalCase.objects.filter(task=task).count() == 10


def test_rendered_var_references_are_bounded_over_the_whole_import(
    task: Task, tmp_path: Path
) -> None:
    # 200 references to a 100 kB input: 20 MB of assertion text from a 100 kB file.
    cases = tmp_path / "cases.csv"
    cases.write_text(f"name,input,__expected\nbig,{'x' * 100_000},contains: {'{{input}}' * 200}\n")
    with pytest.raises(
        ImportFileError, match=r"line 2: \{\{ var \}\} references make more than 16777216"
    ):
        evals.parse(cases.read_bytes(), str(cases))
