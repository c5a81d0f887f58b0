"""The OpenAPI 3.1 description of the read API, written by hand next to the shapes it
describes (monitor.api.answers). tests/monitor/api/test_api_openapi.py validates it, checks
that it names every URL under /api/v1/, and checks real answers against its schemas."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monitor.models import LATENCY_CLASSES, LATENCY_METRICS, WIRE_FORMATS

VERSION = "1.0.0"


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [schema, {"type": "null"}]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(properties: dict[str, Any], description: str = "") -> dict[str, Any]:
    # Closed: an answer with a field the description does not name fails the tests.
    schema: dict[str, Any] = {
        "type": "object",
        "required": list(properties),
        "properties": properties,
        "additionalProperties": False,
    }
    if description:
        schema["description"] = description
    return schema


NUMBER_OR_NULL = {"type": ["number", "null"]}
STRING = {"type": "string"}
TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}

ROUTE: dict[str, Any] = {
    "id": {"type": "integer"},
    "label": STRING,
    "provider": _object({"slug": STRING, "name": STRING}),
    "base_url": {
        "type": "string",
        "description": "The provider's base URL without credentials, query or fragment.",
    },
    "wire_format": {"type": "string", "enum": [w for w, _ in WIRE_FORMATS]},
    "model_id": STRING,
    "settings": _object(
        {
            "token_limit_param": {
                "type": "string",
                "description": "max_tokens or max_completion_tokens.",
            },
            "reasoning_effort": {"type": "string", "description": "Empty: not sent."},
            "thinking_budget_tokens": {"type": ["integer", "null"]},
            "service_tier": {"type": "string", "description": "Empty: not sent."},
            "temperature": NUMBER_OR_NULL,
            "extra_body": {"type": "object", "description": "Merged into the body."},
            "api_version": {"type": "string", "description": "Azure's api-version."},
        },
        "The request settings the probes send. API keys and secret headers are never "
        "part of the API: an application brings its own.",
    ),
}
INTERVAL: dict[str, Any] = {
    "value": NUMBER_OR_NULL,
    "low": NUMBER_OR_NULL,
    "high": NUMBER_OR_NULL,
}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "additionalProperties": False,
        "required": ["error", "message"],
        "properties": {
            "error": {
                "type": "string",
                "description": "A stable code: token_required, invalid_token, "
                "method_not_allowed, unknown_task, unknown_region, region_required, "
                "configuration_changed.",
            },
            "message": {"type": "string", "description": "For people."},
            "regions": {
                "type": "array",
                "items": STRING,
                "description": "The valid region slugs (region_required, unknown_region).",
            },
            "tasks": {
                "type": "array",
                "items": STRING,
                "description": "The valid task slugs (unknown_task).",
            },
        },
    },
    "Route": _object(
        ROUTE, "A route: one model at one provider, with the settings it is probed with."
    ),
    "RouteListItem": _object(
        {
            **ROUTE,
            "is_active": {
                "type": "boolean",
                "description": "False when the route or its provider is switched off.",
            },
            "tasks": {"type": "array", "items": STRING},
        }
    ),
    "Interval": _object(
        INTERVAL, "A figure with its 95% interval; null where the samples cannot give it."
    ),
    "PassRate": _object(
        {**INTERVAL, "passed": {"type": "integer"}, "graded": {"type": "integer"}},
        "Graded probes that passed, all regions, with the 95% Wilson interval.",
    ),
    "Figures": _object(
        {
            "metric_ms": _ref("Interval"),
            "samples": {
                "type": "integer",
                "description": "Successful reference probes behind the metric.",
            },
            "pass_rate": _nullable(_ref("PassRate")),
            "errors": {
                "type": "integer",
                "description": "The provider's failures in this region (ours never count).",
            },
            "attempts": {"type": "integer"},
            "error_rate": NUMBER_OR_NULL,
        },
        "A route's figures over the overview's window (24 h).",
    ),
    "Ranked": _object({"route": _ref("Route"), "figures": _ref("Figures")}),
    "Metric": _object(
        {
            "name": {"type": "string", "enum": [m for m, _ in LATENCY_METRICS if m]},
            "label": STRING,
        },
        "What 'fastest' means for the task.",
    ),
    "Answer": _object(
        {
            "task": STRING,
            "region": STRING,
            "metric": _ref("Metric"),
            "route": {
                **_nullable(_ref("Route")),
                "description": "The fastest qualifying route; null when none qualifies "
                "(`reason` and `why` say why).",
            },
            "figures": _nullable(_ref("Figures")),
            "reason": {
                "type": "string",
                "description": "Empty when a route qualifies; else why none does.",
            },
            "why": {
                "type": "string",
                "description": "Why this route is the winner (the change that made it), or "
                "which route came closest and what it lacks.",
            },
            "winner_since": TIME_OR_NULL,
            "runner_up": {
                **_nullable(_ref("Ranked")),
                "description": "The next qualifying route: the one to fall back to.",
            },
            "tied": {
                "type": "array",
                "description": "Qualifying routes within noise of the winner (overlapping "
                "95% intervals); the incumbent keeps winning until one is faster with "
                "confidence.",
                "items": _object({"id": {"type": ["integer", "null"]}, "label": STRING}),
            },
            "freshness": _object(
                {
                    "last_probe_at": TIME_OR_NULL,
                    "stale": {
                        "type": "boolean",
                        "description": "No probe within stale_after_s of the request.",
                    },
                    "stale_after_s": {"type": "number"},
                    "built_at": {
                        "type": "string",
                        "format": "date-time",
                        "description": "When the overview snapshot behind the answer was built.",
                    },
                    "window_hours": {"type": "integer"},
                }
            ),
        },
        "The overview's answer for one task in one region.",
    ),
    "Task": _object(
        {
            "slug": STRING,
            "name": STRING,
            "latency_class": {"type": "string", "enum": [c for c, _ in LATENCY_CLASSES]},
            "metric": _ref("Metric"),
            "regions": {"type": "array", "items": _object({"slug": STRING, "name": STRING})},
            "route_url": {"type": "string", "description": "Where to ask for its route."},
        }
    ),
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {
    "401": {
        **_json(_ref("Error"), "No token, or a wrong or revoked one."),
        "headers": {"WWW-Authenticate": {"schema": STRING}},
    },
    "405": _json(_ref("Error"), "Any method but GET and HEAD: the API is read-only."),
}
CACHED = {
    "ETag": {"schema": STRING, "description": "A hash of the body."},
    "Cache-Control": {
        "schema": STRING,
        "description": "private, max-age=<the overview's refresh interval in seconds>",
    },
}
NOT_MODIFIED = {"description": "If-None-Match named the current ETag: no body.", "headers": CACHED}
IF_NONE_MATCH = {
    "name": "If-None-Match",
    "in": "header",
    "required": False,
    "schema": STRING,
    "description": "The ETag of the answer you have: 304 while it is still current.",
}


def _get(
    operation_id: str,
    summary: str,
    ok: dict[str, Any],
    parameters: Sequence[dict[str, Any]] = (),
    errors: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "get": {
            "operationId": operation_id,
            "summary": summary,
            "parameters": [IF_NONE_MATCH, *parameters],
            "responses": {
                "200": {**ok, "headers": CACHED},
                "304": NOT_MODIFIED,
                **ERRORS,
                **(errors or {}),
            },
        }
    }


def description(server_url: str = "/api/v1") -> dict[str, Any]:
    route_parameters = [
        {
            "name": "slug",
            "in": "path",
            "required": True,
            "schema": STRING,
            "description": "The task's slug.",
        },
        {
            "name": "region",
            "in": "query",
            "required": False,
            "schema": STRING,
            "description": "The region's slug; may be left out when the task runs in "
            "exactly one region.",
        },
    ]
    route_errors = {
        "400": _json(_ref("Error"), "The task runs in several regions and none was named."),
        "404": _json(_ref("Error"), "No active task by that slug, or it has no such region."),
        "503": _json(_ref("Error"), "A route was deleted during the read: retry."),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Routewatch read API",
            "version": VERSION,
            "description": "The fastest qualifying route per task and region, as the overview "
            "shows it, for applications and gateways. Read-only; every endpoint needs an API "
            "token created in the admin (API tokens).",
        },
        "servers": [{"url": server_url}],
        "security": [{"bearerToken": []}],
        "components": {
            "securitySchemes": {
                "bearerToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API token (rw_...) created in the admin, shown once.",
                }
            },
            "schemas": SCHEMAS,
        },
        "paths": {
            "/tasks/": _get(
                "listTasks",
                "Active tasks, their ranking metric and regions",
                _json(_object({"tasks": {"type": "array", "items": _ref("Task")}}), "The tasks."),
            ),
            "/tasks/{slug}/route": _get(
                "getTaskRoute",
                "The fastest qualifying route of a task in a region",
                _json(
                    _ref("Answer"),
                    "The answer; `route` is null (with a reason) when no route qualifies.",
                ),
                route_parameters,
                route_errors,
            ),
            "/routes/": _get(
                "listRoutes",
                "Every route, without secrets",
                _json(
                    _object({"routes": {"type": "array", "items": _ref("RouteListItem")}}),
                    "The routes.",
                ),
            ),
            "/openapi.json": _get(
                "getOpenApi",
                "This description",
                _json({"type": "object"}, "The OpenAPI 3.1 description."),
            ),
        },
    }
