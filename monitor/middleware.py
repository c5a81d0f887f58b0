from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

# Scripts only from our own origin (htmx and Chart.js are vendored): no inline script, no eval.
CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        # Django admin and Chart.js set inline styles; styles cannot run code.
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        return response


class HealthzMiddleware:
    """Answers /healthz before Host validation: compose and load balancers ask by address
    (127.0.0.1), not by the host name in ALLOWED_HOSTS. Safe to answer whatever the Host:
    the reply says only that the database answers, and builds no URL from the Host."""

    PATH = "/healthz"

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info != self.PATH or request.method not in ("GET", "HEAD"):
            return self.get_response(request)
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return JsonResponse({"status": "ok"})
