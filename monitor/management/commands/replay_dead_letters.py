from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import InterfaceError, OperationalError

from monitor.pipeline import queues


class Command(BaseCommand):
    help = (
        "Ingest again the messages parked in the dead-letter list (results the database would "
        "not take for longer than ingest's retries), oldest first, each checked like a new "
        "message (its region's signature, that region's open slots). Safe to repeat: a result "
        "already stored is never stored twice."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--limit", type=int, default=None, help="replay at most this many")

    def handle(self, *args: Any, **options: Any) -> None:
        waiting = queues.dead_letter_count()
        try:
            replayed, stored = queues.replay_dead_letters(options["limit"])
        except (OperationalError, InterfaceError) as exc:
            raise CommandError(
                f"The database is still unavailable ({type(exc).__name__}); the messages stay "
                "parked. Run this again once it is back."
            ) from None
        self.stdout.write(
            f"{replayed} of {waiting} parked messages replayed: {stored} results newly stored; "
            f"{queues.dead_letter_count()} still parked."
        )
        malformed = queues.malformed_dead_letter_count()
        if malformed:
            self.stdout.write(
                f"{malformed} malformed letters are kept aside, never replayed, in the Redis "
                f"list {queues.DEAD_LETTER_MALFORMED_KEY}."
            )
