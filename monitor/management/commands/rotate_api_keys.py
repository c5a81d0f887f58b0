from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from monitor.crypto import ApiKeyDecryptionError, rotate_secret
from monitor.models import Provider, RegionKey, Route


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored provider API key, route secret headers and region key secret "
        "with the first of FIELD_ENCRYPTION_KEYS. "
        "Run after putting a new key first; then the old keys can be removed."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        rotated = headers = region_keys = 0
        with transaction.atomic():
            for provider in Provider.objects.select_for_update().exclude(api_key_encrypted=""):
                try:
                    provider.api_key_encrypted = rotate_secret(provider.api_key_encrypted)
                except ApiKeyDecryptionError:
                    raise CommandError(
                        f"The API key of provider {provider.name!r} cannot be decrypted with any "
                        "configured key; nothing was changed."
                    ) from None
                provider.save(update_fields=["api_key_encrypted"])
                rotated += 1
            for route in Route.objects.select_for_update().exclude(secret_headers_encrypted=""):
                try:
                    route.secret_headers_encrypted = rotate_secret(route.secret_headers_encrypted)
                except ApiKeyDecryptionError:
                    raise CommandError(
                        f"The secret headers of route {route!s} cannot be decrypted with any "
                        "configured key; nothing was changed."
                    ) from None
                route.save(update_fields=["secret_headers_encrypted"])
                headers += 1
            # Inactive ones too: they still open results sealed before their rotation
            # (monitor.pipeline.signing.results_grace).
            for key in RegionKey.objects.select_for_update().select_related("region"):
                try:
                    key.secret_encrypted = rotate_secret(key.secret_encrypted)
                except ApiKeyDecryptionError:
                    raise CommandError(
                        f"The secret of region {key.region.slug!r}'s key {key.key_id} cannot be "
                        "decrypted with any configured key; nothing was changed."
                    ) from None
                key.save(update_fields=["secret_encrypted"])
                region_keys += 1
        self.stdout.write(
            self.style.SUCCESS(
                f"Re-encrypted {rotated} API key(s), {headers} route secret header set(s) and "
                f"{region_keys} region key(s)."
            )
        )
