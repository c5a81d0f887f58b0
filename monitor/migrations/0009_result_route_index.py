"""The (route, started_at) index of raw results without its measurement columns.

It carried region, outcome, ttft, e2e and tps so route pages could compute percentiles from
raw rows with index-only scans. Every percentile now comes from the rollups; the raw reads left
(median probe, headroom, option comparisons: one route, last 24 h) visit the rows anyway. The
slim index is about a third of the size (0.6 GB instead of 2 GB for a year of 50 routes x 3
regions) and costs ingest less. Built concurrently, so upgrading never blocks ingest.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("monitor", "0008_hour_strips"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="proberesult",
            index=models.Index(fields=["route", "started_at"], name="result_route_started"),
        ),
        RemoveIndexConcurrently(model_name="proberesult", name="result_route_time"),
    ]
