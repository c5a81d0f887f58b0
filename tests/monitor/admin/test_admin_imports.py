"""Adding a provider is choosing a preset and pasting a key; imports from admin uploads."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from monitor import presets
from monitor.models import EvalCase, Provider, Route
from tests.monitor import factories as f

FIXTURES = Path(__file__).parent.parent / "imports" / "fixtures"
KEY = "sk-preset-canary-5d1e9b7c3a"


@pytest.fixture(autouse=True)
def _private_networks_allowed(settings) -> None:
    # Local servers' presets are loopback http:// URLs; hosted names need no DNS in tests.
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = True


def _provider_form(preset: str, **overrides: str) -> dict[str, str]:
    data = {
        "name": f"My {preset}",
        "slug": f"my-{preset}",
        "preset": preset,
        "base_url": "",
        "wire_format": "openai",
        "api_key": KEY,
        "extra_headers": "{}",
        "is_active": "on",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize("key", list(presets.PROVIDER_PRESETS))
def test_a_preset_and_a_key_make_a_working_provider(admin_client: Client, key: str) -> None:
    preset = presets.PROVIDER_PRESETS[key]
    response = admin_client.post(reverse("admin:monitor_provider_add"), _provider_form(key))
    assert response.status_code == 302, response.content.decode()[:3000]
    provider = Provider.objects.get(slug=f"my-{key}")
    assert (provider.preset, provider.base_url, provider.wire_format) == (
        key,
        preset["base_url"],
        preset["wire_format"],
    )
    assert (provider.http2, provider.accepts_msgpack) == (preset["http2"], False)
    assert provider.get_api_key() == KEY
    page = admin_client.get(reverse("admin:monitor_provider_change", args=[provider.pk]))
    assert KEY not in page.content.decode()


def test_the_preset_menu_says_what_each_preset_sets(admin_client: Client) -> None:
    page = admin_client.get(reverse("admin:monitor_provider_add")).content.decode()
    assert "Anthropic: anthropic format, x-api-key: &lt;key&gt;" in page
    assert "explicit cache_control breakpoints, reasoning by thinking budget" in page
    assert "Ollama (local): openai format, none (any key is accepted and ignored), HTTP/1.1" in page


def test_a_preset_applies_when_chosen_not_on_every_later_save(admin_client: Client) -> None:
    admin_client.post(reverse("admin:monitor_provider_add"), _provider_form("groq"))
    provider = Provider.objects.get(slug="my-groq")
    # Turning HTTP/2 off by hand, the preset still shown as chosen, sticks.
    form = _provider_form("groq", base_url=provider.base_url, api_key="")
    form.pop("is_active")
    form["is_active"] = "on"
    response = admin_client.post(reverse("admin:monitor_provider_change", args=[provider.pk]), form)
    assert response.status_code == 302
    provider.refresh_from_db()
    assert provider.http2 is False
    assert provider.get_api_key() == KEY  # blank keeps the key


def _route_form(provider: Provider, preset: str) -> dict[str, str]:
    return {
        "provider": str(provider.pk),
        "model_id": "gpt-4o-mini",
        "display_name": "",
        "price_input_per_mtok": "0",
        "price_output_per_mtok": "0",
        "price_cached_input_per_mtok": "",
        "quality_index": "",
        "preset": preset,
        "token_limit_param": "max_completion_tokens",
        "reasoning_effort": "",
        "thinking_budget_tokens": "",
        "service_tier": "",
        "temperature": "",
        "extra_body": "{}",
        "api_version": "",
        "secret_headers": "",
        "is_active": "on",
    }


def test_a_route_can_start_from_its_providers_request_settings(admin_client: Client) -> None:
    admin_client.post(reverse("admin:monitor_provider_add"), _provider_form("azure"))
    azure = Provider.objects.get(slug="my-azure")
    response = admin_client.post(
        reverse("admin:monitor_route_add"), _route_form(azure, presets.PROVIDER_DEFAULTS)
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    route = Route.objects.get(provider=azure)
    assert (route.api_version, route.token_limit_param) == ("2024-10-21", "max_tokens")


def test_the_providers_defaults_need_a_provider_made_from_a_preset(admin_client: Client) -> None:
    handmade = f.provider("handmade")
    response = admin_client.post(
        reverse("admin:monitor_route_add"), _route_form(handmade, presets.PROVIDER_DEFAULTS)
    )
    assert response.status_code == 200
    assert "This provider was not made from a preset." in response.content.decode()
    assert not Route.objects.exists()


# --- uploads ---------------------------------------------------------------------------------


def _upload(name: str, content: bytes | None = None) -> SimpleUploadedFile:
    return SimpleUploadedFile(
        name, content if content is not None else (FIXTURES / name).read_bytes()
    )


def test_eval_cases_are_imported_from_an_upload_on_the_task(admin_client: Client) -> None:
    task = f.task("facts", [], [])
    change = admin_client.get(reverse("admin:monitor_task_change", args=[task.pk])).content.decode()
    url = reverse("admin:monitor_task_import_evals", args=[task.pk])
    assert url in change
    assert "Import eval cases into Facts" in admin_client.get(url).content.decode()
    page = admin_client.post(
        url, {"file": _upload("promptfooconfig.yaml"), "grader": "exact", "tolerance": "0"}
    )
    assert page.status_code == 200
    body = page.content.decode()
    assert "6 created" in body
    assert "assertion &#x27;llm-rubric&#x27; not imported" in body
    assert EvalCase.objects.filter(task=task).count() == 6


def test_a_malformed_upload_shows_the_line_and_changes_nothing(admin_client: Client) -> None:
    task = f.task("facts", [], [])
    url = reverse("admin:monitor_task_import_evals", args=[task.pk])
    bad = b'{"input": "a", "ideal": "b"}\n{"input": "c", "ideal": \n'
    page = admin_client.post(
        url, {"file": _upload("cases.jsonl", bad), "grader": "exact", "tolerance": "0"}
    )
    assert "cases.jsonl, line 2: not valid JSON" in page.content.decode()
    assert not EvalCase.objects.exists()


def _alias_bomb(levels: int) -> bytes:
    """A promptfoo config of a few hundred bytes whose assertion, its aliases expanded, lists
    10**levels texts (at 9 levels it held an admin request for minutes)."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]" for n in range(1, levels)]
    lines += [
        "tests:",
        "  - vars: {input: hi}",
        f"    assert: [{{type: contains-any, value: *l{levels - 1}}}]",
    ]
    return "\n".join(lines).encode()


def test_a_yaml_alias_bomb_is_refused_with_a_clear_message(admin_client: Client) -> None:
    task = f.task("facts", [], [])
    url = reverse("admin:monitor_task_import_evals", args=[task.pk])
    bomb = _alias_bomb(6)
    assert len(bomb) < 500
    page = admin_client.post(
        url, {"file": _upload("promptfooconfig.yaml", bomb), "grader": "exact", "tolerance": "0"}
    )
    assert page.status_code == 200
    assert (
        "promptfooconfig.yaml, line 2: YAML aliases are not accepted (*l0)" in page.content.decode()
    )
    assert not EvalCase.objects.exists()


def test_the_dry_run_box_shows_what_would_change(admin_client: Client) -> None:
    task = f.task("facts", [], [])
    url = reverse("admin:monitor_task_import_evals", args=[task.pk])
    page = admin_client.post(
        url,
        {"file": _upload("cases.csv"), "grader": "exact", "tolerance": "0", "dry_run": "on"},
    )
    assert "Dry run: nothing was written" in page.content.decode()
    assert not EvalCase.objects.exists()


def test_prices_and_quality_are_imported_from_uploads_on_the_routes(admin_client: Client) -> None:
    openai = Provider.objects.create(
        name="OpenAI", slug="openai", base_url="https://api.openai.com/v1", preset="openai"
    )
    route = f.route(openai, "gpt-4o-mini")
    listing = admin_client.get(reverse("admin:monitor_route_changelist")).content.decode()
    assert reverse("admin:monitor_route_import_prices") in listing
    admin_client.post(
        reverse("admin:monitor_route_import_prices"),
        {"file": _upload("model_prices_and_context_window.json")},
    )
    admin_client.post(
        reverse("admin:monitor_route_import_quality"), {"file": _upload("quality.csv")}
    )
    route.refresh_from_db()
    assert (route.price_input_per_mtok, route.price_cached_input_per_mtok) == (
        Decimal("0.15"),
        Decimal("0.075"),
    )
    assert route.quality_index == 36.2


def test_a_price_import_needs_a_file_or_a_url(admin_client: Client) -> None:
    page = admin_client.post(reverse("admin:monitor_route_import_prices"), {})
    assert "Give a file or a URL" in page.content.decode()


class _Serving(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def deep_json_url() -> Iterator[str]:
    body = b'{"gpt-4o-mini": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("Handler", (_Serving,), {"body": body})
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}/prices.json"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(
    ("url", "refusal"),
    [
        ("https://example.com:99999/prices.json", "not a valid URL: Port out of range"),
        ("https://[64:ff9b::7f00:1]/prices.json", "resolves to a non-public address"),
        ("deep", "not valid JSON: nested too deeply"),
    ],
)
def test_a_price_url_that_cannot_be_imported_is_refused_on_the_form(
    admin_client: Client, settings, deep_json_url: str, url: str, refusal: str
) -> None:
    settings.PROVIDER_ALLOW_PRIVATE_NETWORKS = url == "deep"
    page = admin_client.post(
        reverse("admin:monitor_route_import_prices"),
        {"url": deep_json_url if url == "deep" else url},
    )
    assert page.status_code == 200
    assert refusal in page.content.decode()


@pytest.mark.parametrize("name", ["monitor_route_import_prices", "monitor_route_import_quality"])
def test_import_pages_are_for_staff_only(client: Client, teammate: User, name: str) -> None:
    assert client.get(reverse(f"admin:{name}")).status_code == 302
    client.force_login(teammate)
    response = client.get(reverse(f"admin:{name}"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_the_eval_import_page_is_for_staff_only(client: Client, teammate: User) -> None:
    task = f.task("facts", [], [])
    client.force_login(teammate)
    response = client.post(
        reverse("admin:monitor_task_import_evals", args=[task.pk]),
        {"file": _upload("cases.csv"), "grader": "exact", "tolerance": "0"},
    )
    assert response.status_code == 302
    assert not EvalCase.objects.exists()
