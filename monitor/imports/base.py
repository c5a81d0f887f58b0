"""What every import shares: its error, its report, reading a local file within a bound,
reading JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The largest file an import reads. LiteLLM's price file is about 1.6 MB (2025); eval sets
# and index tables are smaller. Beyond this, the source is not what we expect.
MAX_IMPORT_BYTES = 16 * 1024 * 1024


class ImportFileError(Exception):
    """The file cannot be imported as it is; nothing was changed. Names the line (1-based)
    where it is known."""

    def __init__(self, message: str, *, line: int | None = None, source: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.source = source

    def __str__(self) -> str:
        where = self.source or "the file"
        if self.line is not None:
            where += f", line {self.line}"
        return f"{where}: {self.message}"


@dataclass
class Report:
    """What an import did (or, in a dry run, would do)."""

    dry_run: bool = False
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    changes: list[str] = field(default_factory=list)
    # Read but not imported, or imported with a caveat: shown to whoever ran the import.
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        verb = "would be" if self.dry_run else "were"
        return (
            f"{self.created} created, {self.updated} updated, {self.unchanged} unchanged "
            f"({'dry run: nothing ' + verb + ' written' if self.dry_run else 'saved'}); "
            f"{len(self.notes)} note(s)."
        )


def read_bounded(path: str | Path, limit: int = MAX_IMPORT_BYTES) -> bytes:
    """A local file's bytes, refused when larger than `limit`."""
    file = Path(path)
    try:
        with file.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise ImportFileError(f"cannot read it: {exc.strerror}", source=str(path)) from None
    if len(data) > limit:
        raise ImportFileError(f"larger than {limit} bytes; refused", source=str(path))
    return data


def decode(data: bytes, source: str) -> str:
    """UTF-8 text (a leading byte-order mark, as spreadsheets write, is dropped)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ImportFileError("not UTF-8 text", line=line, source=source) from None


def parse_json(
    text: str,
    source: str,
    *,
    line: int | None = None,
    what: str = "not valid JSON",
    parse_float: Callable[[str], Any] | None = None,
) -> Any:
    """json.loads, each way it fails an ImportFileError starting with `what`: a syntax error
    (at its line in `text`, unless `line` says where `text` is), and the two json raises as
    other errors: nesting deeper than Python's stack, an integer longer than Python converts."""
    try:
        return json.loads(text, parse_float=parse_float)
    except json.JSONDecodeError as exc:
        raise ImportFileError(
            f"{what}: {exc.msg} (column {exc.colno})",
            line=exc.lineno if line is None else line,
            source=source,
        ) from None
    except RecursionError:
        raise ImportFileError(f"{what}: nested too deeply", line=line, source=source) from None
    except ValueError:
        raise ImportFileError(
            f"{what}: an integer of more than {sys.get_int_max_str_digits()} digits",
            line=line,
            source=source,
        ) from None
