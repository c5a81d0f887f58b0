"""What our code imports from outside: declared in pyproject.toml, and the HTTP stack used
through its public names only.

Every import is read with `ast` (module level and inside functions alike) in the shipped
packages, the local stack, the benchmarks and the tests.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import httpcore2
import httpx2

from tests.support import ROOT

SCANNED = ("monitor", "probes", "simulator", "devstack", "bench", "tests")
OURS = {*SCANNED, "manage"}
STACK = {"httpx2": Path(httpx2.__file__).parent, "httpcore2": Path(httpcore2.__file__).parent}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def _trees() -> dict[Path, ast.Module]:
    return {
        path: ast.parse(path.read_text(), str(path))
        for top in SCANNED
        for path in sorted((ROOT / top).rglob("*.py"))
    }


def _imports() -> Iterator[tuple[Path, int, str]]:
    """(file, line, absolute module name) of every import of ours."""
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, node.lineno, alias.name
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                yield path, node.lineno, node.module


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    names = set()
    for requirement in requirements:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match, requirement
        names.add(_normalized(match.group()))
    return names


def test_every_package_our_code_and_tests_import_is_declared_in_pyproject() -> None:
    declared = _declared()
    distributions = importlib.metadata.packages_distributions()
    undeclared = []
    for path, line, module in _imports():
        top = module.partition(".")[0]
        # _typeshed: the standard library's typing-only names (imported under TYPE_CHECKING).
        if top in sys.stdlib_module_names or top in OURS or top in {"__future__", "_typeshed"}:
            continue
        providers = {_normalized(name) for name in distributions.get(top, [])}
        if not providers & declared:
            where = f"{path.relative_to(ROOT)}:{line}"
            undeclared.append(f"{where} imports {module} ({', '.join(providers) or 'no package'})")
    assert not undeclared, "\n".join(undeclared)


def test_the_http_stack_is_httpx2_and_httpcore2_through_public_modules_only() -> None:
    """httpx / httpcore 0.x-1.x no longer move; httpx2 / httpcore2 continue them. Their private
    modules (`httpcore2._utils`...) can change in any release: none is imported."""
    wrong = []
    for path, line, module in _imports():
        parts = module.split(".")
        if parts[0] in ("httpx", "httpcore") or (
            parts[0] in STACK and any(part.startswith("_") for part in parts[1:])
        ):
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


@cache
def _stack_private_attributes() -> frozenset[str]:
    """Names of the private attributes httpx2's and httpcore2's objects set on themselves."""
    names = set()
    for package in STACK.values():
        for path in package.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "self"
                    and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                ):
                    names.add(node.attr)
    return frozenset(names)


def _is_super_call(node: ast.expr) -> bool:
    """`super().x`: an overriding method calling the one it overrides (the overrides of
    probes/transport.py's _HTTP11, pinned to httpcore2's minor version), not another object's
    insides."""
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def test_no_private_attribute_of_httpx2_or_httpcore2_objects_is_reached_into() -> None:
    """`transport._pool = pool` and `response.stream._stream._httpcore_stream` were how the
    engine once reached httpx's insides; the backend now goes in through httpcore2's public
    `network_backend=` and the body comes out through ProbeTransport's response extension."""
    private = _stack_private_attributes()
    assert {"_pool", "_httpcore_stream", "_network_backend"} <= private  # the scan sees them
    reached = []
    for path, tree in _trees().items():
        if path.parent.name != "probes" or path.parent.parent != ROOT:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and not _is_super_call(node.value)
            ):
                reached.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
    assert not reached, "\n".join(reached)
