"""Each result's failure time (request sent -> the failure was known), for OpenTelemetry's
GenAI client metrics (a failed operation's duration, with error.type). The gaps between a
result's chunks travel in its payload to the export and are not stored (up to 2 kB a row).

Nullable with no default: adding it to the partitioned raw results table is a catalog change
only, however many rows it holds."""

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
    ]
