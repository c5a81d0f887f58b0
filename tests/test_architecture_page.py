"""docs/architecture.md lists every folder and module of the code ("Every module"), and only
those that exist: adding, moving or removing a module without the page saying so fails here."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import ROOT

PAGE = ROOT / "docs" / "architecture.md"
# The code the page describes; tests, migrations and packages' __init__.py are not listed.
CODE = ("monitor", "probes", "simulator", "devstack", "bench")
FOLDER = re.compile(r"^### `([\w/]+/)`\s*$")
MODULE = re.compile(r"^- `([\w.]+\.py)`: \S")


def listed(page: str) -> set[str]:
    """The modules the page's "Every module" section names, as paths from the root."""
    found: set[str] = set()
    folder = None
    section = page.split("\n## Every module\n", 1)
    for line in (section[1] if len(section) == 2 else "").splitlines():
        if heading := FOLDER.match(line):
            folder = heading.group(1)
        elif (module := MODULE.match(line)) and folder is not None:
            found.add(folder + module.group(1))
        elif line.startswith("## "):
            break
    return found


def existing(root: Path) -> set[str]:
    return {
        str(path.relative_to(root))
        for top in CODE
        for path in (root / top).rglob("*.py")
        if path.name != "__init__.py" and "migrations" not in path.parts
    }


def test_the_architecture_page_lists_every_module_that_exists_and_no_other() -> None:
    on_page = listed(PAGE.read_text())
    in_tree = existing(ROOT)
    assert sorted(in_tree - on_page) == [], "modules the page does not list"
    assert sorted(on_page - in_tree) == [], "modules the page lists that do not exist"


def test_the_check_sees_a_module_added_and_one_removed(tmp_path: Path) -> None:
    for top in CODE:
        (tmp_path / top).mkdir()
    (tmp_path / "monitor" / "kept.py").write_text("")
    (tmp_path / "monitor" / "added.py").write_text("")
    page = "# A\n\n## Every module\n\n### `monitor/`\n\n- `kept.py`: kept.\n- `gone.py`: gone.\n"
    assert existing(tmp_path) - listed(page) == {"monitor/added.py"}
    assert listed(page) - existing(tmp_path) == {"monitor/gone.py"}
