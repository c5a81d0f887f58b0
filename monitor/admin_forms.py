"""The admin's forms (monitor.admin): a provider's key and a route's secret headers write-only
(never rendered back), presets filled in, a region key issued once, a task's options from the
registries, and the import pages' uploads.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from django import forms
from django.contrib import admin
from django.core.files.uploadedfile import UploadedFile
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.views.decorators.debug import sensitive_post_parameters

from monitor import headers, presets
from monitor.imports import eval_cases
from monitor.imports.base import MAX_IMPORT_BYTES, ImportFileError
from monitor.models import (
    BODY_ENCODINGS,
    CONNECTION_MODES,
    GRADER_EXACT,
    GRADERS,
    HTTP_VERSIONS,
    PREFIX_MODES,
    WIRE_BEDROCK,
    EvalCase,
    Provider,
    Region,
    RegionKey,
    Route,
    Task,
)

M = TypeVar("M", bound=Model)


def write_only(
    help_text: str, *, label: str | None = None, autocomplete: str = "new-password", **kw: Any
) -> forms.CharField:
    """A secret's field (an API key, secret headers, a channel's URL or signing secret): the
    widget never renders a value back, and a blank field keeps the stored value."""
    return forms.CharField(
        label=label,
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": autocomplete}),
        help_text=help_text,
        **kw,
    )


class SecretsAdmin(admin.ModelAdmin[M]):
    """An admin whose change form takes secrets: the POST fields named in `secret_fields`
    (empty: every field) are kept out of Django's error reports."""

    secret_fields: tuple[str, ...] = ()

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        view = sensitive_post_parameters(*self.secret_fields)(super().changeform_view)
        response: HttpResponse = view(request, object_id, form_url, extra_context)
        return response


# RFC 9110 token characters: a header name a client library will send as it is.
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class _ImportForm(forms.Form):
    dry_run = forms.BooleanField(
        label="Dry run: show the changes, write nothing", required=False, initial=True
    )


def uploaded(upload: UploadedFile | None) -> bytes | None:
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
        choices=[("", "by file extension")] + [(f, f) for f in eval_cases.FORMATS], required=False
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


class ProviderForm(forms.ModelForm[Provider]):
    # Write-only: the widget never renders a value back, and a blank field keeps the stored key.
    api_key = write_only(
        "Write-only: stored encrypted, never shown again. Leave blank to keep the current key.",
        label="API key",
    )
    clear_api_key = forms.BooleanField(label="Remove the stored API key", required=False)
    # Amazon Bedrock's SigV4 credentials: write-only too, stored encrypted in the key's place.
    aws_access_key_id = write_only(
        "Amazon Bedrock, instead of an API key: with the secret below, requests are signed "
        "with SigV4. Write-only.",
        label="AWS access key id",
        autocomplete="off",
    )
    aws_secret_access_key = write_only(
        "Write-only: stored encrypted like API keys, never shown again.",
        label="AWS secret access key",
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


class RouteForm(forms.ModelForm[Route]):
    preset = forms.ChoiceField(
        choices=presets.route_choices,
        required=False,
        help_text="Sets the request settings below to what this kind of model needs.",
    )
    # Write-only, like API keys: stored encrypted, never rendered back or logged.
    secret_headers = write_only(
        'A JSON object, e.g. {"api-key": "..."} or a gateway\'s key header. Write-only: '
        "stored encrypted, never shown again. Leave blank to keep the stored headers.",
        label="secret headers",
        autocomplete="off",
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


class RegionKeyForm(forms.ModelForm[RegionKey]):
    # Write-only, like API keys: the region's workers get it as RW_REGION_KEYS=<key id>:<secret>.
    secret = write_only(
        "Write-only: at least 32 characters, e.g. from "
        '`python -c "import secrets; print(secrets.token_urlsafe(32))"`, or run '
        "`manage.py region_key new <slug>`, which makes and prints one. Give it to this "
        "region's workers first (RW_REGION_KEYS), then add it here: the newest active key signs.",
        min_length=32,
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


def _multi(choices: list[tuple[str, str]], label: str) -> forms.TypedMultipleChoiceField:
    return forms.TypedMultipleChoiceField(
        choices=choices, widget=forms.CheckboxSelectMultiple, label=label
    )


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Declared fields lose the model's defaults: a new task starts with them ticked (one
        # HTTP version, JSON, warm, stable), not four empty "This field is required." groups.
        if self.instance.pk is None:
            for name in ("http_versions", "body_encodings", "connection_modes", "prefix_modes"):
                self.fields[name].initial = Task._meta.get_field(name).get_default()
