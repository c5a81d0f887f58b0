"""One registry per concept: the admin's wire formats, graders and body encodings are the
engine's registries (probes/, which never imports Django), read, not typed again; and a class
name names one class (the engine's results apart from the stored rows, one ConfigError)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from django.contrib.postgres.fields import ArrayField
from django.db import models

from monitor.models import EvalCase, ProbeResult, Provider, Task
from probes import formats, graders, model
from probes.engine import _prepare
from probes.errors import InvalidSpec
from simulator.formats import FORMATS as SIMULATED_FORMATS
from tests.support import ROOT


def _choices(model: type[models.Model], name: str) -> list[tuple[str, str]]:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)
    if isinstance(field, ArrayField):
        field = field.base_field
    return list(field.choices or [])


def test_the_admin_offers_the_engines_wire_formats_with_the_labels_they_declare() -> None:
    wanted = [(f.name, f.label) for f in formats.WIRE_FORMATS.values()]
    assert _choices(Provider, "wire_format") == wanted
    assert all(f.label for f in formats.WIRE_FORMATS.values())


def test_the_simulator_speaks_every_wire_format_the_engine_registers() -> None:
    assert set(SIMULATED_FORMATS) == set(formats.WIRE_FORMATS)


def test_the_admin_offers_exactly_the_graders_the_engine_grades_with() -> None:
    assert _choices(EvalCase, "grader") == list(graders.GRADERS.items())
    for name in graders.GRADERS:  # each one grades; an unknown name is refused
        graders.grade(name, "ANSWER: 4", expected="4", schema={"type": "number"})
    with pytest.raises(graders.GraderError):
        graders.grade("not-a-grader", "ANSWER: 4", expected="4")


def test_the_admin_offers_exactly_the_body_encodings_the_engine_sends() -> None:
    registry = list(model.BODY_ENCODINGS.items())
    assert _choices(ProbeResult, "body_encoding") == registry
    assert _choices(Task, "body_encodings") == registry
    assert _choices(Task, "reference_body_encoding")[1:] == registry  # after "JSON" (auto)


def test_the_engine_prepares_a_request_in_every_body_encoding_it_registers() -> None:
    fmt = formats.WIRE_FORMATS["openai"]
    for encoding in model.BODY_ENCODINGS:
        spec = model.ProbeSpec(
            base_url="http://127.0.0.1:9/v1", model="m", format="openai", body_encoding=encoding
        )
        assert _prepare(spec, fmt, False) is not None
    unknown = model.ProbeSpec(
        base_url="http://127.0.0.1:9/v1", model="m", format="openai", body_encoding="gzip"
    )
    with pytest.raises(InvalidSpec):
        _prepare(unknown, fmt, False)


def _classes(*paths: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for where in paths:
        root = ROOT / where
        for path in [root] if root.suffix == ".py" else sorted(root.rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.ClassDef):
                    found[node.name].append(str(path.relative_to(ROOT)))
    return found


def test_no_stored_row_or_message_shares_its_class_name_with_an_engine_class() -> None:
    ours = _classes("monitor/models", "monitor/pipeline/messages.py")
    engine = _classes("probes")
    assert {name: ours[name] + engine[name] for name in set(ours) & set(engine)} == {}


def test_each_error_class_name_names_one_class() -> None:
    found = _classes("monitor", "probes", "simulator")
    errors = {n: where for n, where in found.items() if n.endswith(("Error", "Exception"))}
    assert {n: where for n, where in errors.items() if len(where) > 1} == {}


def test_the_class_scan_sees_a_duplicate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.py").write_text("class ConfigError(Exception):\n    pass\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert _classes(".")["ConfigError"] == ["a.py", "b.py"]
