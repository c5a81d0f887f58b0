from __future__ import annotations

import datetime as dt
import ipaddress
import json
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import connection, models
from django.utils import timezone

from monitor import headers
from monitor.crypto import (
    decrypt_bound,
    decrypt_secret,
    encrypt_bound,
    encrypt_secret,
    origin_of,
)
from monitor.limits import PROBE_TIMEOUT_MAX_S
from probes.errors import Kind
from probes.formats import PROTECTED_BODY_KEYS
from probes.transport import address_allowed

WIRE_OPENAI = "openai"
WIRE_ANTHROPIC = "anthropic"
WIRE_AZURE = "azure"
WIRE_RESPONSES = "responses"
WIRE_GEMINI = "gemini"
WIRE_BEDROCK = "bedrock"
# The keys are probes.formats.WIRE_FORMATS' (tests/monitor/test_route_settings.py holds them
# equal); the labels are the admin's.
WIRE_FORMATS = [
    (WIRE_OPENAI, "OpenAI Chat Completions"),
    (WIRE_ANTHROPIC, "Anthropic Messages"),
    (WIRE_AZURE, "Azure OpenAI (deployment URL, api-key header)"),
    (WIRE_RESPONSES, "OpenAI Responses"),
    (WIRE_GEMINI, "Gemini native (streamGenerateContent, x-goog-api-key)"),
    (WIRE_BEDROCK, "Amazon Bedrock ConverseStream (SigV4 or a Bedrock API key)"),
]
# Formats that speak OpenAI's Chat Completions body (reasoning_effort, max_completion_tokens).
OPENAI_BODIES = (WIRE_OPENAI, WIRE_AZURE)
# Formats that take reasoning_effort (Gemini as its thinking level) and a thinking budget.
TAKES_REASONING_EFFORT = (WIRE_OPENAI, WIRE_AZURE, WIRE_RESPONSES, WIRE_GEMINI)
TAKES_THINKING_BUDGET = (WIRE_ANTHROPIC, WIRE_GEMINI, WIRE_BEDROCK)
# Formats whose output cap bounds reasoning and answer together when reasoning_effort is set.
EFFORT_WITHIN_CAP = (WIRE_RESPONSES, WIRE_GEMINI)
BEDROCK_SERVICE_TIERS = ("priority", "default", "flex")

# Route request settings, as the real APIs name them.
# Parameter names, not secrets (S105 reads "token" as a password).
TOKEN_LIMIT_MAX_TOKENS = "max_tokens"  # noqa: S105
TOKEN_LIMIT_MAX_COMPLETION_TOKENS = "max_completion_tokens"  # noqa: S105
TOKEN_LIMIT_PARAMS = [
    (TOKEN_LIMIT_MAX_TOKENS, "max_tokens (chat models, Anthropic, most compatible servers)"),
    (
        TOKEN_LIMIT_MAX_COMPLETION_TOKENS,
        "max_completion_tokens (OpenAI reasoning models: o-series, GPT-5)",
    ),
]
REASONING_EFFORTS = [
    ("", "not sent"),
    ("minimal", "minimal"),
    ("low", "low"),
    ("medium", "medium"),
    ("high", "high"),
]
SERVICE_TIERS = [
    ("", "not sent"),
    ("auto", "auto"),
    ("default", "default"),
    ("flex", "flex (cheaper, slower)"),
    ("priority", "priority (faster, dearer)"),
]
# Body keys a route's extra fields may not set: those the probe owns (the engine refuses them
# too) and those the route's own settings send.
RESERVED_BODY_KEYS = PROTECTED_BODY_KEYS | {
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "reasoning_effort",
    "service_tier",
    "thinking",
    # the newer formats' prompt, output cap and storage, which the probe sets
    "input",
    "instructions",
    "store",
    "max_output_tokens",
    "contents",
    "systemInstruction",
    "inferenceConfig",
}
# Anthropic's smallest extended-thinking budget.
MIN_THINKING_BUDGET = 1024
# What a max_completion_tokens route may spend on hidden reasoning on top of the task's answer
# bound: OpenAI advises reserving at least 25,000 tokens for reasoning and output when starting
# out (its reasoning guide). A cap, not a charge: only what the model uses is billed.
REASONING_ALLOWANCE_TOKENS = 25_000

BODY_JSON = "json"
BODY_MSGPACK_GZIP = "msgpack-gzip"
BODY_ENCODINGS = [(BODY_JSON, "JSON"), (BODY_MSGPACK_GZIP, "msgpack + gzip")]

HTTP_1_1 = "1.1"
HTTP_2 = "2"
HTTP_VERSIONS = [(HTTP_1_1, "HTTP/1.1"), (HTTP_2, "HTTP/2")]

CONN_WARM = "warm"
CONN_COLD = "cold"
CONNECTION_MODES = [(CONN_WARM, "warm (pooled)"), (CONN_COLD, "cold (new connection)")]

PREFIX_STABLE = "stable"
PREFIX_FRESH = "fresh"
PREFIX_MODES = [(PREFIX_STABLE, "stable prefix (cache can hit)"), (PREFIX_FRESH, "fresh prefix")]

CLASS_INTERACTIVE = "interactive"
CLASS_ASYNC = "async"
CLASS_BATCH = "batch"
LATENCY_CLASSES = [
    (CLASS_INTERACTIVE, "interactive"),
    (CLASS_ASYNC, "async"),
    (CLASS_BATCH, "batch"),
]

METRIC_E2E_P50 = "e2e_p50"
METRIC_E2E_P95 = "e2e_p95"
METRIC_TTFT_P50 = "ttft_p50"
METRIC_TTFT_P95 = "ttft_p95"
# Time to first answer token: for routes that reason, the first token the user can read (TTFT
# of a reasoning route is its first thinking token).
METRIC_TTFAT_P50 = "ttfat_p50"
METRIC_TTFAT_P95 = "ttfat_p95"
# Application end-to-end (scenario tasks): user action to validated result, every call of
# the scenario and the work between them included.
METRIC_APP_E2E_P50 = "app_e2e_p50"
METRIC_APP_E2E_P95 = "app_e2e_p95"
APP_E2E_METRICS = (METRIC_APP_E2E_P50, METRIC_APP_E2E_P95)
METRIC_AUTO = ""  # the latency class's default (CLASS_DEFAULTS)
LATENCY_METRICS = [
    (METRIC_AUTO, "the latency class's default"),
    (METRIC_E2E_P50, "e2e p50"),
    (METRIC_E2E_P95, "e2e p95"),
    (METRIC_TTFT_P50, "TTFT p50"),
    (METRIC_TTFT_P95, "TTFT p95"),
    (METRIC_TTFAT_P50, "time to first answer token p50"),
    (METRIC_TTFAT_P95, "time to first answer token p95"),
    (METRIC_APP_E2E_P50, "app e2e p50 (scenario tasks)"),
    (METRIC_APP_E2E_P95, "app e2e p95 (scenario tasks)"),
]

# The reference option set: the probes that rank routes. Other option probes feed the route
# page's comparisons only, so changing a task's option mix never moves its winner.
REF_AUTO = ""  # per option: warm, JSON, stable prefix, the best HTTP version the provider has
HTTP_BEST = "best"


@dataclass(frozen=True)
class ClassDefaults:
    """What a latency class means when the task leaves a setting empty (each is overridable
    on the task). Interactive users wait for the first token: rank on its tail. Async and batch
    users wait for the whole answer: rank on e2e; batch also prefers the cheaper of routes
    tied within noise."""

    metric: str
    reasoning_metric: str  # when any of the task's routes reasons
    max_error_rate: float
    min_graded: int
    ttft_p95_budget_ms: int | None
    e2e_p95_budget_ms: int | None
    prefer_cheaper: bool


CLASS_DEFAULTS = {
    CLASS_INTERACTIVE: ClassDefaults(
        metric=METRIC_TTFT_P95,
        reasoning_metric=METRIC_TTFAT_P95,
        max_error_rate=0.02,
        min_graded=20,
        ttft_p95_budget_ms=2_000,
        e2e_p95_budget_ms=None,
        prefer_cheaper=False,
    ),
    CLASS_ASYNC: ClassDefaults(
        metric=METRIC_E2E_P50,
        reasoning_metric=METRIC_E2E_P50,
        max_error_rate=0.05,
        min_graded=20,
        ttft_p95_budget_ms=None,
        e2e_p95_budget_ms=30_000,
        prefer_cheaper=False,
    ),
    CLASS_BATCH: ClassDefaults(
        metric=METRIC_E2E_P50,
        reasoning_metric=METRIC_E2E_P50,
        max_error_rate=0.10,
        min_graded=10,
        ttft_p95_budget_ms=None,
        e2e_p95_budget_ms=None,
        prefer_cheaper=True,
    ),
}

GRADER_EXACT = "exact"
GRADER_CONTAINS = "contains"
GRADER_REGEX = "regex"
GRADER_JSON_SCHEMA = "json_schema"
GRADER_NUMERIC = "numeric"
GRADERS = [
    (GRADER_EXACT, "exact match"),
    (GRADER_CONTAINS, "contains"),
    (GRADER_REGEX, "regular expression"),
    (GRADER_JSON_SCHEMA, "JSON schema"),
    (GRADER_NUMERIC, "number within tolerance"),
]

OUTCOME_OK = "ok"
OUTCOME_ERROR = "error"
OUTCOME_MISSED = "missed"
OUTCOMES = [(OUTCOME_OK, "ok"), (OUTCOME_ERROR, "error"), (OUTCOME_MISSED, "missed")]

# One taxonomy (probes.errors.Kind): the engine's failure kinds, ours (config, engine) and the
# monitor's `missed` (a slot with no result by its deadline). Stored as the kind's string.
ERROR_KINDS = [(kind.value, kind.value) for kind in Kind]

TOKEN_SOURCES = [("usage", "server usage"), ("tokenizer", "counted (o200k_base)")]

# Where a figure stands against the task's latency budget (Task.budget_status).
STATUS_OK = "ok"
STATUS_NEAR = "near"
STATUS_OVER = "over"
STATUS_UNKNOWN = "unknown"  # no budget set, or no figure to hold against it
BUDGET_STATUSES = [
    (STATUS_OK, "within budget"),
    (STATUS_NEAR, "near budget"),
    (STATUS_OVER, "over budget"),
    (STATUS_UNKNOWN, "no data"),
]
NEAR_FRACTION = 0.9  # within 90-100% of a budget is "near"

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


def _default_http_versions() -> list[str]:
    return [HTTP_1_1]


def _default_body_encodings() -> list[str]:
    return [BODY_JSON]


def _default_connection_modes() -> list[str]:
    return [CONN_WARM]


def _default_prefix_modes() -> list[str]:
    return [PREFIX_STABLE]


class Task(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True, validators=[slug_validator])
    description = models.TextField(blank=True)
    system_prompt = models.TextField(blank=True)
    user_template = models.TextField(
        help_text="The user message. {input} is replaced by an eval case's input, if any."
    )
    input_tokens = models.PositiveIntegerField(
        default=1000, help_text="Target prompt size; padding is added up to this many tokens."
    )
    max_tokens = models.PositiveIntegerField(default=256, validators=[MinValueValidator(1)])
    latency_class = models.CharField(
        max_length=20, choices=LATENCY_CLASSES, default=CLASS_INTERACTIVE
    )
    ttft_p95_budget_ms = models.PositiveIntegerField(
        "TTFT p95 budget (ms)",
        null=True,
        blank=True,
        help_text="Empty: the latency class's default (interactive 2,000 ms). Held against time "
        "to first answer token when the task ranks on it.",
    )
    e2e_p95_budget_ms = models.PositiveIntegerField(
        "e2e p95 budget (ms)",
        null=True,
        blank=True,
        help_text="Empty: the latency class's default (async 30,000 ms).",
    )
    latency_metric = models.CharField(
        max_length=20,
        choices=LATENCY_METRICS,
        default=METRIC_AUTO,
        blank=True,
        help_text="What 'fastest' means for this task. Empty: the latency class's default "
        "(interactive: TTFT p95, or time to first answer token p95 when a route reasons; "
        "async and batch: e2e p50).",
    )
    max_error_rate = models.FloatField(
        "maximum error rate",
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Availability bar (0 to 1): a route failing more often than this in a region "
        "does not qualify there. Errors that are ours (configuration, engine, missed slots) "
        "never count. Empty: the latency class's default (interactive 2%, async 5%, batch 10%).",
    )
    min_graded = models.PositiveIntegerField(
        "minimum graded probes",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Graded probes a route needs before its pass rate is judged. Empty: the "
        "latency class's default (interactive and async 20, batch 10).",
    )
    ttft_budget_on_answer = models.BooleanField(
        "TTFT budget counts the first answer token",
        null=True,
        blank=True,
        help_text="Hold the TTFT budget against the first answer token instead of the first "
        "token (thinking included). Empty: yes when one of the task's routes reasons.",
    )
    reference_http_version = models.CharField(
        "reference HTTP version",
        max_length=5,
        blank=True,
        default=REF_AUTO,
        choices=[(REF_AUTO, "the best the provider supports"), *HTTP_VERSIONS],
        help_text="The reference option set ranks routes; other option probes feed comparisons.",
    )
    reference_connection_mode = models.CharField(
        max_length=10,
        blank=True,
        default=REF_AUTO,
        choices=[(REF_AUTO, "warm"), *CONNECTION_MODES],
    )
    reference_body_encoding = models.CharField(
        max_length=20, blank=True, default=REF_AUTO, choices=[(REF_AUTO, "JSON"), *BODY_ENCODINGS]
    )
    reference_prefix_mode = models.CharField(
        max_length=10,
        blank=True,
        default=REF_AUTO,
        choices=[(REF_AUTO, "stable prefix"), *PREFIX_MODES],
    )
    min_pass_rate = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="Quality bar: minimum measured pass rate on the eval cases (0 to 1).",
    )
    min_quality_index = models.FloatField(
        null=True, blank=True, help_text="Quality bar: minimum external quality index of a route."
    )
    routes = models.ManyToManyField(Route, related_name="tasks", blank=True)
    regions = models.ManyToManyField(Region, related_name="tasks", blank=True)
    probe_interval_s = models.PositiveIntegerField(
        "probe interval (s)", default=300, validators=[MinValueValidator(10)]
    )
    probe_timeout_s = models.PositiveIntegerField(
        "probe deadline (s)",
        default=180,
        # The longest one allowed bounds the region tasks' time limits (monitor.limits).
        validators=[MinValueValidator(5), MaxValueValidator(PROBE_TIMEOUT_MAX_S)],
        help_text="Total wall-clock bound of one probe; a slot with no result by then plus a "
        "minute of grace is recorded as missed.",
    )
    http_versions = ArrayField(
        models.CharField(max_length=5, choices=HTTP_VERSIONS), default=_default_http_versions
    )
    body_encodings = ArrayField(
        models.CharField(max_length=20, choices=BODY_ENCODINGS), default=_default_body_encodings
    )
    connection_modes = ArrayField(
        models.CharField(max_length=10, choices=CONNECTION_MODES),
        default=_default_connection_modes,
    )
    prefix_modes = ArrayField(
        models.CharField(max_length=10, choices=PREFIX_MODES), default=_default_prefix_modes
    )
    race_interval_s = models.PositiveIntegerField(
        "race interval (s)",
        null=True,
        blank=True,
        validators=[MinValueValidator(10)],
        help_text="Race all candidate routes against each other this often from each region "
        "(the first complete valid answer wins, the rest are cancelled). Empty: no races.",
    )
    monthly_spend_cap_usd = models.DecimalField(
        "monthly probe-spend cap ($)", max_digits=12, decimal_places=2, null=True, blank=True
    )
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        for field in ("http_versions", "body_encodings", "connection_modes", "prefix_modes"):
            if not getattr(self, field):
                raise ValidationError({field: "Pick at least one."})
        for field, options in (
            ("reference_http_version", self.http_versions),
            ("reference_connection_mode", self.connection_modes),
            ("reference_body_encoding", self.body_encodings),
            ("reference_prefix_mode", self.prefix_modes),
        ):
            chosen = getattr(self, field)
            if chosen and chosen not in options:
                raise ValidationError({field: "The reference must be one of the task's options."})

    @property
    def defaults(self) -> ClassDefaults:
        return CLASS_DEFAULTS.get(self.latency_class, CLASS_DEFAULTS[CLASS_INTERACTIVE])

    def ranking_metric(self, routes: Iterable[Route] | None = None) -> str:
        """The metric that ranks routes: the task's own, or its class's default (time to first
        answer token for an interactive task whose routes reason)."""
        if self.is_scenario:
            # A scenario's user waits for the whole sequence: it ranks on app e2e (its tail
            # for interactive tasks), whatever single-call metric is set.
            if self.latency_metric in APP_E2E_METRICS:
                return self.latency_metric
            return (
                METRIC_APP_E2E_P95
                if self.latency_class == CLASS_INTERACTIVE
                else METRIC_APP_E2E_P50
            )
        if self.latency_metric:
            return self.latency_metric
        reasoning = any(r.reasons for r in (self.routes.all() if routes is None else routes))
        return self.defaults.reasoning_metric if reasoning else self.defaults.metric

    @property
    def is_scenario(self) -> bool:
        """A task with steps is a scenario: each slot runs them all (probes.scenario)."""
        prefetched = getattr(self, "_prefetched_objects_cache", {})
        if "steps" in prefetched:
            return bool(prefetched["steps"])
        return self.pk is not None and self.steps.exists()

    def ttft_budget_metric(self, routes: Iterable[Route] | None = None) -> str:
        """What the TTFT p95 budget is held against: TTFT, or time to first answer token."""
        on_answer = self.ttft_budget_on_answer
        if on_answer is None:
            on_answer = any(r.reasons for r in (self.routes.all() if routes is None else routes))
        return METRIC_TTFAT_P95 if on_answer else METRIC_TTFT_P95

    def error_ceiling(self) -> float:
        return (
            self.max_error_rate if self.max_error_rate is not None else self.defaults.max_error_rate
        )

    def graded_needed(self) -> int:
        return self.min_graded if self.min_graded is not None else self.defaults.min_graded

    def reference(self, provider: Provider) -> tuple[str, str, str, str]:
        """The reference option set (HTTP version, body, connection, prefix) for a provider's
        routes. Each option is the task's choice, else the preferred value (the best HTTP
        version the provider supports, JSON, warm, stable prefix) when the task probes it, else
        the task's first option of that kind; never one the provider cannot take."""

        def pick(chosen: str, preferred: str, options: list[str]) -> str:
            if chosen in options:
                return chosen
            return preferred if preferred in options else options[0]

        https = [v for v in self.http_versions if provider.supports(http2=v == HTTP_2)]
        bodies = [b for b in self.body_encodings if provider.supports(body_encoding=b)]
        http = self.reference_http_version
        return (
            pick("" if http == HTTP_BEST else http, HTTP_2, https or [HTTP_1_1]),
            pick(self.reference_body_encoding, BODY_JSON, bodies or [BODY_JSON]),
            pick(
                self.reference_connection_mode,
                CONN_WARM,
                list(self.connection_modes) or [CONN_WARM],
            ),
            pick(
                self.reference_prefix_mode,
                PREFIX_STABLE,
                list(self.prefix_modes) or [PREFIX_STABLE],
            ),
        )

    def reference_label(self) -> str:
        """The reference option set in words (the HTTP version depends on the provider)."""
        http = self.reference_http_version
        labels = dict(HTTP_VERSIONS + CONNECTION_MODES + BODY_ENCODINGS + PREFIX_MODES)
        parts = [
            labels[http]
            if http in (HTTP_1_1, HTTP_2)
            else "the best HTTP version each provider supports",
            labels.get(self.reference_connection_mode, "warm") + " connection"
            if self.reference_connection_mode
            else "warm connection",
            labels.get(self.reference_body_encoding, "JSON") + " body"
            if self.reference_body_encoding
            else "JSON body",
            labels.get(self.reference_prefix_mode, "stable prefix")
            if self.reference_prefix_mode
            else "stable prefix",
        ]
        return ", ".join(parts)

    def is_reference(
        self, provider: Provider, *, http2: bool, body_encoding: str, cold: bool, prefix_mode: str
    ) -> bool:
        """Was a probe with these options one of the reference set's (Task.reference)?"""
        return self.reference(provider) == (
            HTTP_2 if http2 else HTTP_1_1,
            body_encoding,
            CONN_COLD if cold else CONN_WARM,
            prefix_mode,
        )

    def stale_after(self) -> dt.timedelta:
        """No result for this long means the figures are stale: three intervals, or one interval
        plus the probe deadline and a minute, whichever is longer."""
        return max(
            dt.timedelta(seconds=3 * self.probe_interval_s),
            dt.timedelta(seconds=self.probe_interval_s + self.probe_timeout_s + 60),
        )

    def is_fresh(self, last_probe_at: dt.datetime | None, now: dt.datetime) -> bool:
        """Figures whose last probe is this recent are current; older ones are stale (and a
        route with nothing recent in a region cannot be its fastest)."""
        return fresh_within(last_probe_at, now, self.stale_after())

    def budget_ms(self, metric: str) -> int | None:
        """The latency budget set on a metric (ttft_p95, e2e_p95); None for other metrics."""
        if metric in (METRIC_TTFT_P95, METRIC_TTFAT_P95):
            if self.ttft_p95_budget_ms is not None:
                return self.ttft_p95_budget_ms
            return self.defaults.ttft_p95_budget_ms
        if metric == METRIC_E2E_P95:
            if self.e2e_p95_budget_ms is not None:
                return self.e2e_p95_budget_ms
            return self.defaults.e2e_p95_budget_ms
        return None

    def budget_status(self, metric: str, value_ms: float | None) -> str:
        """STATUS_OK, STATUS_NEAR (within NEAR_FRACTION of the budget), STATUS_OVER, or
        STATUS_UNKNOWN when the metric has no budget or there is no figure."""
        budget_ms = self.budget_ms(metric)
        if budget_ms is None or value_ms is None:
            return STATUS_UNKNOWN
        if value_ms > budget_ms:
            return STATUS_OVER
        if value_ms > budget_ms * NEAR_FRACTION:
            return STATUS_NEAR
        return STATUS_OK


def fresh_within(
    last_probe_at: dt.datetime | None, now: dt.datetime, stale_after: dt.timedelta
) -> bool:
    """The one freshness rule (Task.is_fresh), also for figures kept apart from their task
    (the overview snapshot keeps each cell's stale_after)."""
    return last_probe_at is not None and now - last_probe_at <= stale_after


class EvalCase(models.Model):
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="eval_cases")
    name = models.CharField(max_length=100)
    input = models.TextField(help_text="Replaces {input} in the task's user template.")
    grader = models.CharField(max_length=20, choices=GRADERS, default=GRADER_EXACT)
    expected = models.TextField(
        blank=True, help_text="Expected text, substring, regex or number, by grader."
    )
    json_schema = models.JSONField(null=True, blank=True, help_text="For the JSON schema grader.")
    tolerance = models.FloatField(
        default=0.0, validators=[MinValueValidator(0.0)], help_text="For the numeric grader."
    )
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["task", "name"]
        constraints = [models.UniqueConstraint(fields=["task", "name"], name="evalcase_task_name")]

    def __str__(self) -> str:
        return f"{self.task.name}: {self.name}"

    def clean(self) -> None:
        import re

        if self.grader == GRADER_REGEX:
            try:
                re.compile(self.expected)
            except re.error as exc:
                raise ValidationError(
                    {"expected": f"Not a valid regular expression: {exc}"}
                ) from None
        if self.grader == GRADER_NUMERIC:
            try:
                float(self.expected)
            except ValueError:
                raise ValidationError({"expected": "The numeric grader needs a number."}) from None
        if self.grader == GRADER_JSON_SCHEMA:
            from jsonschema import Draft202012Validator
            from jsonschema.exceptions import SchemaError

            if not isinstance(self.json_schema, dict):
                raise ValidationError({"json_schema": "The JSON schema grader needs a schema."})
            try:
                Draft202012Validator.check_schema(self.json_schema)
            except SchemaError as exc:
                raise ValidationError({"json_schema": f"Invalid schema: {exc.message}"}) from None


class ProbeResult(models.Model):
    """One measured call. Field names and units follow PRODUCT.md's metric table."""

    # No index of their own: result_one_per_slot leads with task, result_route_started with
    # route (each a 99 MB index fewer to write per year of 50 routes x 3 regions).
    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, null=True, related_name="results", db_index=False
    )
    route = models.ForeignKey(
        Route, on_delete=models.CASCADE, related_name="results", db_index=False
    )
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="results")
    eval_case = models.ForeignKey(EvalCase, on_delete=models.SET_NULL, null=True, blank=True)
    # The schedule slot this probe fills (null for ad-hoc probes); one result per slot.
    slot_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    # Planned start to actual start (ms), measured by the region worker: the tick planned the
    # start, the worker's queue and its probe loop delayed it. Null for rows written before it
    # was measured and for ad-hoc probes. A `missed` row with a lag is a probe the worker did
    # not start because it was past settings.START_LAG_MAX_SECONDS (monitor.stats.health).
    start_lag_ms = models.FloatField(null=True, blank=True)

    # options probed
    http2 = models.BooleanField(default=False)
    body_encoding = models.CharField(max_length=20, choices=BODY_ENCODINGS, default=BODY_JSON)
    cold = models.BooleanField(default=False)
    prefix_mode = models.CharField(max_length=10, choices=PREFIX_MODES, default=PREFIX_STABLE)
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Probed with the task's reference option set (Task.reference) when it ran: only these
    # rank routes (set at ingest).
    reference = models.BooleanField(default=False, db_default=False)

    # connection and transfer
    dns_ms = models.FloatField(null=True, blank=True)
    connect_ms = models.FloatField(null=True, blank=True)
    tls_ms = models.FloatField(null=True, blank=True)
    upload_ms = models.FloatField(null=True, blank=True)
    request_bytes = models.PositiveIntegerField(null=True, blank=True)
    ttfb_ms = models.FloatField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    ttfat_ms = models.FloatField(null=True, blank=True)
    e2e_ms = models.FloatField(null=True, blank=True)
    # The provider's own time as it reports it (Bedrock's metrics.latencyMs, else
    # openai-processing-ms): the rest of e2e was the path's. Null: not reported.
    server_ms = models.FloatField(null=True, blank=True)
    http_version = models.CharField(max_length=10, blank=True)

    # tokens and speed
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    token_source = models.CharField(max_length=10, choices=TOKEN_SOURCES, blank=True)
    tps = models.FloatField("tokens/s", null=True, blank=True)
    tpot_ms = models.FloatField(null=True, blank=True)
    itl_p50_ms = models.FloatField(null=True, blank=True)
    itl_max_ms = models.FloatField(null=True, blank=True)
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    # null = the provider did not report it, which differs from 0
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Reasoning the provider reports (streamed or not), and the part of it billed but never
    # streamed: shown apart, never counted as speed (tps counts streamed tokens only).
    reasoning_tokens = models.PositiveIntegerField(null=True, blank=True)
    hidden_reasoning_tokens = models.PositiveIntegerField(null=True, blank=True)
    # Output tokens streamed in the timed window: what tps counts (output_tokens is billed).
    streamed_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    tps_token_source = models.CharField(
        "how speed's tokens were counted", max_length=40, blank=True, default="", db_default=""
    )

    # What actually served the probe (comparisons group by these, not by what was asked).
    # Defaults in the database too: writers that insert rows in SQL (the bench loader, an
    # admin's fix) need not know these columns.
    served_model = models.CharField(max_length=200, blank=True, default="", db_default="")
    request_id = models.CharField(max_length=100, blank=True, default="", db_default="")
    service_tier = models.CharField(max_length=30, blank=True, default="", db_default="")
    connection_reused = models.BooleanField(null=True, blank=True)

    # rate limits, as received
    ratelimit_remaining_requests = models.IntegerField(null=True, blank=True)
    ratelimit_remaining_tokens = models.IntegerField(null=True, blank=True)
    retry_after_s = models.FloatField(null=True, blank=True)

    outcome = models.CharField(max_length=10, choices=OUTCOMES, default=OUTCOME_OK)
    error_kind = models.CharField(max_length=30, choices=ERROR_KINDS, blank=True)
    error_detail = models.CharField(max_length=500, blank=True)
    text = models.TextField(blank=True)
    quality_pass = models.BooleanField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    # Demo history made up from the simulator's profiles on a fresh demo (monitor.demo_history),
    # never measured: pages say so and can leave it out. Set only in this process, never taken
    # from a region worker's message (monitor.pipeline.ingest).
    generated = models.BooleanField(default=False, db_default=False)
    # One call of a scenario (its slot is the scenario's: slot_at stays null here), and the
    # index of its step (0-based).
    scenario = models.ForeignKey["ScenarioResult | None", "ScenarioResult | None"](
        "ScenarioResult",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        default=None,
        db_default=None,
        related_name="calls",
        db_index=False,  # result_scenario_calls: scenario calls only, not every probe
    )
    step = models.PositiveSmallIntegerField(null=True, blank=True, default=None, db_default=None)

    class Meta:
        indexes = [
            # The "includes generated demo history" banner on every page: the generated span's
            # ends from an index that is empty on every real deployment.
            models.Index(
                fields=["started_at"],
                name="result_generated_started",
                condition=models.Q(generated=True),
            ),
            # Time-range scans over the whole table (rollups, retention, probe log): BRIN is
            # tiny and fits an append-mostly table ordered by time.
            BrinIndex(fields=["started_at"], name="result_started_brin"),
            # Route page raw reads (median probe, headroom, option comparisons): one route,
            # last 24 h. No percentile is computed from raw rows (rollups hold them), so the
            # index carries no measurement columns: a third of the size it was, cheaper ingest.
            models.Index(fields=["route", "started_at"], name="result_route_started"),
            # A scenario's calls (its waterfall, deleting it): partial, so single probes (the
            # bulk of the table) write nothing to it.
            models.Index(
                fields=["scenario"],
                name="result_scenario_calls",
                condition=models.Q(scenario__isnull=False),
            ),
        ]
        constraints = [
            # The table is partitioned by day on started_at (migration 0017, monitor.partitions),
            # so its unique keys hold started_at; one result per slot is kept by ingest.
            models.UniqueConstraint(
                fields=["task", "route", "region", "slot_at", "started_at"],
                name="result_one_per_slot",
            )
        ]

    def __str__(self) -> str:
        return f"{self.route} @ {self.region} {self.started_at:%Y-%m-%d %H:%M:%S} {self.outcome}"


GENERATED_SPAN_KEY = "results"


class GeneratedSpan(models.Model):
    """The span of the generated demo history's results (ProbeResult.generated), kept in one
    row so that every page need not search the results for it: over a year of daily
    partitions that search is planned across all of them (31-35 ms on each page). Ingest
    widens it in the transaction that writes generated rows; retention reads it again from the
    results after dropping or deleting any (refresh). No row: no generated history."""

    key = models.CharField(max_length=20, primary_key=True, default=GENERATED_SPAN_KEY)
    start = models.DateTimeField()
    last = models.DateTimeField()

    def __str__(self) -> str:
        return f"generated {self.start} - {self.last}"

    @classmethod
    def widen(cls, start: dt.datetime, last: dt.datetime) -> None:
        """Take in generated results from `start` to `last` (in the writer's transaction)."""
        table = cls._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (key, start, last) VALUES (%s, %s, %s) "
                f"ON CONFLICT (key) DO UPDATE SET start = least({table}.start, excluded.start), "
                f"last = greatest({table}.last, excluded.last)",
                [GENERATED_SPAN_KEY, start, last],
            )

    @classmethod
    def refresh(cls) -> GeneratedSpan | None:
        """Read the span again from the results (after retention removed some of them)."""
        generated = ProbeResult.objects.filter(generated=True)
        first = generated.order_by("started_at").values_list("started_at", flat=True).first()
        last = generated.order_by("-started_at").values_list("started_at", flat=True).first()
        if first is None or last is None:
            cls.objects.filter(pk=GENERATED_SPAN_KEY).delete()
            return None
        span, _ = cls.objects.update_or_create(
            pk=GENERATED_SPAN_KEY, defaults={"start": first, "last": last}
        )
        return span


class Heartbeat(models.Model):
    """Last time a periodic process checked in (beat's tick, workers); shown as freshness."""

    name = models.CharField(max_length=100, primary_key=True)
    last_seen = models.DateTimeField()
    count = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} @ {self.last_seen}"

    @classmethod
    def add(cls, name: str, n: int = 1) -> None:
        """Add n to a durable counter: one statement, so concurrent writers never lose an
        increment; inside a transaction, it counts only if that commits."""
        table = cls._meta.db_table
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} (name, last_seen, count) VALUES (%s, now(), %s) "
                f"ON CONFLICT (name) DO UPDATE SET count = {table}.count + EXCLUDED.count, "
                "last_seen = EXCLUDED.last_seen",
                [name, n],
            )


class RegionMinute(models.Model):
    """One region's live schedule in one minute of slot time, kept at ingest
    (monitor.stats.health): probes that ran (ok or error), slots recorded missed (`late`: of
    them, probes a worker did not start because they were too late), and the histogram of
    probes' start lags (ms; monitor.stats.hist pairs). Generated demo history is not counted:
    this is what the Status page and the overview's banner say about monitoring health."""

    region = models.ForeignKey(Region, on_delete=models.CASCADE)
    minute = models.DateTimeField()
    probed = models.IntegerField(default=0)
    missed = models.IntegerField(default=0)
    late = models.IntegerField(default=0)
    lag_hist = ArrayField(models.IntegerField(), default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["region", "minute"], name="region_minute_key")
        ]

    def __str__(self) -> str:
        return f"{self.region_id} {self.minute:%Y-%m-%d %H:%M}"


class OverviewSnapshot(models.Model):
    """A computed page kept ready to read (monitor.answer.board): the same for every reader."""

    key = models.CharField(max_length=50, primary_key=True)
    built_at = models.DateTimeField()
    data = models.JSONField()
    # How long its build took: beat's next rebuild waits for as long (monitor.answer.board).
    build_s = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"{self.key} @ {self.built_at}"


SLOT_DISPATCHED = "dispatched"
SLOT_DONE = "done"
SLOT_MISSED = "missed"
SLOT_STATUSES = [(SLOT_DISPATCHED, "dispatched"), (SLOT_DONE, "done"), (SLOT_MISSED, "missed")]


class ProbeSlot(models.Model):
    """One scheduled (task, route, region, time): created once by whichever beat ticks first,
    ends done (a result arrived) or missed (none by its deadline)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE)
    route = models.ForeignKey(Route, on_delete=models.CASCADE)
    region = models.ForeignKey(Region, on_delete=models.CASCADE)
    slot_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    status = models.CharField(max_length=12, choices=SLOT_STATUSES, default=SLOT_DISPATCHED)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["task", "route", "region", "slot_at"], name="slot_key_unique"
            )
        ]
        indexes = [
            # The missed-slot sweep: dispatched slots past their deadline.
            models.Index(
                fields=["deadline_at"],
                name="slot_open_deadline",
                condition=models.Q(status="dispatched"),
            ),
            # Retention: slots are created in time order, so a block range index finds the
            # old ones for a fraction of a B-tree's size.
            BrinIndex(fields=["slot_at"], name="slot_at_brin"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id}/{self.route_id}/{self.region_id}@{self.slot_at:%H:%M:%S}"


GRAIN_HOUR = "hour"
GRAIN_DAY = "day"
GRAINS = [(GRAIN_HOUR, "hour"), (GRAIN_DAY, "day")]

# The percentiles each rollup row carries ready-made (a chart point each); the SQL function
# rw_pairs_pcts (migration 0005) mirrors monitor.stats.hist.percentiles for these quantiles.
ROW_QUANTILES = (50, 95, 99)


def _row_percentiles(histogram: str, low: float) -> models.GeneratedField:
    """p50/p95/p99 of one histogram column, generated by PostgreSQL on every write."""
    return models.GeneratedField(
        expression=models.Func(
            models.F(histogram),
            models.Value(low),
            function="rw_pairs_pcts",
            output_field=ArrayField(models.FloatField(null=True), size=3),
        ),
        output_field=ArrayField(models.FloatField(null=True), size=3),
        db_persist=True,
    )


class Rollup(models.Model):
    """Aggregates of probe results per (task, route, region) and hour or day.

    region NULL holds all regions merged, built at ingest time (merging at read time was slow).
    Every percentile a page shows comes from these histograms (monitor.stats.hist)."""

    grain = models.CharField(max_length=4, choices=GRAINS)
    bucket_start = models.DateTimeField()
    task = models.ForeignKey(Task, on_delete=models.CASCADE)
    route = models.ForeignKey(Route, on_delete=models.CASCADE)
    region = models.ForeignKey(Region, on_delete=models.CASCADE, null=True, blank=True)
    count_ok = models.IntegerField(default=0)
    count_error = models.IntegerField(default=0)
    count_missed = models.IntegerField(default=0)
    error_kinds = models.JSONField(default=dict)
    graded = models.IntegerField(default=0)
    passed = models.IntegerField(default=0)
    cache_reported = models.IntegerField(default=0)
    cache_hits = models.IntegerField(default=0)
    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cached_tokens = models.BigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    # Histograms: flat [bucket, count, bucket, count, ...] arrays (monitor.stats.hist).
    ttft_hist = ArrayField(models.IntegerField(), default=list)
    e2e_hist = ArrayField(models.IntegerField(), default=list)
    tps_hist = ArrayField(models.IntegerField(), default=list)
    # [p50, p95, p99] of each histogram, None where too few samples (monitor.stats.hist.MIN_SAMPLES).
    ttft_pcts = _row_percentiles("ttft_hist", 1.0)
    e2e_pcts = _row_percentiles("e2e_hist", 1.0)
    tps_pcts = _row_percentiles("tps_hist", 0.1)
    ttfat_hist = ArrayField(models.IntegerField(), default=list, db_default=[])
    # The reference option set's probes only (ProbeResult.reference): what ranks routes.
    ref_ttft_hist = ArrayField(models.IntegerField(), default=list, db_default=[])
    ref_ttfat_hist = ArrayField(models.IntegerField(), default=list, db_default=[])
    ref_e2e_hist = ArrayField(models.IntegerField(), default=list, db_default=[])
    # Scenario tasks: app e2e of each successful scenario (always the reference options).
    app_e2e_hist = ArrayField(models.IntegerField(), default=list, db_default=[])
    last_probe_at = models.DateTimeField(null=True)
    # The last successful probe: a route whose probes all fail is failing, not fresh.
    last_ok_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["grain", "bucket_start", "task", "route", "region"],
                name="rollup_key",
                nulls_distinct=False,
            )
        ]
        indexes = [
            # Route page: one route over a window, by grain, per region or all regions.
            models.Index(
                fields=["route", "grain", "region", "bucket_start"], name="rollup_route_time"
            ),
            # Overview and fastest-route: all routes of a task over a window.
            models.Index(fields=["task", "grain", "bucket_start"], name="rollup_task_time"),
        ]

    def __str__(self) -> str:
        return f"{self.grain} {self.bucket_start:%Y-%m-%d %H:00} {self.task_id}/{self.route_id}/{self.region_id}"

    @property
    def count(self) -> int:
        return self.count_ok + self.count_error + self.count_missed


class HourStrip(models.Model):
    """One UTC day of one (task, route, region)'s hourly chart points, kept by PostgreSQL.

    A trigger on monitor_rollup (migration 0008) writes each hourly rollup row's ready-made
    percentiles (Rollup.*_pcts) into its hour of the day's strip, whoever writes the row, so a
    month of hourly points is 31 rows to read, not 720. `points` is JSON text, kept as text so
    a page joins the strips into its chart data without parsing a number
    (monitor.pages.route.series): 24 entries, null for an hour with no rollup, else
    [ttft p50, p95, p99, e2e p50, p95, p99, tps p50, p95, p99], null where too few samples.
    region NULL holds all regions merged, as in Rollup."""

    day = models.DateTimeField()
    task = models.ForeignKey(Task, on_delete=models.CASCADE)
    route = models.ForeignKey(Route, on_delete=models.CASCADE)
    region = models.ForeignKey(Region, on_delete=models.CASCADE, null=True, blank=True)
    points = models.TextField()

    class Meta:
        constraints = [
            # Also the index of the page's read: one (task, route, region) over a range of days.
            models.UniqueConstraint(
                fields=["task", "route", "region", "day"],
                name="hourstrip_key",
                nulls_distinct=False,
            )
        ]

    def __str__(self) -> str:
        return f"{self.day:%Y-%m-%d} {self.task_id}/{self.route_id}/{self.region_id}"


class RaceRun(models.Model):
    """One race: the task's request fired at all its routes at once from one region; the first
    complete valid answer won and the rest were cancelled (probes.race)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="races")
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="races")
    # The race slot: the row is created when the race is dispatched (by exactly one beat,
    # INSERT ... ON CONFLICT), filled in when its result arrives, or marked missed by the
    # sweep once past its deadline, like a ProbeSlot.
    slot_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    status = models.CharField(max_length=12, choices=SLOT_STATUSES, default=SLOT_DISPATCHED)
    started_at = models.DateTimeField(default=timezone.now)
    winner = models.ForeignKey(
        Route, on_delete=models.SET_NULL, null=True, blank=True, related_name="races_won"
    )
    winner_ms = models.FloatField(null=True, blank=True)
    # Per route id (as a string): {"elapsed_ms", "cancelled", "tokens_paid", "saved_ms",
    # "outcome", "error_kind"}; saved_ms is the time the race saved against that route alone.
    lanes = models.JSONField(default=dict)
    loser_tokens = models.PositiveIntegerField(default=0)
    loser_cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    # All lanes together, the winner's included (counts toward the task's monthly spend).
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    # Demo history (monitor.demo_history), as ProbeResult.generated.
    generated = models.BooleanField(default=False, db_default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "region", "slot_at"], name="race_one_per_slot")
        ]
        indexes = [
            # Races page: one task's races over a window.
            models.Index(fields=["task", "started_at"], name="race_task_time"),
            # The missed-race sweep: dispatched races past their deadline.
            models.Index(
                fields=["deadline_at"],
                name="race_open_deadline",
                condition=models.Q(status="dispatched"),
            ),
        ]

    def __str__(self) -> str:
        return f"race {self.task_id}@{self.region_id} {self.started_at:%Y-%m-%d %H:%M:%S}"


STEP_SEQUENTIAL = "sequential"
STEP_FAN_OUT = "fan-out"
STEP_KINDS = [(STEP_SEQUENTIAL, "one call"), (STEP_FAN_OUT, "fan-out (calls in parallel)")]


class ScenarioStep(models.Model):
    """One step of a scenario task: a call (or a fan-out of parallel calls) on the route being
    probed. A task with steps is a scenario; its slots run every step (probes.scenario), then
    validate the final answer with the task's eval case."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="steps")
    order = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=10, choices=STEP_KINDS, default=STEP_SEQUENTIAL)
    fan_out = models.PositiveIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(32)],
        help_text="Calls in parallel (fan-out steps); the step waits for the slowest.",
    )
    prompt_template = models.TextField(
        help_text="{previous}: the previous step's answer; {input}: the eval case's input; "
        "{step}, {branch}: the step's and fan-out branch's numbers."
    )
    input_tokens = models.PositiveIntegerField(
        default=0,
        help_text="A stable document of this many tokens before the conversation (the same in "
        "every step, so a prompt cache can serve it).",
    )
    max_tokens = models.PositiveIntegerField(default=256, validators=[MinValueValidator(1)])
    carry_context = models.BooleanField(
        default=True,
        help_text="Send the conversation so far (earlier steps' prompts and answers) first.",
    )
    timeout_s = models.PositiveIntegerField(
        "call deadline (s)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Each call's deadline; empty: what is left of the scenario's (the task's "
        "probe deadline).",
    )

    class Meta:
        ordering = ["task", "order", "pk"]

    def __str__(self) -> str:
        return f"{self.task.name}: step {self.order}"

    def clean(self) -> None:
        try:
            self.prompt_template.replace("{input}", "").format(previous="", step=1, branch=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValidationError(
                {
                    "prompt_template": f"Only {{previous}}, {{input}}, {{step}} and {{branch}} "
                    f"may be used ({exc.__class__.__name__}: {exc})."
                }
            ) from None
        if self.kind == STEP_SEQUENTIAL and self.fan_out != 1:
            raise ValidationError({"fan_out": "A one-call step has a fan-out of 1."})


class ScenarioResult(models.Model):
    """One scenario slot's result: the application's end-to-end time and its calls (the
    ProbeResult rows whose `scenario` is this one)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="scenario_results")
    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="scenario_results")
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="scenario_results")
    slot_at = models.DateTimeField()
    started_at = models.DateTimeField(default=timezone.now)
    # User action to validated result (to the failure, for a failed scenario).
    app_e2e_ms = models.FloatField(null=True, blank=True)
    calls_e2e_ms = models.FloatField(null=True, blank=True)
    gaps_ms = ArrayField(models.FloatField(), default=list, blank=True)
    outcome = models.CharField(max_length=10, choices=OUTCOMES, default=OUTCOME_OK)
    failed_step = models.PositiveSmallIntegerField(null=True, blank=True)  # 0-based
    error_kind = models.CharField(max_length=30, choices=ERROR_KINDS, blank=True)
    error_detail = models.CharField(max_length=500, blank=True)
    validation_ms = models.FloatField(null=True, blank=True)
    validation_pass = models.BooleanField(null=True, blank=True)
    eval_case = models.ForeignKey(EvalCase, on_delete=models.SET_NULL, null=True, blank=True)
    call_count = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    # Demo history (monitor.demo_history), as ProbeResult.generated (its calls are marked too).
    # A measured scenario can have no call (one that failed before its first): this flag, not
    # its calls', tells the history's guard that the database holds measurements.
    generated = models.BooleanField(default=False, db_default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["task", "route", "region", "slot_at"], name="scenario_one_per_slot"
            )
        ]
        indexes = [
            # Route page: the median scenario of one route over the last day.
            models.Index(fields=["route", "started_at"], name="scenario_route_started"),
            # Retention: the scenarios older than the raw results kept (ingest).
            models.Index(fields=["slot_at"], name="scenario_slot_at"),
        ]

    def __str__(self) -> str:
        return f"scenario {self.task_id}/{self.route_id}/{self.region_id} {self.outcome}"


MONDAY, TUESDAY, WEDNESDAY, THURSDAY, FRIDAY, SATURDAY, SUNDAY = range(7)
WEEKDAYS = [
    (MONDAY, "Monday"),
    (TUESDAY, "Tuesday"),
    (WEDNESDAY, "Wednesday"),
    (THURSDAY, "Thursday"),
    (FRIDAY, "Friday"),
    (SATURDAY, "Saturday"),
    (SUNDAY, "Sunday"),
]


def validate_time_zone(value: str) -> None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValidationError(f"{value!r} is not an IANA time zone (e.g. Europe/Paris).") from None


# The fields that say when a digest goes out (Subscription.reschedule_if_changed).
SCHEDULE_FIELDS = frozenset({"is_active", "weekday", "hour", "time_zone"})


class Subscription(models.Model):
    """One user's weekly digest: which tasks (none = all), when in their own time zone."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="digest_subscription"
    )
    tasks = models.ManyToManyField(
        Task, blank=True, related_name="subscriptions", help_text="None selected: all tasks."
    )
    weekday = models.PositiveSmallIntegerField(choices=WEEKDAYS, default=MONDAY)
    hour = models.PositiveSmallIntegerField(
        default=8, validators=[MaxValueValidator(23)], help_text="Local hour, 0 to 23."
    )
    time_zone = models.CharField(
        max_length=64, default="UTC", validators=[validate_time_zone], help_text="IANA name."
    )
    is_active = models.BooleanField(default=True)
    # When the next digest (or a retry of a failed one) is due; null while inactive. A sender
    # claims a digest by moving this forward (optimistic lock, monitor.digest.sending.send_due).
    next_send_at = models.DateTimeField(null=True, blank=True)
    last_sent_at = models.DateTimeField(null=True, blank=True)
    # Attempts at the current digest; reset once it is sent or given up.
    send_attempts = models.PositiveSmallIntegerField(default=0, editable=False)
    last_error = models.CharField(max_length=300, blank=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        indexes = [
            # The beat task: active subscriptions whose next send time has come.
            models.Index(
                fields=["next_send_at"],
                name="subscription_due",
                condition=models.Q(is_active=True),
            ),
        ]

    def __str__(self) -> str:
        return f"digest for {self.user}"

    def choose_next_send(self, now: dt.datetime) -> dt.datetime:
        """The first local `weekday` at `hour` strictly after `now`, as an aware UTC time.

        Computed on local wall-clock dates, then localised: a week that crosses a DST change
        still lands at the chosen local hour. An hour that does not exist that day (spring
        forward) is taken with fold=0, which zoneinfo maps to the hour after the gap; an hour
        that happens twice (fall back) is taken the first time."""
        from zoneinfo import ZoneInfo

        zone = ZoneInfo(self.time_zone)
        local_now = now.astimezone(zone)
        days_ahead = (self.weekday - local_now.weekday()) % 7
        for extra_weeks in (0, 1):
            day = local_now.date() + dt.timedelta(days=days_ahead + 7 * extra_weeks)
            naive = dt.datetime.combine(day, dt.time(self.hour))
            candidate = naive.replace(tzinfo=zone).astimezone(dt.UTC)
            if candidate > now:
                return candidate
        raise AssertionError("unreachable: a week later is always after now")

    def previous_slot(self, now: dt.datetime) -> dt.datetime:
        """The last local `weekday` at `hour` at or before `now`: where a digest's week ends."""
        from zoneinfo import ZoneInfo

        zone = ZoneInfo(self.time_zone)
        local_now = now.astimezone(zone)
        days_back = (local_now.weekday() - self.weekday) % 7
        for extra_weeks in (0, 1):
            day = local_now.date() - dt.timedelta(days=days_back + 7 * extra_weeks)
            naive = dt.datetime.combine(day, dt.time(self.hour))
            candidate = naive.replace(tzinfo=zone).astimezone(dt.UTC)
            if candidate <= now:
                return candidate
        raise AssertionError("unreachable: a week earlier is always before now")

    def reschedule(self, now: dt.datetime) -> None:
        """After a change of schedule or of the active flag (not saved here)."""
        self.next_send_at = self.choose_next_send(now) if self.is_active else None
        self.send_attempts = 0

    def reschedule_if_changed(self, changed_fields: Iterable[str], now: dt.datetime) -> None:
        """After an edit (not saved here): a new subscription, a new schedule or switching it
        on or off sets the next send time; other edits keep it, and a pending retry with it."""
        if self.pk is None or SCHEDULE_FIELDS & set(changed_fields):
            self.reschedule(now)


class WinnerChange(models.Model):
    """When and why the fastest qualifying route of a task in a region changed (route None:
    no route qualifies). The latest row per (task, region) is the incumbent, which a
    challenger replaces only when faster with confidence (monitor.answer.selection)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="winner_changes")
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="winner_changes")
    route = models.ForeignKey(
        Route, on_delete=models.CASCADE, null=True, blank=True, related_name="winner_changes"
    )
    previous = models.ForeignKey(
        Route, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    at = models.DateTimeField(default=timezone.now)
    reason = models.CharField(max_length=300)

    class Meta:
        ordering = ["-at", "-pk"]
        indexes = [models.Index(fields=["task", "region", "-at"], name="winner_task_region_at")]

    def __str__(self) -> str:
        return f"{self.task} @ {self.region}: {self.route or 'none'} since {self.at:%Y-%m-%d %H:%M}"


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


import monitor.alerts.models  # noqa: E402, F401  (alert rules, alerts, channels: monitor.alerts)
