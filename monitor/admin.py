"""The admin: configuration (providers from presets, routes, regions and their keys, tasks with
their eval cases and steps), imports, measurements read-only, digests and API tokens. Its
forms (secrets write-only, presets, choices from the registries) are monitor.admin_forms.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.cache import patch_cache_control

from monitor import scenario_presets
from monitor.admin_forms import (
    EvalCaseForm,
    EvalImportForm,
    PriceImportForm,
    ProviderForm,
    QualityImportForm,
    RegionKeyForm,
    RouteForm,
    SecretsAdmin,
    TaskForm,
    uploaded,
)
from monitor.api import tokens
from monitor.imports import evals, prices, quality
from monitor.imports.base import ImportFileError, Report
from monitor.imports.fetch import fetch
from monitor.models import (
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


@admin.register(Provider)
class ProviderAdmin(SecretsAdmin[Provider]):
    # The typed key kept out of Django's error reports.
    secret_fields = ("api_key", "aws_access_key_id", "aws_secret_access_key")
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


@admin.register(Route)
class RouteAdmin(SecretsAdmin[Route]):
    secret_fields = ("secret_headers",)
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
                raw = uploaded(upload) if upload else fetch(data["url"])
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
                raw = uploaded(upload)
                assert raw is not None
                rows = quality.parse(raw, upload.name or "upload")
                report = quality.import_quality(rows, dry_run=form.cleaned_data["dry_run"])
            except ImportFileError as exc:
                form.add_error(None, str(exc))
        return _import_page(request, self, "Import quality index", form, report)


class RegionKeyInline(admin.TabularInline[RegionKey, Region]):
    model = RegionKey
    form = RegionKeyForm
    extra = 0
    fields = ["key_id", "secret", "is_active", "created_at"]
    readonly_fields = ["key_id", "created_at"]


@admin.register(Region)
class RegionAdmin(SecretsAdmin[Region]):
    secret_fields = ()  # every field: its inline's key secrets
    list_display = ["name", "slug", "queue_name", "active_keys", "is_active"]
    list_filter = ["is_active"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [RegionKeyInline]

    @admin.display(description="active keys")
    def active_keys(self, obj: Region) -> int:
        return obj.keys.filter(is_active=True).count()


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
                raw = uploaded(data["file"])
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


import monitor.alerts.admin  # noqa: E402, F401  (alert rules, channels, silences: monitor.alerts)
