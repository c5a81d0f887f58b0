"""Admin for alerts: rules per task (with their backtest), channels (write-only URLs and
secrets, a test-send button), silences, maintenance windows, and read-only history."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.decorators import method_decorator
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_POST

from monitor.admin_forms import SecretsAdmin, write_only
from monitor.alerts import backtest, channels, delivery
from monitor.alerts.models import (
    CHANNEL_EMAIL,
    CHANNEL_WEBHOOK,
    Alert,
    AlertChannel,
    AlertEvent,
    AlertNotification,
    AlertRule,
    MaintenanceWindow,
    Silence,
    default_rules,
    site_url,
)
from monitor.models import Task


class AlertChannelForm(forms.ModelForm[AlertChannel]):
    # Write-only, like API keys: never rendered back; blank keeps the stored value.
    target_url = write_only(
        "Webhook: the receiver's URL. Slack, Teams, Discord, PagerDuty, Opsgenie: the "
        "service's Apprise URL (slack://T…/B…/X…, workflows://…, discord://id/token, "
        "pagerduty://integration-key@api-key, opsgenie://api-key) or its own webhook URL. "
        "Write-only: stored encrypted, never shown again. Leave blank to keep it.",
        label="URL",
        autocomplete="off",
    )
    signing_secret = write_only(
        "Webhook: the HMAC-SHA256 key the receiver checks signatures with "
        "(docs/alerts.md). Write-only. Leave blank to keep it.",
    )

    class Meta:
        model = AlertChannel
        fields = ["name", "kind", "email", "target_url", "signing_secret", "is_active"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind = data.get("kind")
        url = data.get("target_url") or ""
        if kind == CHANNEL_EMAIL:
            if not data.get("email"):
                self.add_error("email", "An e-mail channel needs an address.")
            return data
        if not url and not self.instance.target_encrypted:
            self.add_error("target_url", "This channel needs a URL.")
        elif url:
            try:
                data["target_host"] = channels.check_target(str(kind), url)
            except ValidationError as exc:
                self.add_error("target_url", exc)
        elif "kind" in self.changed_data:
            self.add_error("target_url", "Give the URL again for the new kind.")
        if (
            kind == CHANNEL_WEBHOOK
            and not data.get("signing_secret")
            and not self.instance.secret_encrypted
        ):
            self.add_error("signing_secret", "A webhook is signed: give the receiver's secret.")
        return data

    def save(self, commit: bool = True) -> AlertChannel:
        channel: AlertChannel = super().save(commit=False)
        data = self.cleaned_data
        if data.get("target_url"):
            channel.set_target(data["target_url"])
            channel.target_host = data.get("target_host", "")
        if data.get("signing_secret"):
            channel.set_secret(data["signing_secret"])
        if commit:
            channel.save()
        return channel


@admin.register(AlertChannel)
class AlertChannelAdmin(SecretsAdmin[AlertChannel]):
    secret_fields = ("target_url", "signing_secret")
    form = AlertChannelForm
    list_display = ["name", "kind", "target_host", "email", "is_active"]
    list_filter = ["kind", "is_active"]
    change_form_template = "admin/monitor/alertchannel/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "<int:channel_id>/test-send/",
                self.admin_site.admin_view(self.test_send_view),
                name="monitor_alertchannel_test_send",
            ),
            *super().get_urls(),
        ]

    @method_decorator(require_POST)
    def test_send_view(self, request: HttpRequest, channel_id: int) -> HttpResponse:
        channel = get_object_or_404(AlertChannel, pk=channel_id)
        if not self.has_change_permission(request, channel):
            raise PermissionDenied
        outcome, error = send_test(channel)
        if outcome == "sent":
            self.message_user(request, f"Test notification sent to {channel}.")
        else:
            self.message_user(request, f"The test did not go through: {error}", messages.ERROR)
        return HttpResponseRedirect(reverse("admin:monitor_alertchannel_change", args=[channel.pk]))


def send_test(channel: AlertChannel) -> tuple[str, str]:
    """Send a test message now, through the same outbox as alerts (logged with its outcome)."""
    now = timezone.now()
    n = AlertNotification.objects.create(channel=channel, next_attempt_at=now)
    message = channels.AlertMessage(
        delivery_id=n.delivery_id,
        alert_id=None,
        dedup_key=f"routewatch-test-{n.pk}",
        event="test",
        state="test",
        rule="test",
        task="",
        title="[Routewatch TEST] a test notification",
        summary=f"This is a test from Routewatch to the channel {channel.name!r}.",
        why="an admin pressed the channel's test-send button",
        metric="",
        unit="",
        figure=None,
        low=None,
        high=None,
        samples=None,
        threshold=None,
        threshold_label="",
        regions=[],
        regions_total=None,
        regions_needed=None,
        at=now.isoformat(),
        onset_at="",
        confident_at="",
        since="",
        url=site_url(reverse("rw-alerts")),
        history_url=site_url(reverse("rw-alerts")),
        ack_url="",
        snooze_url="",
    )
    AlertNotification.objects.filter(pk=n.pk).update(message=dict(message))
    n.refresh_from_db()
    outcome = delivery.send_one(n, now)
    n.refresh_from_db()
    if outcome == "sent":
        return outcome, ""
    # A test is not retried: one try, its outcome shown.
    AlertNotification.objects.filter(pk=n.pk, status="pending").update(status="failed")
    return outcome, n.last_error


class DefaultRulesForm(forms.Form):
    task = forms.ModelChoiceField(queryset=Task.objects.all())


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin[AlertRule]):
    change_list_template = "admin/monitor/alertrule/change_list.html"
    list_display = ["__str__", "task", "kind", "metric", "min_regions", "is_enabled"]
    list_filter = ["kind", "is_enabled", "task"]
    filter_horizontal = ["channels", "escalation_channels"]
    readonly_fields = ["backtest_report"]
    fieldsets = [
        (None, {"fields": ["task", "name", "kind", "is_enabled", "backtest_report"]}),
        (
            "The line (empty fields: the task's values or its latency class's defaults)",
            {
                "fields": [
                    "metric",
                    "threshold_ms",
                    "baseline_ratio",
                    "error_ceiling",
                    "window_minutes",
                    "min_regions",
                    "for_minutes",
                ]
            },
        ),
        (
            "Whom to tell",
            {
                "fields": [
                    "channels",
                    "remind_every_minutes",
                    "escalate_after_minutes",
                    "escalation_channels",
                ]
            },
        ),
    ]

    def get_urls(self) -> list[URLPattern]:
        return [
            path(
                "defaults/",
                self.admin_site.admin_view(self.defaults_view),
                name="monitor_alertrule_defaults",
            ),
            *super().get_urls(),
        ]

    def defaults_view(self, request: HttpRequest) -> HttpResponse:
        """Add a task's default rules (disabled), from its latency class."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = DefaultRulesForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            task = form.cleaned_data["task"]
            have = set(AlertRule.objects.filter(task=task).values_list("kind", flat=True))
            added = [r for r in default_rules(task) if r.kind not in have]
            AlertRule.objects.bulk_create(added)
            self.message_user(
                request,
                f"Added {len(added)} default rule{'s' if len(added) != 1 else ''} for {task}, "
                "disabled: open each to see its backtest, then enable it.",
            )
            return HttpResponseRedirect(reverse("admin:monitor_alertrule_changelist"))
        ctx = {**self.admin_site.each_context(request), "form": form, "title": "Default rules"}
        return TemplateResponse(request, "admin/monitor/alertrule/defaults.html", ctx)

    @admin.display(description="Backtest")
    def backtest_report(self, obj: AlertRule) -> SafeString:
        if obj.pk is None:
            return mark_safe("Save the rule (disabled) to see how often it would have fired.")
        result = backtest.run(obj, timezone.now())
        return mark_safe(  # noqa: S308  (rendered by the template, which escapes)
            render_to_string("admin/monitor/alertrule/backtest.html", {"b": result})
        )


@admin.register(Silence)
class SilenceAdmin(admin.ModelAdmin[Silence]):
    list_display = [
        "reason",
        "rule",
        "task",
        "route",
        "region",
        "starts_at",
        "ends_at",
        "created_by",
    ]
    readonly_fields = ["created_by"]

    def save_model(self, request: HttpRequest, obj: Silence, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user.get_username()
        super().save_model(request, obj, form, change)


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(admin.ModelAdmin[MaintenanceWindow]):
    list_display = [
        "name",
        "task",
        "route",
        "provider",
        "region",
        "starts_at",
        "ends_at",
        "weekday",
        "start_time",
        "is_active",
    ]


class AlertEventInline(admin.TabularInline[AlertEvent, Alert]):
    model = AlertEvent
    extra = 0
    can_delete = False
    fields = ["at", "kind", "note"]
    readonly_fields = ["at", "kind", "note"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin[Alert]):
    list_display = [
        "summary",
        "rule",
        "state",
        "onset_at",
        "started_at",
        "fired_at",
        "resolved_at",
        "acked_at",
    ]
    list_filter = ["state", "rule__kind"]
    inlines = [AlertEventInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(AlertNotification)
class AlertNotificationAdmin(admin.ModelAdmin[AlertNotification]):
    """The delivery log: every notification and its outcome."""

    list_display = ["pk", "channel", "event", "status", "attempts", "sent_at", "last_error"]
    list_filter = ["status", "channel"]
    exclude = ["message"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
