"""Configuration: where probes go. Providers (a base URL, a wire format, an encrypted key),
their routes (a model and its request settings, prices) and the regions probes run from."""

from __future__ import annotations

import ipaddress
import json
import socket
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from monitor import headers
from monitor.crypto import (
    decrypt_bound,
    encrypt_bound,
    origin_of,
)
from monitor.models.choices import (
    BEDROCK_SERVICE_TIERS,
    BODY_JSON,
    BODY_MSGPACK_GZIP,
    EFFORT_WITHIN_CAP,
    MIN_THINKING_BUDGET,
    OPENAI_BODIES,
    REASONING_ALLOWANCE_TOKENS,
    REASONING_EFFORTS,
    RESERVED_BODY_KEYS,
    SERVICE_TIERS,
    TAKES_REASONING_EFFORT,
    TAKES_THINKING_BUDGET,
    TOKEN_LIMIT_MAX_COMPLETION_TOKENS,
    TOKEN_LIMIT_MAX_TOKENS,
    TOKEN_LIMIT_PARAMS,
    WIRE_AZURE,
    WIRE_BEDROCK,
    WIRE_FORMATS,
    WIRE_GEMINI,
    WIRE_OPENAI,
)
from probes.transport import address_allowed

slug_validator = RegexValidator(
    r"^[a-z0-9]+(?:-[a-z0-9]+)*$", "Use lowercase letters, digits and single hyphens."
)


def check_provider_url(url: str, *, allow_private: bool | None = None) -> None:
    """Refuse URLs that are not http(s) or that resolve to private, loopback or link-local
    addresses (unless PROVIDER_ALLOW_PRIVATE_NETWORKS). The probe engine checks the
    resolved address again at connect time."""
    if allow_private is None:
        allow_private = settings.PROVIDER_ALLOW_PRIVATE_NETWORKS
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http"):
        raise ValidationError("The base URL must start with https:// (or http://).")
    if parts.scheme == "http" and not allow_private:
        raise ValidationError("Plain http:// is allowed only for private test networks.")
    if not parts.hostname:
        raise ValidationError("The base URL has no host name.")
    if parts.username or parts.password:
        raise ValidationError("Put credentials in the API key field, not in the URL.")
    if allow_private:
        return
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise ValidationError(f"The host {parts.hostname!r} does not resolve.") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address_allowed(str(address)):
            raise ValidationError(
                f"{parts.hostname} resolves to a non-public address ({address}); "
                "set PROVIDER_ALLOW_PRIVATE_NETWORKS=true to allow it."
            )


class Provider(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True, validators=[slug_validator])
    base_url = models.CharField(
        max_length=500,
        help_text="For OpenAI format, the URL ending in /v1; for Anthropic, the URL before /v1.",
    )
    wire_format = models.CharField(max_length=20, choices=WIRE_FORMATS, default=WIRE_OPENAI)
    aws_region = models.CharField(
        "AWS region",
        max_length=30,
        blank=True,
        help_text="Amazon Bedrock: the region requests are signed for. Empty: from the base "
        "URL's host (bedrock-runtime.REGION.amazonaws.com).",
    )
    # The admin preset it was made from (monitor.presets): its routes' default request settings
    # and its name in LiteLLM's price file (manage.py import_prices). Blank: set up by hand.
    preset = models.CharField(max_length=30, blank=True, default="")
    # Fernet token of the API key; the key itself is never stored, rendered or logged.
    api_key_encrypted = models.TextField(blank=True, default="", editable=False)
    extra_headers = models.JSONField(
        default=dict,
        blank=True,
        help_text='Extra request headers, e.g. {"OpenAI-Organization": "org-1"}',
    )
    # Capabilities: a task's HTTP/2 or msgpack probes go only to providers that take them
    # (elsewhere they would fail for a reason that is ours, not the provider's).
    http2 = models.BooleanField(
        "supports HTTP/2", default=False, help_text="The provider negotiates HTTP/2."
    )
    accepts_msgpack = models.BooleanField(
        "accepts msgpack + gzip bodies",
        default=False,
        help_text="The provider takes application/vnd.msgpack request bodies (few do).",
    )
    is_simulated = models.BooleanField(
        default=False, help_text="A simulated provider (demo and tests), labelled as such."
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        """A new origin drops the stored key and the secret headers of this provider's routes
        (they were entered for the old one), unless a key was entered for the new origin in
        the same change. `secrets_cleared` says whether that happened (the admin asks for
        the key again)."""
        self.secrets_cleared = False
        if self.pk is not None:
            old = Provider.objects.filter(pk=self.pk).values_list("base_url", flat=True).first()
            if old is not None and origin_of(old) != self.origin:
                if getattr(self, "_key_origin", None) != self.origin and self.api_key_encrypted:
                    self.api_key_encrypted = ""
                    self.secrets_cleared = True
                    if "update_fields" in kwargs and kwargs["update_fields"] is not None:
                        kwargs["update_fields"] = {*kwargs["update_fields"], "api_key_encrypted"}
                routes = Route.objects.filter(provider_id=self.pk).exclude(
                    secret_headers_encrypted=""
                )
                self.secrets_cleared |= routes.update(secret_headers_encrypted="") > 0
        super().save(*args, **kwargs)

    def clean(self) -> None:
        check_provider_url(self.base_url)
        if not isinstance(self.extra_headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.extra_headers.items()
        ):
            raise ValidationError({"extra_headers": "Use a JSON object of string to string."})
        if (error := headers.extra_headers_error(self.extra_headers)) is not None:
            raise ValidationError({"extra_headers": error})

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key_encrypted)

    def supports(self, *, http2: bool = False, body_encoding: str = BODY_JSON) -> bool:
        """Can this provider take a probe with these options?"""
        return (self.http2 or not http2) and (
            self.accepts_msgpack or body_encoding != BODY_MSGPACK_GZIP
        )

    def set_api_key(self, plaintext: str) -> None:
        """Store the key encrypted, bound to the origin of the current base URL (it is only
        ever sent there: monitor.crypto.decrypt_bound)."""
        self.api_key_encrypted = encrypt_bound(self.origin, plaintext) if plaintext else ""
        self._key_origin = self.origin

    def set_aws_credentials(self, access_key_id: str, secret_access_key: str) -> None:
        """Bedrock SigV4 credentials, stored as the API key is (encrypted, bound to the
        origin), in the one form the worker reads them back from (aws_credentials)."""
        self.set_api_key(
            json.dumps(
                {"aws_access_key_id": access_key_id, "aws_secret_access_key": secret_access_key}
            )
        )

    def get_api_key(self) -> str:
        """The decrypted key; raises ApiKeyDecryptionError rather than return ciphertext, and
        KeyOriginMismatch for a key entered for another origin."""
        if not self.api_key_encrypted:
            return ""
        return decrypt_bound(self.api_key_encrypted, self.base_url, accept_unbound=True)

    @property
    def origin(self) -> str:
        return origin_of(self.base_url)


def aws_credentials(stored_key: str) -> tuple[str, str] | None:
    """(access key id, secret access key) when a Bedrock provider's stored key is SigV4
    credentials (Provider.set_aws_credentials), None when it is an API key."""
    if not stored_key.startswith("{"):
        return None
    try:
        value = json.loads(stored_key)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    key_id, secret = value.get("aws_access_key_id"), value.get("aws_secret_access_key")
    if isinstance(key_id, str) and isinstance(secret, str) and key_id and secret:
        return key_id, secret
    return None


class Route(models.Model):
    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="routes")
    model_id = models.CharField("model id", max_length=200)
    display_name = models.CharField(max_length=200, blank=True)
    price_input_per_mtok = models.DecimalField(
        "$ / M input tokens", max_digits=12, decimal_places=4, default=Decimal("0")
    )
    price_output_per_mtok = models.DecimalField(
        "$ / M output tokens", max_digits=12, decimal_places=4, default=Decimal("0")
    )
    price_cached_input_per_mtok = models.DecimalField(
        "$ / M cached input tokens",
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="Input tokens the provider reports as read from its prompt cache. "
        "Empty: charged at the input price.",
    )
    quality_index = models.FloatField(
        null=True,
        blank=True,
        help_text="External quality index (e.g. an Artificial Analysis Intelligence Index figure).",
    )
    # Request settings, sent as the real APIs name them (admin offers presets).
    token_limit_param = models.CharField(
        "token-limit parameter",
        max_length=30,
        choices=TOKEN_LIMIT_PARAMS,
        default=TOKEN_LIMIT_MAX_TOKENS,
        help_text="OpenAI reasoning models refuse max_tokens and need max_completion_tokens.",
    )
    reasoning_effort = models.CharField(
        max_length=10,
        choices=REASONING_EFFORTS,
        blank=True,
        help_text="OpenAI-format reasoning models: more effort, more hidden reasoning tokens.",
    )
    thinking_budget_tokens = models.PositiveIntegerField(
        "thinking budget (tokens)",
        null=True,
        blank=True,
        validators=[MinValueValidator(MIN_THINKING_BUDGET)],
        help_text="Anthropic extended thinking (at least 1024). Empty: thinking off.",
    )
    service_tier = models.CharField(
        max_length=10,
        choices=SERVICE_TIERS,
        blank=True,
        help_text="Separate by urgency: priority costs more and queues less, flex the reverse.",
    )
    temperature = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(2.0)],
        help_text="Empty: not sent (reasoning models refuse any but the default).",
    )
    extra_body = models.JSONField(
        "extra body fields",
        default=dict,
        blank=True,
        help_text='Merged into the request body, e.g. {"response_format": {"type": "json_object"}}.',
    )
    api_version = models.CharField(
        "API version",
        max_length=30,
        blank=True,
        help_text="Azure OpenAI: the api-version query parameter, e.g. 2024-10-21.",
    )
    # Fernet token of a JSON object of headers (gateway keys...): write-only, like API keys.
    secret_headers_encrypted = models.TextField(blank=True, default="", editable=False)
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["provider__name", "model_id"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "model_id"], name="route_provider_model")
        ]

    def __str__(self) -> str:
        return self.display_name or f"{self.provider.name} / {self.model_id}"

    def clean(self) -> None:
        errors: dict[str, str] = {}
        body = self.extra_body
        if not isinstance(body, dict):
            errors["extra_body"] = "Use a JSON object."
        elif reserved := sorted(RESERVED_BODY_KEYS & set(body)):
            errors["extra_body"] = (
                f"{', '.join(reserved)}: set by the probe or by the fields above, not here."
            )
        wire = self.provider.wire_format if self.provider_id else None
        if wire is not None:
            errors.update(self._format_errors(wire))
        if errors:
            raise ValidationError(errors)

    def _format_errors(self, wire: str) -> dict[str, str]:
        """The request settings this route's wire format cannot send, by field."""
        errors: dict[str, str] = {}
        if wire not in OPENAI_BODIES and self.token_limit_param != TOKEN_LIMIT_MAX_TOKENS:
            errors["token_limit_param"] = (
                "Only OpenAI Chat Completions providers take this parameter "  # noqa: S105
                "(Responses, Gemini and Bedrock have their own output cap, sent for max_tokens)."
            )
        if self.reasoning_effort and wire not in TAKES_REASONING_EFFORT:
            errors["reasoning_effort"] = (
                "This format takes no reasoning_effort; use a thinking budget."
            )
        if self.thinking_budget_tokens and wire not in TAKES_THINKING_BUDGET:
            errors["thinking_budget_tokens"] = (
                "Only Anthropic, Gemini and Bedrock providers take a thinking budget."
            )
        if wire == WIRE_GEMINI and self.reasoning_effort and self.thinking_budget_tokens:
            errors["thinking_budget_tokens"] = (
                "Gemini takes a thinking budget or a thinking level (reasoning_effort), never both."
            )
        if wire == WIRE_GEMINI and self.service_tier:
            errors["service_tier"] = "Gemini's API takes no service tier."
        if wire == WIRE_BEDROCK and self.service_tier not in ("", *BEDROCK_SERVICE_TIERS):
            errors["service_tier"] = "Bedrock's tiers are priority, default and flex."
        if wire == WIRE_AZURE and not self.api_version:
            errors["api_version"] = "Azure OpenAI needs an api-version."
        return errors

    def token_limit(self, answer_tokens: int) -> int:
        """The token limit to send for an answer of up to `answer_tokens` (the task's bound).

        Anthropic counts thinking within max_tokens, which must exceed the budget; OpenAI
        reasoning models count hidden reasoning within max_completion_tokens. Either way the
        answer keeps its own room."""
        if self.thinking_budget_tokens:
            return answer_tokens + self.thinking_budget_tokens
        if self.token_limit_param == TOKEN_LIMIT_MAX_COMPLETION_TOKENS:
            return answer_tokens + REASONING_ALLOWANCE_TOKENS
        if self.reasoning_effort and self.provider.wire_format in EFFORT_WITHIN_CAP:
            return answer_tokens + REASONING_ALLOWANCE_TOKENS  # max_output_tokens, Gemini's
        return answer_tokens

    @property
    def has_secret_headers(self) -> bool:
        return bool(self.secret_headers_encrypted)

    def set_secret_headers(self, headers: dict[str, str]) -> None:
        """Stored encrypted, bound to the provider's origin like its API key."""
        self.secret_headers_encrypted = (
            encrypt_bound(self.provider.origin, json.dumps(headers, separators=(",", ":")))
            if headers
            else ""
        )

    @property
    def reasons(self) -> bool:
        """Does this route think before it answers (its first token may not be the answer's)?"""
        return bool(
            self.reasoning_effort
            or self.thinking_budget_tokens
            or self.token_limit_param == TOKEN_LIMIT_MAX_COMPLETION_TOKENS
        )

    def cost_usd(
        self, input_tokens: int, output_tokens: int, cached_tokens: int | None = None
    ) -> Decimal:
        """What a call costs. `input_tokens` counts all input, cached or not (as every wire
        format reports it, probes.formats); the cached part is charged at the cached-input
        price where one is set. Cache writes (Anthropic's) are charged at the input price."""
        cached = min(max(cached_tokens or 0, 0), input_tokens)
        if self.price_cached_input_per_mtok is None:
            cached = 0
        cached_price = self.price_cached_input_per_mtok or Decimal("0")
        return (
            self.price_input_per_mtok * (input_tokens - cached)
            + cached_price * cached
            + self.price_output_per_mtok * output_tokens
        ) / Decimal(1_000_000)


class Region(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(
        max_length=50,
        unique=True,
        validators=[slug_validator],
        help_text="Workers for this region consume the queue probes.<slug>.",
    )
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def queue_name(self) -> str:
        return f"probes.{self.slug}"
