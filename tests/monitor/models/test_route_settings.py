"""Per-route request settings and provider capabilities in the admin: presets, validation,
and secret headers that are write-only like API keys."""

from __future__ import annotations

import json
import logging

import pytest
from django.test import Client
from django.urls import reverse

from monitor.crypto import decrypt_bound
from monitor.models import Provider, Route

CANARY = "gw-canary-91c3e5a7f2d4b6"


@pytest.fixture
def openai_provider(db: None) -> Provider:
    return Provider.objects.create(
        name="Reasoning Co", slug="reasoning-co", base_url="http://127.0.0.1:9/v1"
    )


@pytest.fixture
def anthropic_provider(db: None) -> Provider:
    return Provider.objects.create(
        name="Claude Co",
        slug="claude-co",
        base_url="http://127.0.0.1:9",
        wire_format="anthropic",
    )


def _route_form(provider: Provider, **overrides: str) -> dict[str, str]:
    data = {
        "provider": str(provider.pk),
        "model_id": "gpt-5.5",
        "display_name": "",
        "price_input_per_mtok": "1.25",
        "price_output_per_mtok": "10",
        "quality_index": "",
        "preset": "",
        "token_limit_param": "max_tokens",
        "reasoning_effort": "",
        "thinking_budget_tokens": "",
        "service_tier": "",
        "temperature": "",
        "extra_body": "{}",
        "api_version": "",
        "secret_headers": "",
        "is_active": "on",
    }
    data.update(overrides)
    return data


def test_the_reasoning_preset_sets_what_openai_reasoning_models_need(
    admin_client: Client, openai_provider: Provider
) -> None:
    response = admin_client.post(
        reverse("admin:monitor_route_add"),
        _route_form(openai_provider, preset="openai-reasoning-priority", temperature="0.2"),
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    route = Route.objects.get(model_id="gpt-5.5")
    assert route.token_limit_param == "max_completion_tokens"
    assert route.reasoning_effort == "low"
    assert route.service_tier == "priority"
    # Reasoning models refuse a non-default temperature: the preset leaves it unsent.
    assert route.temperature is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("thinking_budget_tokens", "2048", "Only Anthropic, Gemini and Bedrock providers take"),
        ("extra_body", '{"model": "other"}', "model: set by the probe"),
        ("extra_body", "[1, 2]", "Use a JSON object"),
        ("temperature", "3", "less than or equal to 2"),
    ],
)
def test_settings_a_provider_would_refuse_are_refused_in_the_form(
    admin_client: Client, openai_provider: Provider, field: str, value: str, message: str
) -> None:
    response = admin_client.post(
        reverse("admin:monitor_route_add"), _route_form(openai_provider, **{field: value})
    )
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Route.objects.exists()


def test_anthropic_routes_take_a_thinking_budget_but_not_openai_parameters(
    admin_client: Client, anthropic_provider: Provider
) -> None:
    url = reverse("admin:monitor_route_add")
    refused = admin_client.post(
        url, _route_form(anthropic_provider, token_limit_param="max_completion_tokens")
    )
    assert "Only OpenAI Chat Completions providers take this parameter" in refused.content.decode()
    too_small = admin_client.post(
        url, _route_form(anthropic_provider, thinking_budget_tokens="512")
    )
    assert "greater than or equal to 1024" in too_small.content.decode()
    ok = admin_client.post(url, _route_form(anthropic_provider, preset="anthropic-thinking"))
    assert ok.status_code == 302
    assert Route.objects.get(provider=anthropic_provider).thinking_budget_tokens == 1024


def test_secret_headers_are_write_only_encrypted_and_never_logged(
    admin_client: Client, openai_provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    headers = json.dumps({"x-gateway-key": CANARY})
    add = admin_client.post(
        reverse("admin:monitor_route_add"),
        _route_form(openai_provider, secret_headers=headers),
        follow=True,
    )
    assert add.status_code == 200
    route = Route.objects.get(model_id="gpt-5.5")
    assert CANARY not in route.secret_headers_encrypted
    stored = decrypt_bound(route.secret_headers_encrypted, route.provider.base_url)
    assert json.loads(stored) == {"x-gateway-key": CANARY}
    change = reverse("admin:monitor_route_change", args=[route.pk])
    pages = [
        add,
        admin_client.get(change),
        admin_client.get(reverse("admin:monitor_route_changelist")),
        # A form error re-renders with the posted data: the headers must not come back.
        admin_client.post(change, _route_form(openai_provider, secret_headers=headers[:-1])),
        admin_client.post(
            change, _route_form(openai_provider, secret_headers=headers, extra_body="[")
        ),
    ]
    for page in pages:
        assert CANARY.encode() not in page.content
    assert "Not valid JSON (the value is not shown)" in pages[3].content.decode()
    assert CANARY not in caplog.text
    # Blank keeps the stored headers; the checkbox removes them.
    admin_client.post(change, _route_form(openai_provider))
    route.refresh_from_db()
    assert route.has_secret_headers
    admin_client.post(change, _route_form(openai_provider, clear_secret_headers="on"))
    route.refresh_from_db()
    assert not route.has_secret_headers


def test_a_provider_preset_fills_in_format_capabilities_and_url(admin_client: Client) -> None:
    response = admin_client.post(
        reverse("admin:monitor_provider_add"),
        {
            "name": "Azure East",
            "slug": "azure-east",
            "preset": "anthropic",
            "base_url": "",
            "wire_format": "openai",
            "extra_headers": "{}",
            "is_active": "on",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    provider = Provider.objects.get(slug="azure-east")
    assert (provider.wire_format, provider.base_url, provider.http2) == (
        "anthropic",
        "https://api.anthropic.com",
        True,
    )
    assert not provider.accepts_msgpack
