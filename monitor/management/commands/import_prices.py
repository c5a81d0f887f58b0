from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from monitor.imports import prices
from monitor.imports.base import ImportFileError, read_bounded
from monitor.imports.fetch import fetch, is_url

LITELLM_URL = (
    "https://raw.githubusercontent.com/BerriAI/litellm/main/model_prices_and_context_window.json"
)


def _provider_names(pairs: list[str]) -> dict[str, str]:
    names: dict[str, str] = {}
    for pair in pairs:
        slug, sep, name = pair.partition("=")
        if not sep or not slug or not name:
            raise CommandError(f"--provider takes SLUG=LITELLM_PROVIDER, not {pair!r}")
        names[slug] = name
    return names


class Command(BaseCommand):
    help = (
        "Set route prices (input, output, cached input) from LiteLLM's "
        "model_prices_and_context_window.json, a file or an http(s) URL "
        f"(e.g. {LITELLM_URL})."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("source", metavar="FILE_OR_URL")
        parser.add_argument(
            "--dry-run", action="store_true", help="show the changes without writing them"
        )
        parser.add_argument(
            "--provider",
            action="append",
            default=[],
            metavar="SLUG=LITELLM_PROVIDER",
            help="the price file's name for a provider not made from a preset (repeatable)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        source: str = options["source"]
        names = _provider_names(options["provider"])
        try:
            data = fetch(source) if is_url(source) else read_bounded(source)
            entries = prices.parse(data, source)
            report = prices.import_prices(entries, dry_run=options["dry_run"], provider_names=names)
        except ImportFileError as exc:
            raise CommandError(str(exc)) from None
        for line in report.changes:
            self.stdout.write(line)
        for note in report.notes:
            self.stderr.write(f"note: {note}")
        self.stdout.write(f"Routes: {report.summary()}")
