"""Each result's failure time (request sent -> the failure was known) and the gaps between its
content chunks, for OpenTelemetry's GenAI client metrics (failed operations' duration with
error.type; time_per_output_chunk recorded per chunk).

Both are nullable with no default: adding them to the partitioned raw results table is a catalog
change only, however many rows it holds."""

import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0029_alerts"),
    ]

    operations = [
        migrations.AddField(
            model_name="proberesult",
            name="failed_after_ms",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="proberesult",
            name="chunk_gaps_ms",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.FloatField(), blank=True, null=True, size=None
            ),
        ),
    ]
