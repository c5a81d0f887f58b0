"""Provider API keys: write-only in admin, encrypted at rest, rotatable, never logged."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils.log import configure_logging

from monitor.crypto import ApiKeyDecryptionError
from monitor.logfilters import RedactSecrets, register_secret
from monitor.models import Provider

CANARY = "sk-canary-4f1d9a7b2c3e8d6f0a1b"
CREDENTIAL_ERROR = (
    "looks like a credential: extra headers are stored and sent in plain text. Put it in the "
    "secret headers of this provider's routes (Routes, secret headers), which are encrypted "
    "and bound to the provider's origin."
)


def _provider_form(**overrides: str) -> dict[str, str]:
    data = {
        "name": "Canary Cloud",
        "slug": "canary-cloud",
        "base_url": "http://127.0.0.1:9/v1",
        "wire_format": "openai",
        "api_key": CANARY,
        "extra_headers": "{}",
        "is_active": "on",
    }
    data.update(overrides)
    return data


def _raw_column(provider_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT api_key_encrypted FROM monitor_provider WHERE id = %s", [provider_id]
        )
        return str(cursor.fetchone()[0])


def test_a_typed_key_never_comes_back_and_is_never_logged(
    admin_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    add = admin_client.post(reverse("admin:monitor_provider_add"), _provider_form(), follow=True)
    assert add.status_code == 200
    provider = Provider.objects.get(slug="canary-cloud")
    pages = [
        add,
        admin_client.get(reverse("admin:monitor_provider_change", args=[provider.pk])),
        admin_client.get(reverse("admin:monitor_provider_changelist")),
        admin_client.get(reverse("admin:monitor_provider_history", args=[provider.pk])),
        # A form error re-renders the page with the posted data: the key must not come back.
        admin_client.post(
            reverse("admin:monitor_provider_change", args=[provider.pk]),
            _provider_form(base_url="ftp://nope", api_key=CANARY + "-new"),
        ),
    ]
    for page in pages:
        assert page.status_code == 200
        assert CANARY.encode() not in page.content
    assert CANARY not in caplog.text
    assert provider.get_api_key() == CANARY


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "proxy-authorization",
        "x-api-key",
        "API-Key",
        "X-Goog-Api-Key",
        "X-Auth-Token",
        "Cookie",
        "x-client-secret",
    ],
)
def test_a_credential_is_refused_as_a_plain_extra_header(admin_client: Client, name: str) -> None:
    page = admin_client.post(
        reverse("admin:monitor_provider_add"),
        _provider_form(extra_headers=json.dumps({name: "gw-0123456789"})),
    )
    assert page.status_code == 200
    assert not Provider.objects.exists()
    errors = page.context["adminform"].form.errors["extra_headers"]
    assert errors == [f"{name} {CREDENTIAL_ERROR}"]


def test_other_extra_headers_are_kept(admin_client: Client) -> None:
    kept = {"OpenAI-Organization": "org-1", "anthropic-beta": "prompt-caching-2024-07-31"}
    admin_client.post(
        reverse("admin:monitor_provider_add"), _provider_form(extra_headers=json.dumps(kept))
    )
    assert Provider.objects.get().extra_headers == kept


def test_log_output_never_holds_a_decrypted_key(db: None) -> None:
    provider = Provider(name="P", slug="p", base_url="https://x.example/v1")
    provider.set_api_key(CANARY)
    provider.save()
    key = Provider.objects.get(pk=provider.pk).get_api_key()
    # The console handler configured by settings.LOGGING, with its redaction filter.
    handler: logging.StreamHandler[Any] = next(
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler)
        and any(isinstance(f, RedactSecrets) for f in h.filters)
    )
    buffer = io.StringIO()
    previous = handler.setStream(buffer)
    try:
        logging.getLogger("monitor.test").error("request failed for key %s", key)
        logging.getLogger("monitor.test").error(
            "headers: {'Authorization': 'Bearer %s'}", "tok-" + "z" * 20
        )
        try:
            raise RuntimeError(f"provider said no to {key}")
        except RuntimeError:
            logging.getLogger("monitor.test").exception("probe failed")
    finally:
        handler.setStream(previous)
    output = buffer.getvalue()
    assert "request failed for key [redacted]" in output
    assert "probe failed" in output
    assert CANARY not in output
    assert "z" * 20 not in output


@pytest.mark.parametrize("configured", ["once", "again"])
def test_djangos_own_log_handlers_redact_too_with_debug_on(
    db: None, settings: Any, configured: str
) -> None:
    # Django configures handlers of its own (the `django` logger's console handler prints
    # when DEBUG is on, before the record reaches ours; `django.server` logs request lines).
    # django.setup configures logging afresh each time it runs (Celery's Django fixup runs it
    # again in a worker): the handlers it then makes must redact as well.
    if configured == "again":
        configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)
    settings.DEBUG = True
    register_secret(CANARY)
    streams: list[tuple[logging.StreamHandler[Any], Any, io.StringIO]] = []
    for name in ("django.request", "django.server"):
        logger: logging.Logger | None = logging.getLogger(name)
        while logger is not None:
            for h in logger.handlers:
                ours = not type(h).__module__.startswith("_pytest")  # not pytest's capture
                if (
                    ours
                    and isinstance(h, logging.StreamHandler)
                    and h not in [s[0] for s in streams]
                ):
                    buffer = io.StringIO()
                    streams.append((h, h.setStream(buffer), buffer))
            logger = logger.parent if logger.propagate else None
    try:
        logging.getLogger("django.request").error("upstream refused key %s", CANARY)
        logging.getLogger("django.server").info('"GET /?key=%s HTTP/1.1" 200 1', CANARY)
    finally:
        for handler, previous, _ in streams:
            handler.setStream(previous)
    outputs = [buffer.getvalue() for _, _, buffer in streams]
    assert not [o for o in outputs if CANARY in o]
    assert len([o for o in outputs if "upstream refused key [redacted]" in o]) == 2
    assert len([o for o in outputs if "GET /?key=[redacted]" in o]) == 1


def test_the_database_column_holds_no_plaintext(admin_client: Client) -> None:
    admin_client.post(reverse("admin:monitor_provider_add"), _provider_form())
    provider = Provider.objects.get(slug="canary-cloud")
    raw = _raw_column(provider.pk)
    assert raw
    assert CANARY not in raw
    assert "canary" not in raw


def test_a_blank_key_field_keeps_the_stored_key_and_clear_removes_it(admin_client: Client) -> None:
    admin_client.post(reverse("admin:monitor_provider_add"), _provider_form())
    provider = Provider.objects.get(slug="canary-cloud")
    url = reverse("admin:monitor_provider_change", args=[provider.pk])
    admin_client.post(url, _provider_form(api_key="", name="Renamed"))
    provider.refresh_from_db()
    assert provider.name == "Renamed"
    assert provider.get_api_key() == CANARY
    admin_client.post(url, _provider_form(api_key="", clear_api_key="on"))
    provider.refresh_from_db()
    assert not provider.has_api_key


def test_decrypting_with_a_wrong_key_raises(db: None, settings) -> None:
    provider = Provider(name="P", slug="p", base_url="https://x.example/v1")
    provider.set_api_key(CANARY)
    provider.save()
    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    provider.refresh_from_db()
    with pytest.raises(ApiKeyDecryptionError):
        provider.get_api_key()


def test_rotation_keeps_old_keys_readable_and_moves_to_the_new_key(db: None, settings) -> None:
    old_key = settings.FIELD_ENCRYPTION_KEYS[0]
    provider = Provider(name="P", slug="p", base_url="https://x.example/v1")
    provider.set_api_key(CANARY)
    provider.save()
    new_key = Fernet.generate_key().decode()
    settings.FIELD_ENCRYPTION_KEYS = [new_key, old_key]
    provider.refresh_from_db()
    assert provider.get_api_key() == CANARY  # old ciphertext still opens
    before = provider.api_key_encrypted
    call_command("rotate_api_keys")
    provider.refresh_from_db()
    assert provider.api_key_encrypted != before
    settings.FIELD_ENCRYPTION_KEYS = [new_key]  # the old key is gone now
    provider.refresh_from_db()
    assert provider.get_api_key() == CANARY


def test_log_lines_and_probe_details_are_cleaned_by_one_redactor() -> None:
    import monitor.logfilters
    import probes.redact

    assert monitor.logfilters.redact is probes.redact.redact
    record = logging.LogRecord(
        "monitor.test",
        logging.ERROR,
        __file__,
        1,
        "azure said no: %s",
        ("{'api-key': 'a1b2c3d4e5f6a7b8c9d0', 'url': 'https://x.example/v1?key=AIzaSyZZZZZZZZ'}",),
        None,
    )
    RedactSecrets().filter(record)
    assert "a1b2c3d4e5f6a7b8c9d0" not in record.getMessage()
    assert "AIzaSyZZZZZZZZ" not in record.getMessage()
    assert "azure said no" in record.getMessage()


@pytest.mark.parametrize(
    ("model", "hidden"),
    [
        ("provider", ("api_key", "aws_access_key_id", "aws_secret_access_key")),
        ("route", ("secret_headers",)),
        ("region", "__ALL__"),  # its inline's key secrets: every field
        ("alertchannel", ("target_url", "signing_secret")),
    ],
)
def test_every_admin_that_takes_secrets_keeps_them_out_of_error_reports(
    admin_client: Client, model: str, hidden: tuple[str, ...] | str
) -> None:
    """What Django's error reports (and its request logging with DEBUG) leave out."""
    response = admin_client.post(reverse(f"admin:monitor_{model}_add"), {"name": ""})
    assert response.status_code == 200  # the form again, with its errors
    assert response.wsgi_request.sensitive_post_parameters == hidden  # type: ignore[attr-defined]
