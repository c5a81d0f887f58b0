"""An external quality index per model (for example Artificial Analysis' Intelligence Index),
from a CSV file with a header: a model id column (`model_id` or `model`), an index column
(`index`, `quality_index` or `intelligence_index`) and optionally `provider` (a provider slug)
when the same model id scores differently at two providers. An empty index clears it."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

from django.db import transaction

from monitor.imports.base import ImportFileError, Report, decode
from monitor.models import Route

MODEL_COLUMNS = ("model_id", "model")
INDEX_COLUMNS = ("index", "quality_index", "intelligence_index")


@dataclass(frozen=True)
class IndexRow:
    line: int
    model_id: str
    provider: str
    index: float | None


def _column(header: list[str], names: tuple[str, ...], source: str) -> str:
    for name in names:
        if name in header:
            return name
    raise ImportFileError(
        f"the header needs one of the columns {', '.join(names)} (it has {', '.join(header)})",
        line=1,
        source=source,
    )


def parse(data: bytes, source: str) -> list[IndexRow]:
    text = decode(data, source)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h.strip().lower() for h in reader.fieldnames or []]
    if not header:
        raise ImportFileError("empty file: expected a header line", line=1, source=source)
    reader.fieldnames = header
    model_column = _column(header, MODEL_COLUMNS, source)
    index_column = _column(header, INDEX_COLUMNS, source)
    rows: list[IndexRow] = []
    seen: dict[tuple[str, str], int] = {}
    line = reader.line_num + 1
    try:
        for record in reader:
            if None in record:
                raise ImportFileError(
                    f"{len(header) + len(record[None])} fields where the header has {len(header)}",
                    line=line,
                    source=source,
                )
            model_id = (record.get(model_column) or "").strip()
            provider = (record.get("provider") or "").strip()
            raw = (record.get(index_column) or "").strip()
            if not model_id:
                if any((v or "").strip() for v in record.values()):
                    raise ImportFileError("no model id", line=line, source=source)
                line = reader.line_num + 1
                continue  # a blank line
            index: float | None = None
            if raw:
                try:
                    index = float(raw)
                except ValueError:
                    raise ImportFileError(
                        f"the index {raw!r} is not a number", line=line, source=source
                    ) from None
                if not math.isfinite(index):
                    raise ImportFileError(
                        f"the index {raw!r} is not a finite number", line=line, source=source
                    )
            key = (provider, model_id)
            if key in seen:
                raise ImportFileError(
                    f"{model_id!r} is listed twice (first on line {seen[key]})",
                    line=line,
                    source=source,
                )
            seen[key] = line
            rows.append(IndexRow(line, model_id, provider, index))
            line = reader.line_num + 1
    except csv.Error as exc:
        raise ImportFileError(
            f"not valid CSV: {exc}", line=reader.line_num, source=source
        ) from None
    return rows


def import_quality(rows: list[IndexRow], *, dry_run: bool = False) -> Report:
    """Set the quality index of every route whose model id (and provider, where the row names
    one) matches a row; rows matching no route are reported. In one transaction."""
    report = Report(dry_run=dry_run)
    # A row naming a provider wins over a row for the same model id at any provider.
    specific: dict[str, list[str]] = {}
    for row in rows:
        if row.provider:
            specific.setdefault(row.model_id, []).append(row.provider)
    with transaction.atomic():
        for row in rows:
            routes = Route.objects.select_related("provider").filter(model_id=row.model_id)
            if row.provider:
                routes = routes.filter(provider__slug=row.provider)
            else:
                routes = routes.exclude(provider__slug__in=specific.get(row.model_id, []))
            matched = list(routes.order_by("provider__name"))
            if not matched:
                at = f" at provider {row.provider!r}" if row.provider else ""
                report.notes.append(f"line {row.line}: no route for {row.model_id!r}{at}")
                continue
            for route in matched:
                if route.quality_index == row.index:
                    report.unchanged += 1
                    continue
                report.updated += 1
                report.changes.append(
                    f"{route.provider.name} / {route.model_id}: quality index "
                    f"{route.quality_index} -> {row.index}"
                )
                Route.objects.filter(pk=route.pk).update(quality_index=row.index)
        if dry_run:
            transaction.set_rollback(True)
    return report
