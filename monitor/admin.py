from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.files.uploadedfile import UploadedFile
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.cache import patch_cache_control
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_post_parameters

from monitor import headers, presets, scenario_presets
from monitor.api import tokens
from monitor.imports import evals, prices, quality
from monitor.imports.base import MAX_IMPORT_BYTES, ImportFileError, Report
from monitor.imports.fetch import fetch
from monitor.models import (
    BODY_ENCODINGS,
    CONNECTION_MODES,
    GRADER_EXACT,
    GRADERS,
    HTTP_VERSIONS,
    PREFIX_MODES,
    WIRE_BEDROCK,
    ApiToken,
    EvalCase,
    Heartbeat,
    ProbeResult,
    Provider,
    RaceRun,
    Region,
    RegionKey,
    Route,
    ScenarioStep,
    Subscription,
    Task,
)

M = TypeVar("M", bound=Model)

# RFC 9110 token characters: a header name a client library will send as it is.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


# --- Imports (monitor.imports): an upload form per kind, a dry run by default ---------------


class _ImportForm(forms.Form):
    dry_run = forms.BooleanField(
        label="Dry run: show the changes, write nothing", required=False, initial=True
    )


def _uploaded(upload: UploadedFile | None) -> bytes | None:
    if upload is None:
        return None
    if (upload.size or 0) > MAX_IMPORT_BYTES:
        raise ImportFileError(
            f"larger than {MAX_IMPORT_BYTES} bytes; refused", source=upload.name or ""
        )
    return b"".join(upload.chunks())


class EvalImportForm(_ImportForm):
    file = forms.FileField(help_text="CSV, JSONL (OpenAI evals input/ideal) or promptfoo YAML.")
    format = forms.ChoiceField(
        choices=[("", "by file extension")] + [(f, f) for f in evals.FORMATS], required=False
    )
    grader = forms.ChoiceField(
        choices=GRADERS,
        initial=GRADER_EXACT,
        help_text="For cases that give only an expected answer (JSONL ideal, CSV without grader).",
    )
    tolerance = forms.FloatField(initial=0.0, min_value=0.0, help_text="For the numeric grader.")
    input_var = forms.CharField(
        required=False, help_text="The promptfoo var (or CSV column) holding the input."
    )


class PriceImportForm(_ImportForm):
    file = forms.FileField(
        required=False, help_text="LiteLLM's model_prices_and_context_window.json"
    )
    url = forms.URLField(
        required=False,
        assume_scheme="https",
        help_text="Or its URL, e.g. https://raw.githubusercontent.com/BerriAI/litellm/main/"
        "model_prices_and_context_window.json",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if bool(data.get("file")) == bool(data.get("url")):
            raise forms.ValidationError("Give a file or a URL (one of them).")
        return data


class QualityImportForm(_ImportForm):
    file = forms.FileField(help_text="CSV with model_id,index (and optionally provider) columns.")


def _import_page(
    request: HttpRequest,
    model_admin: admin.ModelAdmin[Any],
    title: str,
    form: forms.Form,
    report: Report | None,
) -> TemplateResponse:
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": title,
        "form": form,
        "report": report,
    }
    return TemplateResponse(request, "admin/monitor/import.html", context)


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
    # Amazon Bedrock's SigV4 credentials: write-only too, stored encrypted in the key's place.
    aws_access_key_id = forms.CharField(
        label="AWS access key id",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
        help_text="Amazon Bedrock, instead of an API key: with the secret below, requests are "
        "signed with SigV4. Write-only.",
    )
    aws_secret_access_key = forms.CharField(
        label="AWS secret access key",
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: stored encrypted like API keys, never shown again.",
    )
    preset = forms.ChoiceField(
        choices=presets.provider_choices,
        required=False,
        help_text="Fills in the wire format, HTTP/2 and msgpack support and (when left empty) the "
        "base URL; new routes of this provider can start from its request settings.",
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
            "aws_region",
            "aws_access_key_id",
            "aws_secret_access_key",
            "extra_headers",
            "http2",
            "accepts_msgpack",
            "is_simulated",
            "is_active",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["base_url"].required = False  # a preset can supply it

    def clean_extra_headers(self) -> Any:
        value = self.cleaned_data.get("extra_headers")
        if (error := headers.extra_headers_error(value)) is not None:
            raise forms.ValidationError(error, code="credential_header")
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        preset = presets.PROVIDER_PRESETS.get(data.get("preset") or "")
        # Applied when chosen, not on every later save: edits made after it stay.
        if preset is not None and "preset" in self.changed_data:
            data["wire_format"], data["http2"] = preset["wire_format"], preset["http2"]
            data["accepts_msgpack"] = preset["accepts_msgpack"]
            data["base_url"] = data.get("base_url") or preset["base_url"]
            for name in ("wire_format", "http2", "accepts_msgpack", "base_url"):
                setattr(self.instance, name, data[name])
        if not data.get("base_url"):
            self.add_error("base_url", "Give the provider's base URL, or pick a preset.")
        self._check_aws(data)
        return data

    def _check_aws(self, data: dict[str, Any]) -> None:
        key_id, secret = data.get("aws_access_key_id"), data.get("aws_secret_access_key")
        if not (key_id or secret):
            return
        if data.get("wire_format") != WIRE_BEDROCK:
            self.add_error("aws_access_key_id", "Only Amazon Bedrock providers sign with SigV4.")
        elif not (key_id and secret):
            self.add_error("aws_secret_access_key", "Give both the access key id and the secret.")
        elif data.get("api_key"):
            self.add_error("api_key", "Give an API key or AWS credentials, not both.")

    def save(self, commit: bool = True) -> Provider:
        provider: Provider = super().save(commit=False)
        data = self.cleaned_data
        if data.get("clear_api_key"):
            provider.set_api_key("")
        elif data.get("api_key"):
            provider.set_api_key(data["api_key"])
        elif data.get("aws_access_key_id") and data.get("aws_secret_access_key"):
            provider.set_aws_credentials(data["aws_access_key_id"], data["aws_secret_access_key"])
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

    def save_model(self, request: HttpRequest, obj: Provider, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        if getattr(obj, "secrets_cleared", False):
            self.message_user(
                request,
                "The base URL now points to another origin, so the stored API key and this "
                "provider's route secret headers were removed: enter the key again.",
                level=messages.WARNING,
            )

    # Keep the typed key out of Django's error reports.
    @method_decorator(
        sensitive_post_parameters("api_key", "aws_access_key_id", "aws_secret_access_key")
    )
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
            "price_cached_input_per_mtok",
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
        choice = data.get("preset") or ""
        if choice == presets.PROVIDER_DEFAULTS:
            provider = data.get("provider")
            settings = provider and presets.provider_route_settings(provider.preset)
            if not settings:
                self.add_error("preset", "This provider was not made from a preset.")
            else:
                data.update(settings)
        elif (preset := presets.ROUTE_PRESETS.get(choice)) is not None:
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
        "price_cached_input_per_mtok",
        "quality_index",
        "token_limit_param",
        "service_tier",
        "headers_set",
        "is_active",
    ]
    list_filter = ["provider", "token_limit_param", "service_tier", "is_active"]
    search_fields = ["model_id", "display_name", "provider__name"]
    list_select_related = ["provider"]

    change_list_template = "admin/monitor/route/change_list.html"

    @admin.display(boolean=True, description="secret headers set")
    def headers_set(self, obj: Route) -> bool:
        return obj.has_secret_headers

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path(
                "import-prices/", wrap(self.import_prices_view), name="monitor_route_import_prices"
            ),
            path(
                "import-quality/",
                wrap(self.import_quality_view),
                name="monitor_route_import_quality",
            ),
            *super().get_urls(),
        ]

    def import_prices_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_change_permission(request):
            raise PermissionDenied
        form = (
            PriceImportForm(request.POST, request.FILES)
            if request.method == "POST"
            else PriceImportForm()
        )
        report = None
        if form.is_bound and form.is_valid():
            data = form.cleaned_data
            try:
                upload = data["file"]
                source = upload.name if upload else data["url"]
                raw = _uploaded(upload) if upload else fetch(data["url"])
                assert raw is not None
                report = prices.import_prices(prices.parse(raw, source), dry_run=data["dry_run"])
            except ImportFileError as exc:
                form.add_error(None, str(exc))
        return _import_page(request, self, "Import route prices (LiteLLM format)", form, report)

    def import_quality_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_change_permission(request):
            raise PermissionDenied
        form = (
            QualityImportForm(request.POST, request.FILES)
            if request.method == "POST"
            else QualityImportForm()
        )
        report = None
        if form.is_bound and form.is_valid():
            upload = form.cleaned_data["file"]
            try:
                raw = _uploaded(upload)
                assert raw is not None
                rows = quality.parse(raw, upload.name or "upload")
                report = quality.import_quality(rows, dry_run=form.cleaned_data["dry_run"])
            except ImportFileError as exc:
                form.add_error(None, str(exc))
        return _import_page(request, self, "Import quality index", form, report)

    @method_decorator(sensitive_post_parameters("secret_headers"))
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return super().changeform_view(request, object_id, form_url, extra_context)


class RegionKeyForm(forms.ModelForm[RegionKey]):
    # Write-only, like API keys: the region's workers get it as RW_REGION_KEYS=<key id>:<secret>.
    secret = forms.CharField(
        required=False,
        strip=True,
        min_length=32,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: at least 32 characters, e.g. from "
        '`python -c "import secrets; print(secrets.token_urlsafe(32))"`, or run '
        "`manage.py region_key new <slug>`, which makes and prints one. Give it to this "
        "region's workers first (RW_REGION_KEYS), then add it here: the newest active key signs.",
    )

    class Meta:
        model = RegionKey
        fields = ["secret", "is_active"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.instance.pk is None and not data.get("secret") and self.has_changed():
            self.add_error("secret", "A new key needs its secret.")
        return data

    def save(self, commit: bool = True) -> RegionKey:
        key: RegionKey = super().save(commit=False)
        if not key.key_id:
            key.key_id = RegionKey.new_key_id()
        if self.cleaned_data.get("secret"):
            key.set_secret(self.cleaned_data["secret"])
        if commit:
            key.save()
        return key


class RegionKeyInline(admin.TabularInline[RegionKey, Region]):
    model = RegionKey
    form = RegionKeyForm
    extra = 0
    fields = ["key_id", "secret", "is_active", "created_at"]
    readonly_fields = ["key_id", "created_at"]


@admin.register(Region)
class RegionAdmin(admin.ModelAdmin[Region]):
    list_display = ["name", "slug", "queue_name", "active_keys", "is_active"]
    list_filter = ["is_active"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [RegionKeyInline]

    @admin.display(description="active keys")
    def active_keys(self, obj: Region) -> int:
        return obj.keys.filter(is_active=True).count()

    @method_decorator(sensitive_post_parameters())
    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return super().changeform_view(request, object_id, form_url, extra_context)


class SchemaField(forms.JSONField):
    """A JSON field whose empty value shows empty: Django's JSONField renders a missing schema
    as the text `null`, which reads as a value (and saves as one if left there)."""

    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)


class EvalCaseForm(forms.ModelForm[EvalCase]):
    json_schema = SchemaField(
        required=False,
        label="JSON schema",
        help_text="For the JSON schema grader; leave empty otherwise.",
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
    )

    class Meta:
        model = EvalCase
        fields = ["name", "input", "grader", "expected", "tolerance", "json_schema", "is_active"]
        widgets = {
            "input": forms.Textarea(attrs={"rows": 3, "cols": 60}),
            "expected": forms.Textarea(attrs={"rows": 2, "cols": 60}),
        }


class EvalCaseInline(admin.StackedInline[EvalCase, Task]):
    """Stacked, not tabular: each case's fields under one another, each with its own label
    (the table layout had unlabelled fields and made the task form 2,799 px wide)."""

    model = EvalCase
    form = EvalCaseForm
    extra = 0
    fieldsets = [
        (None, {"fields": [("name", "grader", "is_active"), "input", "expected"]}),
        ("Grader settings", {"fields": ["tolerance", "json_schema"]}),
    ]


class ScenarioStepInline(admin.StackedInline[ScenarioStep, Task]):
    """A task with steps is a scenario: each slot runs them all on the route, in order, then
    validates the final answer with the eval case (the presets are actions on the task list)."""

    model = ScenarioStep
    extra = 0
    verbose_name = "scenario step"
    fields = [
        ("order", "kind", "fan_out"),
        "prompt_template",
        ("input_tokens", "max_tokens", "timeout_s"),
        "carry_context",
    ]


def _preset_action(key: str, label: str) -> Any:
    def action(modeladmin: TaskAdmin, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        for task in queryset:
            scenario_presets.apply(task, key)
        modeladmin.message_user(
            request, f"{queryset.count()} task(s) are now scenarios: {label}.", messages.SUCCESS
        )

    action.__name__ = f"scenario_{key.replace('-', '_')}"
    return admin.action(description=f"Make a scenario: {label}")(action)


def _multi(choices: list[tuple[str, str]], label: str) -> forms.TypedMultipleChoiceField:
    return forms.TypedMultipleChoiceField(
        choices=choices, widget=forms.CheckboxSelectMultiple, label=label
    )


class TaskForm(forms.ModelForm[Task]):
    # Candidate routes and regions as labelled checkboxes: the admin's two-box filter widget
    # puts aria-label on elements that may not carry one (axe-core: aria-prohibited-attr).
    routes = forms.ModelMultipleChoiceField(
        queryset=Route.objects.select_related("provider").order_by("provider__name", "model_id"),
        widget=forms.CheckboxSelectMultiple,
        required=False,
    )
    regions = forms.ModelMultipleChoiceField(
        queryset=Region.objects.order_by("name"),
        widget=forms.CheckboxSelectMultiple,
        required=False,
    )
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
    inlines = [EvalCaseInline, ScenarioStepInline]
    actions = [_preset_action(k, label) for k, (label, _) in scenario_presets.PRESETS.items()]
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
                    "ttft_budget_on_answer",
                    "max_error_rate",
                    "min_pass_rate",
                    "min_graded",
                    "min_quality_index",
                ],
                "description": "The latency class sets a default for every empty setting: "
                "interactive ranks on TTFT p95 (time to first answer token p95 when a route "
                "reasons), with a 2 s TTFT budget, at most 2% errors and 20 graded probes; async "
                "on e2e p50 with a 30 s e2e p95 budget, 5% errors; batch on e2e p50, preferring "
                "the cheaper of routes tied within noise, 10% errors and 10 graded probes.",
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
            {
                "fields": [
                    "http_versions",
                    "body_encodings",
                    "connection_modes",
                    "prefix_modes",
                    "reference_http_version",
                    "reference_connection_mode",
                    "reference_body_encoding",
                    "reference_prefix_mode",
                ],
                "description": "Every other probe uses the reference options, and only those "
                "rank routes; the probes between cycle through the other combinations and feed "
                "the route page's comparisons. Each combination meets each eval case equally "
                "often.",
            },
        ),
        ("Spend", {"fields": ["monthly_spend_cap_usd"]}),
    ]

    change_form_template = "admin/monitor/task/change_form.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Task]:
        return super().get_queryset(request).prefetch_related("routes")

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:task_id>/import-evals/",
                self.admin_site.admin_view(self.import_evals_view),
                name="monitor_task_import_evals",
            ),
            *super().get_urls(),
        ]

    def import_evals_view(self, request: HttpRequest, task_id: int) -> HttpResponse:
        task = get_object_or_404(Task, pk=task_id)
        if not (
            self.has_change_permission(request, task)
            and request.user.has_perm("monitor.add_evalcase")
        ):
            raise PermissionDenied
        form = (
            EvalImportForm(request.POST, request.FILES)
            if request.method == "POST"
            else EvalImportForm()
        )
        report = None
        if form.is_bound and form.is_valid():
            data = form.cleaned_data
            name = data["file"].name or "upload"
            try:
                raw = _uploaded(data["file"])
                assert raw is not None
                parsed = evals.parse(
                    raw,
                    name,
                    fmt=data["format"] or None,
                    grader=data["grader"],
                    tolerance=data["tolerance"],
                    input_var=data["input_var"],
                )
                report = evals.import_cases(task, parsed, source=name, dry_run=data["dry_run"])
            except ImportFileError as exc:
                form.add_error(None, str(exc))
        return _import_page(request, self, f"Import eval cases into {task}", form, report)

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
    SHA-256 are kept, so the token is shown once, on the page that answers the save."""

    list_display = ["name", "prefix", "created_at", "last_used_at", "is_active"]
    list_filter = ["is_active"]
    search_fields = ["name", "prefix"]
    fields = ["name", "is_active", "prefix", "created_at", "last_used_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at"]

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if not change:
            issued = tokens.issue()
            obj.prefix, obj.digest = issued.prefix, issued.digest
            # On the object for this request's answer only (response_add), never stored.
            setattr(obj, _ISSUED_ATTR, issued.token)
        super().save_model(request, obj, form, change)

    def response_add(
        self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None
    ) -> HttpResponse:
        """The token on the answer to the POST that made it, not after a redirect: carried
        there it would sit in Django's messages, a cookie anyone holding it can decode, or
        in the session table."""
        token = getattr(obj, _ISSUED_ATTR, None)
        if token is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "API token created",
            "token": token,
            "token_row": obj,
        }
        response = TemplateResponse(request, "admin/monitor/apitoken/issued.html", context)
        patch_cache_control(response, no_store=True)
        return response


# The attribute that carries a new token from save_model to response_add.
_ISSUED_ATTR = "_rw_issued"
