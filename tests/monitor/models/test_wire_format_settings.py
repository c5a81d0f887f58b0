"""The newer wire formats in the monitor: one registry for admin choices and engine, presets
for OpenAI Responses, Google AI Studio and Amazon Bedrock (its SigV4 credentials write-only
and encrypted like API keys), and route settings each format can send."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from monitor import presets
from monitor.crypto import decrypt_bound
from monitor.models import WIRE_FORMATS, Provider, Route, aws_credentials
from probes.formats import WIRE_FORMATS as ENGINE_FORMATS

SECRET = "aws-secret-canary-4f1b9e2d7c"
KEY_ID = "AKIDCANARY0123456789"


@pytest.fixture(autouse=True)
def _private_networks_allowed(settings) -> None:
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = True


def test_the_admins_wire_formats_are_the_engines() -> None:
    assert sorted(key for key, _ in WIRE_FORMATS) == sorted(ENGINE_FORMATS)


def _form(preset: str, **overrides: str) -> dict[str, str]:
    data = {
        "name": f"My {preset}",
        "slug": f"my-{preset}",
        "preset": preset,
        "base_url": "",
        "wire_format": "openai",
        "api_key": "",
        "aws_region": "",
        "aws_access_key_id": "",
        "aws_secret_access_key": "",
        "extra_headers": "{}",
        "is_active": "on",
    }
    data.update(overrides)
    return data


def test_a_bedrock_provider_from_its_preset_keeps_its_aws_credentials_encrypted(
    admin_client: Client,
) -> None:
    form = _form("bedrock", aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
    response = admin_client.post(reverse("admin:monitor_provider_add"), form)
    assert response.status_code == 302, response.content.decode()[:3000]
    provider = Provider.objects.get(slug="my-bedrock")
    assert provider.wire_format == "bedrock"
    assert provider.base_url == presets.PROVIDER_PRESETS["bedrock"]["base_url"]
    assert SECRET not in provider.api_key_encrypted
    assert KEY_ID not in provider.api_key_encrypted
    stored = decrypt_bound(provider.api_key_encrypted, provider.base_url)
    assert aws_credentials(stored) == (KEY_ID, SECRET)
    page = admin_client.get(reverse("admin:monitor_provider_change", args=[provider.pk]))
    assert SECRET not in page.content.decode()
    assert KEY_ID not in page.content.decode()


def test_aws_credentials_only_for_bedrock_and_both_halves(admin_client: Client) -> None:
    half = _form("bedrock", aws_access_key_id=KEY_ID)
    response = admin_client.post(reverse("admin:monitor_provider_add"), half)
    assert response.status_code == 200
    assert "Give both the access key id and the secret." in response.content.decode()
    wrong = _form("openai", aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
    response = admin_client.post(reverse("admin:monitor_provider_add"), wrong)
    assert response.status_code == 200
    assert "Only Amazon Bedrock providers sign with SigV4." in response.content.decode()
    assert SECRET not in response.content.decode()


@pytest.mark.parametrize("preset", ["openai-responses", "gemini-native", "bedrock"])
def test_each_new_preset_makes_a_provider_with_an_api_key(
    admin_client: Client, preset: str
) -> None:
    response = admin_client.post(
        reverse("admin:monitor_provider_add"), _form(preset, api_key="key-canary-77aa")
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    provider = Provider.objects.get(slug=f"my-{preset}")
    assert provider.wire_format == presets.PROVIDER_PRESETS[preset]["wire_format"]
    assert provider.get_api_key() == "key-canary-77aa"
    assert aws_credentials(provider.get_api_key()) is None  # a Bedrock API key: a bearer token


def _route(wire: str, **settings: object) -> Route:
    provider = Provider.objects.create(
        name=f"P {wire}", slug=f"p-{wire}", base_url="http://127.0.0.1:9/x", wire_format=wire
    )
    return Route(provider=provider, model_id="m", **settings)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("wire", "values", "field"),
    [
        ("responses", {"token_limit_param": "max_completion_tokens"}, "token_limit_param"),
        ("responses", {"thinking_budget_tokens": 2048}, "thinking_budget_tokens"),
        (
            "gemini",
            {"reasoning_effort": "low", "thinking_budget_tokens": 2048},
            "thinking_budget_tokens",
        ),
        ("gemini", {"service_tier": "priority"}, "service_tier"),
        ("bedrock", {"reasoning_effort": "low"}, "reasoning_effort"),
        ("bedrock", {"service_tier": "auto"}, "service_tier"),
    ],
)
def test_route_settings_a_format_cannot_send_are_refused(
    wire: str, values: dict[str, object], field: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        _route(wire, **values).clean()
    assert field in refused.value.message_dict


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("wire", "values"),
    [
        ("responses", {"reasoning_effort": "low", "service_tier": "flex"}),
        ("gemini", {"thinking_budget_tokens": 2048}),
        ("gemini", {"reasoning_effort": "high"}),
        ("bedrock", {"thinking_budget_tokens": 1024, "service_tier": "priority"}),
        ("bedrock", {"extra_body": {"performanceConfig": {"latency": "optimized"}}}),
    ],
)
def test_route_settings_a_format_takes_are_accepted(wire: str, values: dict[str, object]) -> None:
    _route(wire, **values).clean()


@pytest.mark.django_db
def test_a_reasoning_route_of_responses_leaves_room_for_its_reasoning() -> None:
    route = _route("responses", reasoning_effort="low")
    assert route.token_limit(200) > 200 + 1000
    assert _route("gemini").token_limit(200) == 200
