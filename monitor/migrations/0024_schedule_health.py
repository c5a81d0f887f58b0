"""Start lag on each probe result, and each region's schedule per minute (monitor.stats.health).

start_lag_ms is nullable with no default: adding it to the partitioned raw results table is
a catalog change only, however many rows it holds."""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0023_overview_build_seconds"),
    ]

    operations = [
        migrations.AddField(
            model_name="proberesult",
            name="start_lag_ms",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="RegionMinute",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("minute", models.DateTimeField()),
                ("probed", models.IntegerField(default=0)),
                ("missed", models.IntegerField(default=0)),
                ("late", models.IntegerField(default=0)),
                (
                    "lag_hist",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.IntegerField(), default=list, size=None
                    ),
                ),
                (
                    "region",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, to="monitor.region"
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("region", "minute"), name="region_minute_key")
                ],
            },
        ),
    ]
