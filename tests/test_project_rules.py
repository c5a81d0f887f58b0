"""Rules of the project layout that a quick look can check.

Import rules read every import with `ast`, at module level and inside functions alike (a
function-local import is still a dependency, and still a circle when it closes one).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.support import ROOT

SHIPPED = ("monitor", "probes", "simulator")


@cache
def _modules() -> dict[str, Path]:
    """Module name -> file, for every module of the shipped packages."""
    out = {}
    for package in SHIPPED:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imported(module: str) -> Iterator[tuple[str, int]]:
    """(absolute name, line) of everything `module` imports."""
    path = _modules()[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # A submodule (`from probes import prompts`) is that module, not its package:
                # the package's __init__ runs for any import of a submodule, so counting it
                # would make a circle of every package that imports its own submodules.
                full = f"{base}.{alias.name}"
                yield (full if full in _modules() else base), node.lineno


def _internal(name: str) -> str | None:
    """The shipped module an imported name lives in (its longest known prefix)."""
    while name and name not in _modules():
        name = name.rpartition(".")[0]
    return name or None


def _offending_imports(where: str, forbidden: tuple[str, ...]) -> list[str]:
    found = set()
    for module in _modules():
        if module == where or module.startswith(f"{where}."):
            for name, line in _imported(module):
                if any(name == f or name.startswith(f"{f}.") for f in forbidden):
                    found.add(f"{module}:{line} imports {name}")
    return sorted(found)


def _import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in _modules()}
    for module in graph:
        for name, _ in _imported(module):
            target = _internal(name)
            if target and target != module:
                graph[module].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_probes_never_imports_django() -> None:
    assert _offending_imports("probes", ("django",)) == []
    assert _offending_imports("probes", ("monitor",)) == []


def test_only_monitor_tasks_sends_to_the_broker() -> None:
    """monitor/tasks.py is the one door to the broker: the scheduler and races return what to
    send (monitor.pipeline.messages.Dispatch), the region worker returns its results."""
    senders = {"apply_async", "delay", "send_task"}
    offenders = []
    for module, path in _modules().items():
        if module == "monitor.tasks":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in senders
            ):
                offenders.append(f"{module}:{node.lineno} calls .{node.func.attr}()")
    assert offenders == []
    # The rule holds because the door is used: tasks.py does send.
    tasks_src = _modules()["monitor.tasks"].read_text()
    assert tasks_src.count(".apply_async(") >= 2


def test_stats_and_pipeline_never_import_pages_or_digest() -> None:
    forbidden = ("monitor.pages", "monitor.digest")
    assert _offending_imports("monitor.stats", forbidden) == []
    assert _offending_imports("monitor.pipeline", forbidden) == []


def test_only_the_urlconf_and_admin_import_the_read_api() -> None:
    """The API reads the pages' snapshot; nothing below it depends on the API."""
    for package in ("monitor.pages", "monitor.stats", "monitor.pipeline", "monitor.digest"):
        assert _offending_imports(package, ("monitor.api",)) == []
    assert "monitor.api.tokens" in _import_graph()["monitor.admin"]


def test_digest_never_imports_pages() -> None:
    assert _offending_imports("monitor.digest", ("monitor.pages",)) == []


def test_alerts_never_import_pages_the_api_or_the_digest() -> None:
    """Alerts read the answer, the stats and models; /metrics imports alerts, not the reverse."""
    forbidden = ("monitor.pages", "monitor.api", "monitor.digest", "monitor.tasks")
    assert _offending_imports("monitor.alerts", forbidden) == []
    for package in ("monitor.answer", "monitor.stats", "monitor.pipeline"):
        assert _offending_imports(package, ("monitor.alerts",)) == []


def test_the_answer_imports_no_page_no_api_and_no_digest() -> None:
    """monitor/answer/ (the decision, its board and its history) sits under everything that
    shows it: pages, the read API, /metrics, the digest."""
    forbidden = ("monitor.pages", "monitor.api", "monitor.digest", "monitor.tasks")
    assert _offending_imports("monitor.answer", forbidden) == []
    assert _offending_imports("monitor.stats", ("monitor.answer",)) == []
    assert _offending_imports("monitor.pipeline", ("monitor.answer",)) == []


def test_nothing_but_the_urlconf_and_template_tags_imports_pages() -> None:
    importers = {
        module
        for module, targets in _import_graph().items()
        if not module.startswith("monitor.pages")
        and any(t.startswith("monitor.pages") for t in targets)
    }
    assert importers <= {"monitor.urls", "monitor.templatetags.rw_pages"}, importers
    assert "monitor.urls" in importers  # the rule sees the one importer that must be there


def test_nothing_shipped_imports_the_local_dev_stack() -> None:
    for package in SHIPPED:
        assert _offending_imports(package, ("devstack",)) == []


def test_the_rules_see_function_level_and_relative_imports(tmp_path: Path) -> None:
    """A check that finds nothing must be able to find something."""
    graph = _import_graph()
    # monitor/apps.py imports monitor.answer.board inside ready().
    assert "monitor.answer.board" in graph["monitor.apps"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_scheduler_races_and_tasks_import_in_no_circle() -> None:
    touching = [
        c
        for c in _circles(_import_graph())
        if any(m == "monitor.tasks" or m.startswith("monitor.pipeline") for m in c)
    ]
    assert touching == []


def test_no_module_imports_in_a_circle() -> None:
    assert _circles(_import_graph()) == []


def test_templates_load_nothing_from_a_cdn() -> None:
    pattern = re.compile(r'(src|href)="https?://', re.IGNORECASE)
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "templates").rglob("*.html")
        if pattern.search(path.read_text())
    ]
    assert offenders == []
    assert (ROOT / "static/vendor/htmx-2.0.11/htmx.min.js").stat().st_size > 10_000
    assert (ROOT / "static/vendor/chartjs-4.6.1/chart.umd.min.js").stat().st_size > 100_000
    swagger = ROOT / "static/vendor/swagger-ui-dist-5.35.0"
    assert (swagger / "swagger-ui-bundle.js").stat().st_size > 1_000_000
    # Its stylesheet fetches nothing from elsewhere (fonts and images are data: URLs).
    assert not re.search(r"url\((?!['\"]?data:)|@import", (swagger / "swagger-ui.css").read_text())


def test_the_compose_file_is_valid(tmp_path) -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        if os.environ.get("RW_CI"):
            pytest.fail("docker-compose is missing in CI (.ci/run installs it)")
        pytest.skip("docker-compose is not installed")
    (tmp_path / "docker-compose.yml").write_text((ROOT / "docker-compose.yml").read_text())
    (tmp_path / ".env").write_text((ROOT / ".env.example").read_text())
    result = subprocess.run(
        [binary, "config", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    services = subprocess.run(
        [binary, "config", "--services"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    ).stdout.split()
    for name in ["postgres", "redis", "web", "beat", "ingest", "worker-us-east"]:
        assert name in services
