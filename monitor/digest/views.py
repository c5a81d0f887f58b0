"""Pages of the weekly digest: the user's subscription settings, a preview, unsubscribe."""

from __future__ import annotations

from typing import Any
from zoneinfo import available_timezones

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.signing import BadSignature, SignatureExpired
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

from monitor.digest import report, sending
from monitor.models import Subscription, Task


class AuthenticatedHttpRequest(HttpRequest):
    user: User


HOURS = [(h, f"{h:02d}:00") for h in range(24)]


class SubscriptionForm(forms.ModelForm[Subscription]):
    hour = forms.TypedChoiceField(choices=HOURS, coerce=int, help_text="In your time zone.")
    tasks = forms.ModelMultipleChoiceField(
        queryset=Task.objects.filter(is_active=True),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Leave all unticked for every task, including ones added later.",
    )

    class Meta:
        model = Subscription
        fields = ["is_active", "tasks", "weekday", "hour", "time_zone"]
        labels = {"is_active": "Send me the weekly digest"}
        widgets = {"time_zone": forms.TextInput(attrs={"list": "time-zones"})}

    def clean_time_zone(self) -> str:
        return str(self.cleaned_data["time_zone"]).strip()


def _subscription_of(user: User) -> Subscription:
    """The user's subscription, or an unsaved one with defaults (nothing saved on a GET)."""
    try:
        return Subscription.objects.get(user=user)
    except Subscription.DoesNotExist:
        return Subscription(user=user, time_zone=settings.TIME_ZONE, is_active=True)


@login_required
@require_http_methods(["GET", "POST"])
def settings_page(request: AuthenticatedHttpRequest) -> HttpResponse:
    subscription = _subscription_of(request.user)
    form = SubscriptionForm(request.POST or None, instance=subscription)
    if request.method == "POST" and form.is_valid():
        subscription = form.save(commit=False)
        subscription.reschedule_if_changed(form.changed_data, timezone.now())
        subscription.save()
        form.save_m2m()
        messages.success(request, "Your digest settings are saved.")
        return redirect("rw-digest-settings")
    ctx: dict[str, Any] = {
        "form": form,
        "subscription": subscription,
        "time_zones": sorted(available_timezones()),
    }
    return render(request, "digest/settings.html", ctx)


@login_required
@require_GET
def preview(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The logged-in user's digest as it would read now: the week up to this hour."""
    subscription = _subscription_of(request.user)
    period = report.period_ending(timezone.now())
    figures = report.build_report(report.tasks_for(subscription), period)
    ctx = sending.digest_context(subscription, figures, period, preview=True)
    if request.GET.get("format") == "text":
        return render(
            request, "emails/digest-body-text.html", ctx, content_type="text/plain; charset=utf-8"
        )
    return render(request, "emails/digest-body-html.html", ctx)


@csrf_exempt  # The signed token is the authentication; one-click POSTs carry no CSRF token.
@require_http_methods(["GET", "POST"])
def unsubscribe(request: HttpRequest, token: str) -> HttpResponse:
    """GET: a confirm form (mail scanners follow links). POST: unsubscribe, from that form or
    from a mail client's one-click `List-Unsubscribe=One-Click` request."""
    try:
        pk = sending.subscription_pk_from_token(token)
    except SignatureExpired:
        ctx = {"reason": "This unsubscribe link has expired."}
        return render(request, "digest/unsubscribe-refused.html", ctx, status=400)
    except (BadSignature, ValueError):
        ctx = {"reason": "This unsubscribe link is not valid."}
        return render(request, "digest/unsubscribe-refused.html", ctx, status=400)
    if request.method == "POST":
        sending.unsubscribe(pk)
        return render(request, "digest/unsubscribed.html", {})
    return render(request, "digest/unsubscribe-confirm.html", {"token": token})
