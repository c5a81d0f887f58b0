from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from monitor.imports import quality
from monitor.imports.base import ImportFileError, read_bounded


class Command(BaseCommand):
    help = (
        "Set routes' external quality index from a CSV of model_id,index "
        "(optionally a provider column with provider slugs)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file")
        parser.add_argument("--dry-run", action="store_true", help="show, do not write")

    def handle(self, *args: Any, **options: Any) -> None:
        path: str = options["file"]
        try:
            rows = quality.parse(read_bounded(path), path)
            report = quality.import_quality(rows, dry_run=options["dry_run"])
        except ImportFileError as exc:
            raise CommandError(str(exc)) from None
        for line in report.changes:
            self.stdout.write(line)
        for note in report.notes:
            self.stderr.write(f"note: {note}")
        self.stdout.write(f"Routes: {report.summary()}")
