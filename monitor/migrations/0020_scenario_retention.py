"""Retention deletes scenario results by their slot time: an index for it, built without
locking writes out (CONCURRENTLY)."""

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
    ]
