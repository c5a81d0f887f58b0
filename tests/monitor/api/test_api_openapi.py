"""The OpenAPI description is valid OpenAPI 3.1, names every URL under /api/v1/, and the
API's real answers match its schemas."""

from __future__ import annotations

import re

import jsonschema
import pytest
from django.test import Client
from django.urls import URLResolver, get_resolver, resolve, reverse
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from monitor.models import Task
from tests.monitor.api.support import get, make_token
from tests.monitor.conftest import World


def _api_patterns() -> list[str]:
    """Every URL pattern included under api/v1/, as an OpenAPI path (`<slug:slug>` -> `{slug}`),
    but the docs page: the description's viewer, a page for people, not a call of the API."""
    for entry in get_resolver().url_patterns:
        if isinstance(entry, URLResolver) and str(entry.pattern) == "api/v1/":
            return [
                "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(p.pattern))
                for p in entry.url_patterns
                if getattr(p, "name", None) != "rw-api-docs"
            ]
    raise AssertionError("no api/v1/ in the URLconf")


@pytest.fixture
def description(client: Client, db: None) -> dict:
    response = get(client, reverse("rw-api-openapi"), make_token())
    assert response.status_code == 200
    return response.json()


def test_the_description_is_valid_openapi_3_1(description: dict) -> None:
    validate(description, cls=OpenAPIV31SpecValidator)
    assert description["openapi"] == "3.1.0"
    assert description["components"]["securitySchemes"]["bearerToken"]["scheme"] == "bearer"
    assert description["security"] == [{"bearerToken": []}]


def test_the_validator_refuses_a_broken_description(description: dict) -> None:
    """The check above can fail."""
    description["paths"]["/tasks/{slug}/route"]["get"]["parameters"][1]["in"] = "body"
    with pytest.raises(OpenAPIValidationError, match="body"):
        validate(description, cls=OpenAPIV31SpecValidator)


def test_the_description_names_every_url_under_api_v1(description: dict) -> None:
    patterns = _api_patterns()
    assert len(patterns) >= 4
    assert sorted(description["paths"]) == sorted(patterns)
    server = description["servers"][0]["url"]
    for path in description["paths"]:
        url = server + path.replace("{slug}", "some-task")
        assert str(resolve(url).url_name).startswith("rw-api-"), url


def _validator(description: dict, name: str) -> jsonschema.Draft202012Validator:
    schema = {"$ref": f"#/components/schemas/{name}", "components": description["components"]}
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def test_real_answers_match_the_schemas(
    client: Client, probed_world: World, description: dict
) -> None:
    solo = Task.objects.create(name="Solo", slug="solo", user_template="{input}")
    solo.regions.set([probed_world.regions[0]])
    token = make_token()
    answers = [
        get(client, reverse("rw-api-task-route", args=["arithmetic"]) + f"?region={g.slug}", token)
        for g in probed_world.regions
    ]
    answers.append(get(client, reverse("rw-api-task-route", args=["solo"]), token))
    bodies = [a.json() for a in answers]
    assert [b["route"] is None for b in bodies] == [False, False, True]
    for body in bodies:
        _validator(description, "Answer").validate(body)
    for item in get(client, reverse("rw-api-tasks"), token).json()["tasks"]:
        _validator(description, "Task").validate(item)
    for item in get(client, reverse("rw-api-routes"), token).json()["routes"]:
        _validator(description, "RouteListItem").validate(item)
    error = get(client, reverse("rw-api-task-route", args=["arithmetic"]), token)
    _validator(description, "Error").validate(error.json())
    # The schemas are strict enough to refuse a wrong shape.
    for broken in (dict(bodies[0], figures={"metric_ms": 12}), dict(bodies[0], extra=1)):
        with pytest.raises(jsonschema.ValidationError):
            _validator(description, "Answer").validate(broken)
