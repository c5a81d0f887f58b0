from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from django import forms
from django.contrib import admin, messages
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_post_parameters

from monitor import presets
from monitor.api import tokens
from monitor.models import (
    BODY_ENCODINGS,
    CONNECTION_MODES,
    HTTP_VERSIONS,
    PREFIX_MODES,
    ApiToken,
    EvalCase,
    Heartbeat,
    ProbeResult,
    Provider,
    RaceRun,
    Region,
    Route,
    Subscription,
    Task,
)

M = TypeVar("M", bound=Model)

# RFC 9110 token characters: a header name a client library will send as it is.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class ProviderForm(forms.ModelForm[Provider]):
    # Write-only: the widget never renders a value back, and a blank field keeps the stored key.
    api_key = forms.CharField(
        label="API key",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: stored encrypted, never shown again. Leave blank to keep the current key.",
    )
    clear_api_key = forms.BooleanField(label="Remove the stored API key", required=False)
    preset = forms.ChoiceField(
        choices=presets.provider_choices,
        required=False,
        help_text="Fills in the wire format, HTTP/2 support and (when left empty) the base URL.",
    )

    class Meta:
        model = Provider
        fields = [
            "name",
            "slug",
            "preset",
            "base_url",
            "wire_format",
            "api_key",
            "clear_api_key",
            "extra_headers",
            "http2",
            "accepts_msgpack",
            "is_simulated",
            "is_active",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["base_url"].required = False  # a preset can supply it

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        preset = presets.PROVIDER_PRESETS.get(data.get("preset") or "")
        if preset is not None:
            data["wire_format"], data["http2"] = preset["wire_format"], preset["http2"]
            data["base_url"] = data.get("base_url") or preset["base_url"]
            for name in ("wire_format", "http2", "base_url"):
                setattr(self.instance, name, data[name])
        if not data.get("base_url"):
            self.add_error("base_url", "Give the provider's base URL, or pick a preset.")
        return data

    def save(self, commit: bool = True) -> Provider:
        provider: Provider = super().save(commit=False)
        if self.cleaned_data.get("clear_api_key"):
            provider.set_api_key("")
        elif self.cleaned_data.get("api_key"):
            provider.set_api_key(self.cleaned_data["api_key"])
        if commit:
            provider.save()
        return provider


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin[Provider]):
    form = ProviderForm
    list_display = ["name", "slug", "wire_format", "base_url", "key_set", "http2", "is_active"]
    list_filter = ["wire_format", "http2", "accepts_msgpack", "is_simulated", "is_active"]
    search_fields = ["name", "slug", "base_url"]
    prepopulated_fields = {"slug": ["name"]}

    @admin.display(boolean=True, description="API key set")
    def key_set(self, obj: Provider) -> bool:
        return obj.has_api_key

    # Keep the typed key out of Django's error reports.
    @method_decorator(sensitive_post_parameters("api_key"))
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return super().changeform_view(request, object_id, form_url, extra_context)


class RouteForm(forms.ModelForm[Route]):
    preset = forms.ChoiceField(
        choices=presets.route_choices,
        required=False,
        help_text="Sets the request settings below to what this kind of model needs.",
    )
    # Write-only, like API keys: stored encrypted, never rendered back or logged.
    secret_headers = forms.CharField(
        label="secret headers",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text='A JSON object, e.g. {"api-key": "..."} or a gateway\'s key header. Write-only: '
        "stored encrypted, never shown again. Leave blank to keep the stored headers.",
    )
    clear_secret_headers = forms.BooleanField(
        label="Remove the stored secret headers", required=False
    )

    class Meta:
        model = Route
        fields = [
            "provider",
            "model_id",
            "display_name",
            "price_input_per_mtok",
            "price_output_per_mtok",
            "quality_index",
            "preset",
            "token_limit_param",
            "reasoning_effort",
            "thinking_budget_tokens",
            "service_tier",
            "temperature",
            "extra_body",
            "api_version",
            "secret_headers",
            "clear_secret_headers",
            "is_active",
        ]

    def clean_secret_headers(self) -> dict[str, str] | None:
        raw = self.cleaned_data.get("secret_headers") or ""
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            # Never echo the value back: it is a secret.
            raise forms.ValidationError("Not valid JSON (the value is not shown).") from None
        if not (
            isinstance(value, dict)
            and value
            and all(
                isinstance(k, str) and HEADER_NAME.fullmatch(k) and isinstance(v, str)
                for k, v in value.items()
            )
        ):
            raise forms.ValidationError("Use a JSON object of header names to string values.")
        return value

    def clean(self) -> dict[str, Any]:
        # Runs before the instance is built and validated, so the model checks the preset's
        # settings against the provider like any typed-in ones.
        data = super().clean() or {}
        preset = presets.ROUTE_PRESETS.get(data.get("preset") or "")
        if preset is not None:
            data.update(preset["settings"])
        return data

    def save(self, commit: bool = True) -> Route:
        route: Route = super().save(commit=False)
        if self.cleaned_data.get("clear_secret_headers"):
            route.set_secret_headers({})
        elif self.cleaned_data.get("secret_headers"):
            route.set_secret_headers(self.cleaned_data["secret_headers"])
        if commit:
            route.save()
            self.save_m2m()
        return route


@admin.register(Route)
class RouteAdmin(admin.ModelAdmin[Route]):
    form = RouteForm
    list_display = [
        "__str__",
        "provider",
        "model_id",
        "price_input_per_mtok",
        "price_output_per_mtok",
        "quality_index",
        "token_limit_param",
        "service_tier",
        "headers_set",
        "is_active",
    ]
    list_filter = ["provider", "token_limit_param", "service_tier", "is_active"]
    search_fields = ["model_id", "display_name", "provider__name"]
    list_select_related = ["provider"]

    @admin.display(boolean=True, description="secret headers set")
    def headers_set(self, obj: Route) -> bool:
        return obj.has_secret_headers

    @method_decorator(sensitive_post_parameters("secret_headers"))
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return super().changeform_view(request, object_id, form_url, extra_context)


@admin.register(Region)
class RegionAdmin(admin.ModelAdmin[Region]):
    list_display = ["name", "slug", "queue_name", "is_active"]
    list_filter = ["is_active"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}


class EvalCaseInline(admin.TabularInline[EvalCase, Task]):
    model = EvalCase
    extra = 0
    fields = ["name", "input", "grader", "expected", "tolerance", "json_schema", "is_active"]


def _multi(choices: list[tuple[str, str]], label: str) -> forms.TypedMultipleChoiceField:
    return forms.TypedMultipleChoiceField(
        choices=choices, widget=forms.CheckboxSelectMultiple, label=label
    )


class TaskForm(forms.ModelForm[Task]):
    http_versions = _multi(HTTP_VERSIONS, "HTTP versions")
    body_encodings = _multi(BODY_ENCODINGS, "Body encodings")
    connection_modes = _multi(CONNECTION_MODES, "Connections")
    prefix_modes = _multi(PREFIX_MODES, "Prompt prefixes")

    class Meta:
        model = Task
        exclude: list[str] = []


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin[Task]):
    form = TaskForm
    inlines = [EvalCaseInline]
    list_display = [
        "name",
        "latency_class",
        "probe_interval_s",
        "min_pass_rate",
        "ttft_p95_budget_ms",
        "e2e_p95_budget_ms",
        "route_count",
        "is_active",
    ]
    list_filter = ["latency_class", "is_active", "regions"]
    search_fields = ["name", "slug", "description"]
    filter_horizontal = ["routes", "regions"]
    prepopulated_fields = {"slug": ["name"]}
    fieldsets = [
        (None, {"fields": ["name", "slug", "description", "is_active"]}),
        ("Prompt", {"fields": ["system_prompt", "user_template", "input_tokens", "max_tokens"]}),
        (
            "Latency and quality",
            {
                "fields": [
                    "latency_class",
                    "latency_metric",
                    "ttft_p95_budget_ms",
                    "e2e_p95_budget_ms",
                    "min_pass_rate",
                    "min_quality_index",
                ]
            },
        ),
        (
            "Where and how often",
            {
                "fields": [
                    "routes",
                    "regions",
                    "probe_interval_s",
                    "probe_timeout_s",
                    "race_interval_s",
                ]
            },
        ),
        (
            "Probe options",
            {"fields": ["http_versions", "body_encodings", "connection_modes", "prefix_modes"]},
        ),
        ("Spend", {"fields": ["monthly_spend_cap_usd"]}),
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Task]:
        return super().get_queryset(request).prefetch_related("routes")

    @admin.display(description="routes")
    def route_count(self, obj: Task) -> int:
        return len(obj.routes.all())


@admin.register(EvalCase)
class EvalCaseAdmin(admin.ModelAdmin[EvalCase]):
    list_display = ["name", "task", "grader", "expected", "is_active"]
    list_filter = ["grader", "task", "is_active"]
    search_fields = ["name", "input", "expected"]
    list_select_related = ["task"]


class MeasurementAdmin(admin.ModelAdmin[M]):
    """Measurements are written by probes, never typed in or edited (deleting stays allowed)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(ProbeResult)
class ProbeResultAdmin(MeasurementAdmin[ProbeResult]):
    list_display = [
        "started_at",
        "task",
        "route",
        "region",
        "outcome",
        "error_kind",
        "ttft_ms",
        "tps",
        "e2e_ms",
        "http_version",
    ]
    list_filter = ["outcome", "error_kind", "region", "http_version", "cold", "body_encoding"]
    search_fields = ["route__model_id", "route__provider__name", "task__name", "error_detail"]
    list_select_related = ["task", "route__provider", "region"]
    date_hierarchy = "started_at"
    show_full_result_count = False  # COUNT(*) over millions of rows is slow; admin pages stay fast


@admin.register(RaceRun)
class RaceRunAdmin(MeasurementAdmin[RaceRun]):
    list_display = ["started_at", "task", "region", "status", "winner", "winner_ms", "loser_tokens"]
    list_filter = ["status", "task", "region"]
    search_fields = ["task__name", "winner__model_id"]
    list_select_related = ["task", "region", "winner__provider"]
    date_hierarchy = "started_at"


@admin.register(Heartbeat)
class HeartbeatAdmin(admin.ModelAdmin[Heartbeat]):
    list_display = ["name", "last_seen", "count"]


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin[Subscription]):
    list_display = [
        "user",
        "is_active",
        "weekday",
        "hour",
        "time_zone",
        "next_send_at",
        "last_sent_at",
        "send_attempts",
    ]
    list_filter = ["is_active", "weekday", "time_zone", "tasks"]
    search_fields = ["user__username", "user__email", "time_zone"]
    list_select_related = ["user"]
    autocomplete_fields = ["user"]
    filter_horizontal = ["tasks"]
    readonly_fields = ["next_send_at", "last_sent_at", "send_attempts", "last_error"]
    fields = [
        "user",
        "is_active",
        "tasks",
        "weekday",
        "hour",
        "time_zone",
        "next_send_at",
        "last_sent_at",
        "send_attempts",
        "last_error",
    ]

    def save_model(self, request: HttpRequest, obj: Subscription, form: Any, change: bool) -> None:
        obj.reschedule_if_changed(form.changed_data, timezone.now())
        super().save_model(request, obj, form, change)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    """Tokens for the read API (/api/v1/). Adding one generates it; only its prefix and
    SHA-256 are kept, so the token is shown once, in the message after the save."""

    list_display = ["name", "prefix", "created_at", "last_used_at", "is_active"]
    list_filter = ["is_active"]
    search_fields = ["name", "prefix"]
    fields = ["name", "is_active", "prefix", "created_at", "last_used_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at"]

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        issued = None
        if not change:
            issued = tokens.issue()
            obj.prefix, obj.digest = issued.prefix, issued.digest
        super().save_model(request, obj, form, change)
        if issued is not None:
            messages.warning(
                request,
                f"The API token for {obj.name!r} is {issued.token} — copy it now: it is shown "
                "only this once and cannot be recovered (a lost token is replaced by a new one).",
            )
