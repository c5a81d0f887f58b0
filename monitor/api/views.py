"""The read API's views: a bearer token, GET or HEAD, JSON with an ETag.

Every call under /api/v1/ needs an API token: a browser session does not stand in for one,
and PUBLIC_READONLY_PAGES never opens the API. The description of the API is the exception:
`openapi.json` answers a logged-in user's session as well as a token, and `docs` (the
description rendered by Swagger UI, vendored under static/) is a page for logged-in users. The API only reads,
so it needs no CSRF check; any other method is answered 405 before the token is looked at.
Responses carry an ETag (a hash of the body) and `Cache-Control: private, max-age=<the
overview's refresh interval>`, so a poller revalidates with If-None-Match and gets a 304
with no body until the snapshot changes.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from typing import Any, overload

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import get_conditional_response, patch_vary_headers
from django.views.decorators.csrf import csrf_exempt

from monitor.api import answers, openapi, tokens
from monitor.api.answers import ApiError

JSON = "application/json"
REALM = 'Bearer realm="routewatch-api"'
ALLOWED_METHODS = ("GET", "HEAD")

Payload = Any  # a TypedDict of monitor.api.answers, or a list of them
Endpoint = Callable[..., Payload]
View = Callable[..., HttpResponseBase]


def _json_response(status: int, body: bytes, headers: dict[str, str]) -> HttpResponse:
    response = HttpResponse(body, status=status, content_type=JSON, headers=headers)
    patch_vary_headers(response, ["Authorization"])
    return response


def _error(error: ApiError, headers: dict[str, str] | None = None) -> HttpResponse:
    body = {"error": error.code, "message": error.message, **error.extra}
    return _json_response(
        error.status,
        json.dumps(body).encode(),
        {"Cache-Control": "no-store", **(headers or {})},
    )


def _refused(request: HttpRequest, *, session_ok: bool = False) -> HttpResponse | None:
    """The error response for a request the API does not serve, or None. With `session_ok`,
    a logged-in user's session is enough (the description, not the calls)."""
    if request.method not in ALLOWED_METHODS:
        return _error(
            ApiError(405, "method_not_allowed", "The API is read-only: use GET or HEAD."),
            {"Allow": ", ".join(ALLOWED_METHODS)},
        )
    user = getattr(request, "user", None)
    if session_ok and user is not None and user.is_authenticated:
        return None
    token = tokens.bearer(request.headers.get("Authorization", ""))
    if token is None:
        return _error(
            ApiError(401, "token_required", "Send an API token: Authorization: Bearer <token>."),
            {"WWW-Authenticate": REALM},
        )
    if tokens.authenticate(token, timezone.now()) is None:
        # Wrong and revoked tokens get the same answer: no oracle for which tokens existed.
        return _error(
            ApiError(401, "invalid_token", "The API token is not valid (wrong or revoked)."),
            {"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
        )
    return None


@overload
def api_endpoint(view: Endpoint) -> View: ...
@overload
def api_endpoint(*, session_ok: bool) -> Callable[[Endpoint], View]: ...


def api_endpoint(
    view: Endpoint | None = None, *, session_ok: bool = False
) -> View | Callable[[Endpoint], View]:
    """Token check (or, with `session_ok`, a logged-in session), then the view's payload as
    JSON with an ETag and cache headers. `@api_endpoint` or `@api_endpoint(session_ok=True)`."""
    if view is None:
        return lambda endpoint: _endpoint(endpoint, session_ok)
    return _endpoint(view, session_ok)


def _endpoint(view: Endpoint, session_ok: bool) -> View:
    @csrf_exempt
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        refused = _refused(request, session_ok=session_ok)
        if refused is not None:
            return refused
        try:
            payload = view(request, *args, **kwargs)
        except ApiError as error:
            return _error(error)
        body = json.dumps(payload, separators=(",", ":")).encode()
        etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
        response = _json_response(
            200,
            body,
            {
                "ETag": etag,
                "Cache-Control": f"private, max-age={settings.DASHBOARD_REFRESH_SECONDS}",
            },
        )
        if session_ok:
            patch_vary_headers(response, ["Cookie"])
        # If-None-Match naming this ETag: 304, no body, the same ETag and cache headers.
        return get_conditional_response(request, etag=etag, response=response) or response

    return wrapper


@api_endpoint
def task_route(request: HttpRequest, slug: str) -> answers.AnswerJSON:
    return answers.answer(slug, request.GET.get("region") or None, timezone.now())


@api_endpoint
def task_list(request: HttpRequest) -> dict[str, list[answers.TaskJSON]]:
    route_url = reverse("rw-api-task-route", args=["SLUG"]).replace("SLUG", "{slug}")
    return {"tasks": answers.tasks(route_url)}


@api_endpoint
def route_list(request: HttpRequest) -> dict[str, list[answers.RouteListItemJSON]]:
    return {"routes": answers.routes()}


@api_endpoint(session_ok=True)
def openapi_description(request: HttpRequest) -> dict[str, Any]:
    return openapi.description(server_url=reverse("rw-api-tasks").removesuffix("/tasks/"))


@login_required
def docs(request: HttpRequest) -> HttpResponse:
    """The OpenAPI description, readable in the browser (Swagger UI): trying a call out asks
    for an API token, as every call does."""
    return render(request, "api/docs.html", {"description_url": reverse("rw-api-openapi")})
