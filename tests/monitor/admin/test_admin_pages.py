"""Admin pages work for staff and refuse anonymous users and non-staff users."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from monitor.models import EvalCase, Provider, Region, Route, Task

MODELS = ["provider", "route", "region", "task", "evalcase", "proberesult", "heartbeat"]


@pytest.fixture
def demo_rows(db: None) -> Task:
    provider = Provider.objects.create(
        name="Acme", slug="acme", base_url="https://api.acme.example/v1", wire_format="openai"
    )
    route = Route.objects.create(provider=provider, model_id="acme-1")
    region = Region.objects.create(name="EU West", slug="eu-west")
    task = Task.objects.create(name="Summarise", slug="summarise", user_template="Sum up: {input}")
    task.routes.add(route)
    task.regions.add(region)
    EvalCase.objects.create(task=task, name="one", input="2+2", grader="exact", expected="4")
    return task


@pytest.mark.parametrize("model", MODELS)
def test_staff_can_list_search_and_filter(
    admin_client: Client, demo_rows: Task, model: str
) -> None:
    url = reverse(f"admin:monitor_{model}_changelist")
    assert admin_client.get(url).status_code == 200
    assert admin_client.get(url, {"q": "acme"}).status_code == 200


def test_staff_can_open_add_and_change_forms(admin_client: Client, demo_rows: Task) -> None:
    for model in ["provider", "route", "region", "task", "evalcase"]:
        assert admin_client.get(reverse(f"admin:monitor_{model}_add")).status_code == 200
    change = reverse("admin:monitor_task_change", args=[demo_rows.pk])
    response = admin_client.get(change)
    assert response.status_code == 200
    assert b"Quality" in response.content or b"quality" in response.content


def test_the_provider_list_filters_by_wire_format(admin_client: Client, demo_rows: Task) -> None:
    url = reverse("admin:monitor_provider_changelist")
    assert b"Acme" in admin_client.get(url, {"wire_format__exact": "openai"}).content
    assert b"Acme" not in admin_client.get(url, {"wire_format__exact": "anthropic"}).content


@pytest.mark.parametrize("model", MODELS)
def test_anonymous_users_are_sent_to_login(client: Client, db: None, model: str) -> None:
    response = client.get(reverse(f"admin:monitor_{model}_changelist"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_non_staff_users_are_refused(client: Client, teammate: User) -> None:
    client.force_login(teammate)
    response = client.get(reverse("admin:monitor_provider_changelist"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_a_region_names_its_queue(db: None) -> None:
    region = Region.objects.create(name="AP South", slug="ap-south")
    assert region.queue_name == "probes.ap-south"


def test_a_private_provider_url_is_refused_unless_allowed(admin_client: Client, settings) -> None:
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = False
    response = admin_client.post(
        reverse("admin:monitor_provider_add"),
        {
            "name": "Local",
            "slug": "local",
            "base_url": "https://127.0.0.1:8443/v1",
            "wire_format": "openai",
            "extra_headers": "{}",
            "is_active": "on",
        },
    )
    assert response.status_code == 200
    assert b"non-public address" in response.content
    assert not Provider.objects.filter(slug="local").exists()


def test_a_new_tasks_probe_options_start_at_the_models_defaults(admin_client: Client) -> None:
    """The add form ticks one HTTP version, JSON, warm and stable, as the model defaults them:
    a new user saving a task does not meet four empty required groups."""
    body = admin_client.get(reverse("admin:monitor_task_add")).content.decode()
    for name, value in [
        ("http_versions", "1.1"),
        ("body_encodings", "json"),
        ("connection_modes", "warm"),
        ("prefix_modes", "stable"),
    ]:
        ticked = [
            tag for tag in body.split("<input") if f'name="{name}"' in tag and " checked" in tag
        ]
        assert [f'value="{value}"' in tag for tag in ticked] == [True], (name, ticked)
