"""Real providers: capabilities, per-route request settings, what served each probe, and the
failure kinds that are ours (config, engine)."""

from typing import Any

import django.core.validators
from django.db import migrations, models


def msgpack_from_body_encoding(apps: Any, schema_editor: Any) -> None:
    # Provider.body_encoding was a setting nothing read; a provider set to msgpack + gzip is
    # taken to accept it, everyone else not (a msgpack probe to them would fail for our reason).
    Provider = apps.get_model("monitor", "Provider")
    Provider.objects.filter(body_encoding="msgpack-gzip").update(accepts_msgpack=True)


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0010_result_fk_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="proberesult",
            name="connection_reused",
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="proberesult",
            name="hidden_reasoning_tokens",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="proberesult",
            name="reasoning_tokens",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="proberesult",
            name="request_id",
            field=models.CharField(db_default="", default="", blank=True, max_length=100),
        ),
        migrations.AddField(
            model_name="proberesult",
            name="served_model",
            field=models.CharField(db_default="", default="", blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name="proberesult",
            name="service_tier",
            field=models.CharField(db_default="", default="", blank=True, max_length=30),
        ),
        migrations.AddField(
            model_name="proberesult",
            name="streamed_output_tokens",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="proberesult",
            name="tps_token_source",
            field=models.CharField(
                db_default="",
                default="",
                blank=True,
                max_length=40,
                verbose_name="how speed's tokens were counted",
            ),
        ),
        migrations.AddField(
            model_name="provider",
            name="accepts_msgpack",
            field=models.BooleanField(
                default=False,
                help_text="The provider takes application/vnd.msgpack request bodies (few do).",
                verbose_name="accepts msgpack + gzip bodies",
            ),
        ),
        migrations.AddField(
            model_name="route",
            name="api_version",
            field=models.CharField(
                blank=True,
                help_text="Azure OpenAI: the api-version query parameter, e.g. 2024-10-21.",
                max_length=30,
                verbose_name="API version",
            ),
        ),
        migrations.AddField(
            model_name="route",
            name="extra_body",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text='Merged into the request body, e.g. {"response_format": {"type": "json_object"}}.',
                verbose_name="extra body fields",
            ),
        ),
        migrations.AddField(
            model_name="route",
            name="reasoning_effort",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "not sent"),
                    ("minimal", "minimal"),
                    ("low", "low"),
                    ("medium", "medium"),
                    ("high", "high"),
                ],
                help_text="OpenAI-format reasoning models: more effort, more hidden reasoning tokens.",
                max_length=10,
            ),
        ),
        migrations.AddField(
            model_name="route",
            name="secret_headers_encrypted",
            field=models.TextField(blank=True, default="", editable=False),
        ),
        migrations.AddField(
            model_name="route",
            name="service_tier",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "not sent"),
                    ("auto", "auto"),
                    ("default", "default"),
                    ("flex", "flex (cheaper, slower)"),
                    ("priority", "priority (faster, dearer)"),
                ],
                help_text="Separate by urgency: priority costs more and queues less, flex the reverse.",
                max_length=10,
            ),
        ),
        migrations.AddField(
            model_name="route",
            name="temperature",
            field=models.FloatField(
                blank=True,
                help_text="Empty: not sent (reasoning models refuse any but the default).",
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(0.0),
                    django.core.validators.MaxValueValidator(2.0),
                ],
            ),
        ),
        migrations.AddField(
            model_name="route",
            name="thinking_budget_tokens",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Anthropic extended thinking (at least 1024). Empty: thinking off.",
                null=True,
                validators=[django.core.validators.MinValueValidator(1024)],
                verbose_name="thinking budget (tokens)",
            ),
        ),
        migrations.AddField(
            model_name="route",
            name="token_limit_param",
            field=models.CharField(
                choices=[
                    ("max_tokens", "max_tokens (chat models, Anthropic, most compatible servers)"),
                    (
                        "max_completion_tokens",
                        "max_completion_tokens (OpenAI reasoning models: o-series, GPT-5)",
                    ),
                ],
                default="max_tokens",
                help_text="OpenAI reasoning models refuse max_tokens and need max_completion_tokens.",
                max_length=30,
                verbose_name="token-limit parameter",
            ),
        ),
        migrations.AlterField(
            model_name="proberesult",
            name="error_kind",
            field=models.CharField(
                blank=True,
                choices=[
                    ("dns", "dns"),
                    ("connect", "connect"),
                    ("tls", "tls"),
                    ("timeout_headers", "timeout_headers"),
                    ("timeout_first_token", "timeout_first_token"),
                    ("timeout_total", "timeout_total"),
                    ("http_4xx", "http_4xx"),
                    ("http_429", "http_429"),
                    ("http_5xx", "http_5xx"),
                    ("stream_error", "stream_error"),
                    ("malformed_stream", "malformed_stream"),
                    ("too_large", "too_large"),
                    ("truncated", "truncated"),
                    ("blocked_url", "blocked_url"),
                    ("config", "config"),
                    ("engine", "engine"),
                    ("missed", "missed"),
                ],
                max_length=30,
            ),
        ),
        migrations.AlterField(
            model_name="provider",
            name="http2",
            field=models.BooleanField(
                default=False,
                help_text="The provider negotiates HTTP/2.",
                verbose_name="supports HTTP/2",
            ),
        ),
        migrations.AlterField(
            model_name="provider",
            name="wire_format",
            field=models.CharField(
                choices=[
                    ("openai", "OpenAI Chat Completions"),
                    ("anthropic", "Anthropic Messages"),
                    ("azure", "Azure OpenAI (deployment URL, api-key header)"),
                ],
                default="openai",
                max_length=20,
            ),
        ),
        migrations.RunPython(msgpack_from_body_encoding, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name="provider",
            name="body_encoding",
        ),
    ]
