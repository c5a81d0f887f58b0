"""No data is never shown as good news, each page opens on something that has data, and
nothing that needs a login is offered before one."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from monitor.models import GeneratedSpan, Task
from tests.monitor.conftest import World


def test_the_regions_page_opens_on_a_task_that_has_figures(
    client: Client, probed_world: World, teammate: User
) -> None:
    # First by name, and never probed: every cell would read "too few".
    empty = Task.objects.create(name="Aardvark", slug="aardvark", user_template="{input}")
    empty.routes.set(probed_world.routes.values())
    empty.regions.set(probed_world.regions)
    client.force_login(teammate)
    body = client.get("/regions/").content.decode()
    assert "· Arithmetic" in body, body[:3000]
    assert 'data-region="eu-west">' in body
    # Named in the address, the empty task is shown as asked, and says it has no figures.
    body = client.get("/regions/?task=aardvark").content.decode()
    assert "· Aardvark" in body
    assert "No measurements for Aardvark in this window yet." in body


def test_the_login_page_offers_no_switch_for_the_generated_history(
    client: Client, db: None, teammate: User
) -> None:
    now = timezone.now()
    GeneratedSpan.objects.create(start=now - timedelta(days=2), last=now - timedelta(hours=1))
    body = client.get("/accounts/login/").content.decode()
    assert "includes generated demo history" in body
    assert "Hide generated history" not in body
    assert "/demo-history/" not in body
    # Logged in, the reader may hide it.
    client.force_login(teammate)
    body = client.get("/").content.decode()
    assert "Hide generated history" in body
