from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from monitor.models import Region, RegionKey


class Command(BaseCommand):
    help = (
        "Make a new key for a region's workers and print it once, as the RW_REGION_KEYS entry "
        "they need (key_id:secret). --replace deactivates the region's other keys."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["new"])
        parser.add_argument("region", help="the region's slug")
        parser.add_argument(
            "--replace", action="store_true", help="deactivate the region's other keys"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        region = Region.objects.filter(slug=options["region"]).first()
        if region is None:
            raise CommandError(f"no region with slug {options['region']!r}")
        with transaction.atomic():
            if options["replace"]:
                # Results its workers sealed with the old keys still open for a while
                # (monitor.pipeline.signing.results_grace).
                region.keys.filter(is_active=True).update(
                    is_active=False, deactivated_at=timezone.now()
                )
            key, secret = RegionKey.issue(region)
        self.stdout.write(f"{key.key_id}:{secret}")
