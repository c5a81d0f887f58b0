"""Keys and tokens: the regions' signing keys and the application API's read-only tokens."""

from __future__ import annotations

import secrets
from typing import Any

from django.db import models
from django.utils import timezone

from monitor.crypto import (
    decrypt_secret,
    encrypt_secret,
)
from monitor.models.providers import Region


class RegionKey(models.Model):
    """A secret shared by the beat and one region's workers (monitor.pipeline.signing): it
    signs what travels between them and encrypts the provider keys sent to that region.
    Several may be active at once, so a key can be rotated with overlap: give the workers the
    new key, add it here (the newest active key signs), then deactivate the old one."""

    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="keys")
    key_id = models.CharField(max_length=40, unique=True, editable=False)
    # Fernet token (FIELD_ENCRYPTION_KEYS) of the secret; write-only in the admin.
    secret_encrypted = models.TextField(editable=False)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # When it stopped signing: results it sealed still open for a while after
    # (monitor.pipeline.signing.results_grace), so none waiting in a spool, the ingest queue
    # or the dead letters is lost to a rotation. Null while active.
    deactivated_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["region", "-created_at"]

    def __str__(self) -> str:
        return f"{self.region_id}:{self.key_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Deactivated in the admin (or anywhere that saves the row): note when.
        if self.is_active:
            self.deactivated_at = None
        elif (
            self.deactivated_at is None
            and RegionKey.objects.filter(pk=self.pk, is_active=True).exists()
        ):
            self.deactivated_at = timezone.now()
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and "is_active" in update_fields:
            kwargs["update_fields"] = {*update_fields, "deactivated_at"}
        super().save(*args, **kwargs)

    @staticmethod
    def new_key_id() -> str:
        return secrets.token_hex(8)

    @classmethod
    def issue(cls, region: Region) -> tuple[RegionKey, str]:
        """A new active key for the region, and its secret (shown once, stored encrypted)."""
        secret = secrets.token_urlsafe(32)
        key = cls(region=region, key_id=cls.new_key_id())
        key.set_secret(secret)
        key.save()
        return key, secret

    def set_secret(self, secret: str) -> None:
        self.secret_encrypted = encrypt_secret(secret)

    def get_secret(self) -> str:
        return decrypt_secret(self.secret_encrypted)


class ApiToken(models.Model):
    """A read-only token for the application API (/api/v1/). Only its SHA-256 is stored; the
    token itself is shown once, when an admin creates it."""

    name = models.CharField(max_length=100, help_text="Who uses it, e.g. 'checkout gateway'.")
    prefix = models.CharField(max_length=12, editable=False, help_text="To recognise it.")
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
