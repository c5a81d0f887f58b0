from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from monitor.imports import eval_cases, evals
from monitor.imports.base import ImportFileError, read_bounded
from monitor.models import GRADER_EXACT, GRADERS, Task


class Command(BaseCommand):
    help = (
        "Create or update a task's eval cases from a CSV, JSONL (OpenAI evals input/ideal) or "
        "promptfoo YAML file. Cases are matched by name; nothing changes if any line is bad."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task", help="the task's slug")
        parser.add_argument("file")
        parser.add_argument("--format", choices=eval_cases.FORMATS, help="default: by extension")
        parser.add_argument(
            "--grader",
            choices=[key for key, _ in GRADERS],
            default=GRADER_EXACT,
            help="for cases that give only an expected answer (JSONL ideal, CSV without grader)",
        )
        parser.add_argument("--tolerance", type=float, default=0.0, help="for --grader numeric")
        parser.add_argument(
            "--input-var", default="", help="the promptfoo var (or CSV column) holding the input"
        )
        parser.add_argument("--dry-run", action="store_true", help="show, do not write")
        parser.add_argument(
            "--strict",
            action="store_true",
            help="fail (change nothing) if any assertion or field is not imported",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        task = Task.objects.filter(slug=options["task"]).first()
        if task is None:
            raise CommandError(f"no task with the slug {options['task']!r}")
        path: str = options["file"]
        try:
            parsed = evals.parse(
                read_bounded(path),
                path,
                fmt=options["format"],
                grader=options["grader"],
                tolerance=options["tolerance"],
                input_var=options["input_var"],
            )
            if options["strict"] and parsed.notes:
                raise CommandError(
                    "not imported (--strict):\n" + "\n".join(f"  {n}" for n in parsed.notes)
                )
            report = evals.import_cases(task, parsed, source=path, dry_run=options["dry_run"])
        except ImportFileError as exc:
            raise CommandError(str(exc)) from None
        for line in report.changes:
            self.stdout.write(line)
        for note in report.notes:
            self.stderr.write(f"note: {note}")
        self.stdout.write(f"Eval cases of {task.slug}: {report.summary()}")
