"""manage.py import_quality: an external quality index per model id, from a CSV."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from monitor.models import Route
from tests.monitor import factories as f

FIXTURE = Path(__file__).parent / "fixtures" / "quality.csv"


@pytest.fixture
def routes(db: None) -> dict[str, Route]:
    openai, groq, together = f.provider("openai"), f.provider("groq"), f.provider("together")
    return {
        "mini": f.route(openai, "gpt-4o-mini"),
        "groq-oss": f.route(groq, "openai/gpt-oss-20b"),
        "together-oss": f.route(together, "openai/gpt-oss-20b", quality_index=10.0),
        "other": f.route(openai, "gpt-4.1", quality_index=47.0),
    }


def _run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("import_quality", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def _index(route: Route) -> float | None:
    route.refresh_from_db()
    return route.quality_index


def test_each_route_gets_its_models_index_and_a_provider_row_wins(routes) -> None:
    out, err = _run(str(FIXTURE))
    assert _index(routes["mini"]) == 36.2
    assert _index(routes["groq-oss"]) == 51.9  # the row naming groq
    assert _index(routes["together-oss"]) == 52.4  # the row for any provider
    assert _index(routes["other"]) == 47.0  # not in the file: kept
    assert "line 3: no route for 'claude-haiku-4-5'" in err
    assert "line 6: no route for 'retired-model-1'" in err
    assert "3 updated" in out


def test_a_dry_run_writes_nothing(routes) -> None:
    out, _ = _run(str(FIXTURE), "--dry-run")
    assert "Together / openai/gpt-oss-20b: quality index 10.0 -> 52.4" in out
    assert _index(routes["together-oss"]) == 10.0


def test_a_bad_index_names_the_line_and_changes_nothing(routes, tmp_path: Path) -> None:
    bad = tmp_path / "index.csv"
    bad.write_text("model,index\ngpt-4o-mini,40\ngpt-4.1,n/a\n")
    with pytest.raises(CommandError, match=r"index.csv, line 3: the index 'n/a' is not a number"):
        _run(str(bad))
    assert _index(routes["mini"]) is None
    bad.write_text("model,score\ngpt-4o-mini,40\n")
    with pytest.raises(CommandError, match=r"line 1: the header needs one of the columns index"):
        _run(str(bad))
    bad.write_text("model,index\ngpt-4o-mini,40\ngpt-4o-mini,41\n")
    with pytest.raises(
        CommandError, match=r"line 3: 'gpt-4o-mini' is listed twice \(first on line 2\)"
    ):
        _run(str(bad))
