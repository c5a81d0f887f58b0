"""The alert history page, and acknowledging or snoozing an alert from a notification's link."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.signing import BadSignature, SignatureExpired, TimestampSigner
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from monitor.alerts import lifecycle
from monitor.alerts.delivery import ACTION_SALT
from monitor.alerts.models import (
    STATE_FIRING,
    STATE_PENDING,
    STATE_RESOLVED,
    Alert,
    AlertEvent,
    AlertNotification,
    MaintenanceWindow,
    Silence,
)

HISTORY_ROWS = 100
ACTION_MAX_AGE = timedelta(days=7)
SNOOZES = [(1, "1 hour"), (4, "4 hours"), (24, "1 day")]


def _alerts(qs: Any) -> list[Alert]:
    events = AlertEvent.objects.prefetch_related(
        Prefetch("notifications", queryset=AlertNotification.objects.select_related("channel"))
    ).order_by("at", "pk")
    return list(
        qs.select_related("rule__task", "route__provider", "region").prefetch_related(
            Prefetch("events", queryset=events)
        )[:HISTORY_ROWS]
    )


@login_required
@require_GET
def history(request: HttpRequest) -> HttpResponse:
    """Open alerts first, then the latest resolved ones, each with every state change and
    what was told to whom (and what was not, and why)."""
    now = timezone.now()
    ctx = {
        "open_alerts": _alerts(Alert.objects.filter(state__in=[STATE_PENDING, STATE_FIRING])),
        "resolved": _alerts(Alert.objects.filter(state=STATE_RESOLVED).order_by("-resolved_at")),
        "silences": Silence.objects.filter(ends_at__gt=now).select_related(
            "rule", "task", "route", "region"
        ),
        "maintenance": [
            w for w in MaintenanceWindow.objects.filter(is_active=True) if w.covers(now)
        ],
        "undelivered": AlertNotification.objects.exclude(status="sent")
        .select_related("channel")
        .order_by("-created_at")[:20],
        "now": now,
    }
    return render(request, "alerts/history.html", ctx)


def _unsign(token: str) -> tuple[int, str]:
    """(alert id, action) of a signed link; BadSignature or SignatureExpired otherwise."""
    value = TimestampSigner(salt=ACTION_SALT).unsign(token, max_age=ACTION_MAX_AGE)
    alert_id, _, action = value.partition(":")
    if action not in ("ack", "snooze"):
        raise BadSignature("unknown action")
    return int(alert_id), action


@require_http_methods(["GET", "POST"])
def action(request: HttpRequest, token: str) -> HttpResponse:
    """GET: a confirm form (mail and chat scanners follow links). POST: acknowledge, or
    snooze for the chosen hours. The signed link is the authentication."""
    try:
        alert_id, what = _unsign(token)
    except SignatureExpired:
        return render(
            request, "alerts/action.html", {"refused": "This link has expired."}, status=400
        )
    except (BadSignature, ValueError):
        return render(
            request, "alerts/action.html", {"refused": "This link is not valid."}, status=400
        )
    alert = Alert.objects.select_related("rule__task").filter(pk=alert_id).first()
    if alert is None:
        return render(
            request, "alerts/action.html", {"refused": "This alert no longer exists."}, status=404
        )
    ctx: dict[str, Any] = {"alert": alert, "action": what, "token": token, "snoozes": SNOOZES}
    if request.method == "POST":
        now = timezone.now()
        by = request.user.get_username() if request.user.is_authenticated else "a signed link"
        if what == "ack":
            ctx["done"] = lifecycle.acknowledge(alert.pk, now, by)
        else:
            try:
                hours = int(request.POST.get("hours", "1"))
            except ValueError:
                hours = 0
            if hours not in dict(SNOOZES):
                ctx["refused"] = "Pick one of the snooze lengths offered."
                return render(request, "alerts/action.html", ctx, status=400)
            ctx["done"] = lifecycle.snooze(alert.pk, now + timedelta(hours=hours), now, by)
        alert.refresh_from_db()
        ctx["posted"] = True
    return render(request, "alerts/action.html", ctx)
