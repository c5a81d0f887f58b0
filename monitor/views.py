from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from monitor import overview as overview_data
from monitor.http import HtmxHttpRequest
from monitor.models import Heartbeat, ProbeResult


@login_required
def overview(request: HtmxHttpRequest) -> HttpResponse:
    tick = Heartbeat.objects.filter(name="tick").first()
    last_probe = ProbeResult.objects.order_by("-started_at").only("started_at").first()
    now = timezone.now()
    ctx = {
        "rows": overview_data.build(now),
        "tick": tick,
        "tick_stale": tick is None or now - tick.last_seen > timedelta(minutes=2),
        "last_probe": last_probe,
        "window_hours": int(overview_data.WINDOW.total_seconds() // 3600),
    }
    template = "front/overview.html"
    if request.htmx:
        template += "#overview-body"
    return render(request, template, ctx)


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers and compose healthchecks: the database answers."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})
