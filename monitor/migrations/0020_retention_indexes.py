"""Retention finds old rows by time: scenario results by their slot time, closed slots by
theirs (a BRIN index: slots are created in time order). Built without locking writes out
(CONCURRENTLY)."""

from django.contrib.postgres.indexes import BrinIndex
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("monitor", "0019_partitioned_results"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="scenarioresult",
            index=models.Index(fields=["slot_at"], name="scenario_slot_at"),
        ),
        AddIndexConcurrently(
            model_name="probeslot",
            index=BrinIndex(fields=["slot_at"], name="slot_at_brin"),
        ),
    ]
