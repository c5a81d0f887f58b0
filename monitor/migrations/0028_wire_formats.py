"""Three more wire formats (OpenAI Responses, Gemini native, Amazon Bedrock ConverseStream):
the wire format's choices, a Bedrock provider's AWS region, and each result's server time (the
provider's own, as it reports it: Bedrock's metrics.latencyMs, openai-processing-ms).

server_ms is nullable with no default: adding it to the partitioned raw results table is a
catalog change only, however many rows it holds."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0026_regionkey_deactivated_at"),
    ]

    operations = [
        migrations.AlterField(
            model_name="provider",
            name="wire_format",
            field=models.CharField(
                choices=[
                    ("openai", "OpenAI Chat Completions"),
                    ("anthropic", "Anthropic Messages"),
                    ("azure", "Azure OpenAI (deployment URL, api-key header)"),
                    ("responses", "OpenAI Responses"),
                    ("gemini", "Gemini native (streamGenerateContent, x-goog-api-key)"),
                    ("bedrock", "Amazon Bedrock ConverseStream (SigV4 or a Bedrock API key)"),
                ],
                default="openai",
                max_length=20,
            ),
        ),
        migrations.AddField(
            model_name="provider",
            name="aws_region",
            field=models.CharField(
                blank=True,
                help_text="Amazon Bedrock: the region requests are signed for. Empty: from the "
                "base URL's host (bedrock-runtime.REGION.amazonaws.com).",
                max_length=30,
                verbose_name="AWS region",
            ),
        ),
        migrations.AddField(
            model_name="proberesult",
            name="server_ms",
            field=models.FloatField(blank=True, null=True),
        ),
    ]
