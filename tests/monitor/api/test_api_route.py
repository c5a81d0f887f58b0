"""The route answer is the overview's answer, for every task and region of a world probed for
real against the simulator; it carries no secret; it can be polled cheaply."""

from __future__ import annotations

import urllib.error
from datetime import timedelta

import httpx2
import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from monitor.answer import board
from monitor.api.answers import public_base_url
from monitor.models import Provider, Region, Route, Task
from tests.monitor.api.support import get, make_token
from tests.monitor.conftest import World
from tests.support import ROOT


def _route_url(task: str, region: str | None = None) -> str:
    url = reverse("rw-api-task-route", args=[task])
    return f"{url}?region={region}" if region else url


@pytest.fixture
def world(probed_world: World) -> World:
    """The probed world, and a second task in one region that has no probes (no winner)."""
    solo = Task.objects.create(
        name="Solo",
        slug="solo",
        user_template="{input}",
        probe_interval_s=60,
        latency_metric="ttft_p95",
    )
    solo.routes.set([probed_world.routes["fast-small"]])
    solo.regions.set([probed_world.regions[0]])
    return probed_world


def _interval(value, low, high) -> dict:
    return {"value": value, "low": low, "high": high}


def test_the_answer_equals_the_overview_for_every_task_and_region(
    client: Client, world: World, teammate: User
) -> None:
    token = make_token()
    now = timezone.now()
    answered = ranked = 0
    with time_machine.travel(now, tick=False):
        client.force_login(teammate)
        page = client.get(reverse("rw-overview"))
        client.logout()
        rows = page.context["rows"]
        assert [r.task.slug for r in rows] == ["arithmetic", "solo"]
        for row in rows:
            for cell in row.cells:
                response = get(client, _route_url(row.task.slug, cell.region_slug), token)
                assert response.status_code == 200
                body = response.json()
                assert body["task"] == row.task.slug
                assert body["region"] == cell.region_slug
                assert body["metric"] == {
                    "name": Task.objects.get(slug=row.task.slug).ranking_metric(),
                    "label": row.task.latency_metric,
                }
                assert body["reason"] == cell.reason
                assert body["why"] == cell.why
                since = cell.winner_since.isoformat() if cell.winner_since else None
                assert body["winner_since"] == since
                assert body["tied"] == [
                    {"id": i, "label": label}
                    for i, label in zip(cell.tied_ids, cell.tied, strict=True)
                ]
                assert body["freshness"] == {
                    "last_probe_at": cell.last_probe_at.isoformat() if cell.last_probe_at else None,
                    "stale": cell.stale,
                    "stale_after_s": cell.stale_after_s,
                    "built_at": page.context["built_at"].isoformat(),
                    "window_hours": 24,
                }
                if cell.winner is None:
                    assert body["route"] is None
                    assert body["figures"] is None
                    assert body["runner_up"] is None
                    assert body["reason"]
                    continue
                answered += 1
                # The winner and the runner-up share one shape (board.Ranked), and so do
                # their figures in the answer.
                named = [("route", "figures", cell.winner)]
                if cell.runner_up is None:
                    assert body["runner_up"] is None
                else:
                    ranked += 1
                    named.append(("route", "figures", cell.runner_up))
                for (route_key, figures_key, r), shown in zip(
                    named, [body, body["runner_up"]], strict=False
                ):
                    assert shown[route_key]["id"] == r.route_id
                    assert shown[route_key]["label"] == r.label
                    figures = shown[figures_key]
                    assert figures["metric_ms"] == _interval(
                        r.metric_ms, r.metric_low_ms, r.metric_high_ms
                    )
                    assert figures["samples"] == r.samples >= 1
                    assert figures["pass_rate"]["value"] == pytest.approx(r.pass_rate)
                    assert figures["pass_rate"]["low"] == r.pass_low
                    assert figures["pass_rate"]["high"] == r.pass_high
                    assert (
                        figures["pass_rate"]["passed"],
                        figures["pass_rate"]["graded"],
                    ) == (r.passed, r.graded)
                    assert (figures["errors"], figures["attempts"]) == (r.errors, r.attempts)
                    assert figures["error_rate"] == r.error_rate
    # The comparison was not empty: both regions of the probed task have a winner, and a
    # runner-up somewhere (fast-small and claudish-mid both clear the bar).
    assert answered == 2
    assert ranked >= 1


def test_the_route_names_how_to_call_it(client: Client, world: World) -> None:
    token = make_token()
    body = get(client, _route_url("arithmetic", "eu-west"), token).json()
    route = Route.objects.select_related("provider").get(pk=body["route"]["id"])
    assert body["route"] == {
        "id": route.pk,
        "label": str(route),
        "provider": {"slug": route.provider.slug, "name": route.provider.name},
        "base_url": route.provider.base_url,
        "wire_format": route.provider.wire_format,
        "model_id": route.model_id,
        "settings": {
            "token_limit_param": "max_tokens",
            "reasoning_effort": "",
            "thinking_budget_tokens": None,
            "service_tier": "",
            "temperature": None,
            "extra_body": {},
            "api_version": "",
        },
    }


def test_it_never_returns_a_key_or_a_secret_header(client: Client, world: World) -> None:
    token = make_token()
    fast = world.routes["fast-small"]
    fast.set_secret_headers({"X-Gateway-Key": "gw-secret-value-0123456789"})
    fast.extra_body = {"top_p": 0.9}
    fast.save()
    secrets = ["gw-secret-value-0123456789", "X-Gateway-Key", "pa55word", "query-secret-0123"]
    for provider in Provider.objects.all():
        secrets += [provider.get_api_key(), provider.api_key_encrypted]
    # A base URL with credentials and a key in its query (the admin refuses these; the API
    # must not depend on it). Set behind the admin's back: the stored key stays (bound to the
    # old origin, which only matters to a worker).
    Provider.objects.filter(slug="fastchip").update(
        base_url="http://user:pa55word@127.0.0.1:9/fastchip/v1?key=query-secret-0123#frag"
    )
    secrets.append(Route.objects.get(pk=fast.pk).secret_headers_encrypted)
    assert all(secrets)
    urls = [
        reverse("rw-api-tasks"),
        reverse("rw-api-routes"),
        reverse("rw-api-openapi"),
        _route_url("solo"),
        *(_route_url("arithmetic", g.slug) for g in world.regions),
    ]
    seen_fast = False
    for url in urls:
        response = get(client, url, token)
        assert response.status_code == 200, url
        text = response.content.decode() + "".join(f"{k}: {v}" for k, v in response.items())
        for secret in secrets:
            assert secret not in text, (url, secret[:8])
        seen_fast = seen_fast or "http://127.0.0.1:9/fastchip/v1" in text
    # The route list does show the route, its extra body and its cleaned base URL.
    routes = {r["id"]: r for r in get(client, urls[1], token).json()["routes"]}
    assert routes[fast.pk]["base_url"] == "http://127.0.0.1:9/fastchip/v1"
    assert routes[fast.pk]["settings"]["extra_body"] == {"top_p": 0.9}
    assert seen_fast


def test_public_base_url_drops_credentials_query_and_fragment() -> None:
    assert public_base_url("https://u:p@api.example.com/v1?key=k#f") == "https://api.example.com/v1"
    assert public_base_url("https://api.example.com:8443/v1") == "https://api.example.com:8443/v1"
    assert public_base_url("http://u@[::1]:9/x") == "http://[::1]:9/x"


def test_a_region_is_required_when_the_task_has_several(client: Client, world: World) -> None:
    token = make_token()
    response = get(client, _route_url("arithmetic"), token)
    assert response.status_code == 400
    assert response.json()["error"] == "region_required"
    assert response.json()["regions"] == ["eu-west", "us-east"]
    # One region: it is the default.
    solo = get(client, _route_url("solo"), token)
    assert solo.status_code == 200
    assert solo.json()["region"] == "eu-west"
    assert solo.json() == get(client, _route_url("solo", "eu-west"), token).json()


def test_unknown_tasks_and_regions_are_404_with_what_is_valid(client: Client, world: World) -> None:
    token = make_token()
    Region.objects.create(name="Elsewhere", slug="elsewhere")  # exists, not the task's
    for url, code in [
        (_route_url("nope", "eu-west"), "unknown_task"),
        (_route_url("arithmetic", "elsewhere"), "unknown_region"),
        (_route_url("solo", "us-east"), "unknown_region"),
    ]:
        response = get(client, url, token)
        assert response.status_code == 404, url
        assert response["Content-Type"] == "application/json"
        assert response.json()["error"] == code
    assert get(client, _route_url("nope"), token).json()["tasks"] == ["arithmetic", "solo"]
    assert get(client, _route_url("solo", "us-east"), token).json()["regions"] == ["eu-west"]
    Task.objects.filter(slug="solo").update(is_active=False)
    board.forget()
    assert get(client, _route_url("solo"), token).status_code == 404


def test_no_qualifying_route_is_200_with_a_reason(client: Client, world: World) -> None:
    body = get(client, _route_url("solo"), make_token()).json()
    assert body["route"] is None
    # Why, for the task as a whole: every route judged, and what it lacked.
    assert body["reason"] == (
        "no route meets the bar (1 route judged: FastChip / fast-small: no probe in the window)"
    )
    assert body["why"] == ""
    assert body["freshness"]["stale"] is True


def test_a_poller_revalidates_with_the_etag(client: Client, world: World) -> None:
    token = make_token()
    url = _route_url("arithmetic", "eu-west")
    now = timezone.now()
    with time_machine.travel(now, tick=False):
        first = get(client, url, token)
        etag = first["ETag"]
        assert first["Cache-Control"] == "private, max-age=15"
        assert "Authorization" in first["Vary"]
        again = get(client, url, token, **{"If-None-Match": etag})
        assert again.status_code == 304
        assert again.content == b""
        assert again["ETag"] == etag
        assert again["Cache-Control"] == "private, max-age=15"
        assert "Authorization" in again["Vary"]
        assert get(client, url, token, **{"If-None-Match": f'W/{etag}, "x"'}).status_code == 304
        assert get(client, url, token, **{"If-None-Match": '"other"'}).status_code == 200
        head = client.head(url, headers={"Authorization": f"Bearer {token}"})
        assert head.status_code == 200
        assert head["ETag"] == etag
        # A 304 needs the token like any answer.
        assert get(client, url, None, **{"If-None-Match": etag}).status_code == 401
    # The next snapshot (built_at and freshness move): a new ETag, the old one gets the body.
    later = now + board.max_age() + timedelta(seconds=1)  # no beat ticking: rebuilt
    with time_machine.travel(later, tick=False):
        fresh = get(client, url, token, **{"If-None-Match": etag})
        assert fresh.status_code == 200
        assert fresh["ETag"] != etag
        assert fresh.json()["freshness"]["built_at"] == later.isoformat()


def test_an_application_reads_the_answer_over_a_real_socket(live_server, world: World) -> None:
    token = make_token()
    url = f"{live_server.url}{_route_url('arithmetic', 'us-east')}"
    with httpx2.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
        response = http.get(url)
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        assert response.json()["route"]["id"] in {r.pk for r in world.routes.values()}
        again = http.get(url, headers={"If-None-Match": response.headers["etag"]})
        assert again.status_code in (200, 304)  # a new snapshot may land between the two
        if again.status_code == 200:
            again = http.get(url, headers={"If-None-Match": again.headers["etag"]})
        assert again.status_code == 304
        assert http.get(url, headers={"Authorization": "Bearer rw_wrong"}).status_code == 401


def test_the_readme_example_works_against_a_real_server(
    live_server, world: World, monkeypatch
) -> None:
    readme = (ROOT / "docs" / "pages-api-metrics.md").read_text()
    section = readme[readme.index("# Use the answer from an application") :]
    code = section[section.index("```python\n") + len("```python\n") :].split("```")[0]
    assert len(code.strip().splitlines()) <= 14
    monkeypatch.setenv("ROUTEWATCH_URL", live_server.url)
    monkeypatch.setenv("ROUTEWATCH_TOKEN", make_token())
    namespace: dict = {}
    exec(compile(code, "pages-api-metrics.md", "exec"), namespace)  # noqa: S102 (our docs)
    answer, etag = namespace["fastest_route"]("arithmetic", "eu-west")
    assert answer["route"]["model_id"] in {r.model_id for r in world.routes.values()}
    assert etag.startswith('"')
    unchanged, same = namespace["fastest_route"]("arithmetic", "eu-west", etag)
    assert (unchanged, same) == (None, etag)
    monkeypatch.setenv("ROUTEWATCH_TOKEN", "rw_wrong")
    with pytest.raises(urllib.error.HTTPError, match="401"):
        namespace["fastest_route"]("arithmetic", "eu-west")


def test_an_edited_route_shows_in_the_next_answer(client: Client, world: World) -> None:
    token = make_token()
    url = _route_url("arithmetic", "eu-west")
    first = get(client, url, token).json()
    route = Route.objects.get(pk=first["route"]["id"])
    assert first["route"]["settings"]["temperature"] is None
    route.temperature = 0.3
    route.save()
    second = get(client, url, token).json()
    assert second["route"]["id"] == route.pk
    assert second["route"]["settings"]["temperature"] == 0.3
    provider = Provider.objects.get(pk=route.provider_id)
    provider.name = "Renamed"
    provider.save()
    assert get(client, url, token).json()["route"]["provider"]["name"] == "Renamed"
