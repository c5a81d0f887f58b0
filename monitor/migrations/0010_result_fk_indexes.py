"""Probe results' task and route foreign keys without indexes of their own.

Each duplicated the lead of another index (result_one_per_slot: task first;
result_route_started: route first), which answers the same lookups, deletes included: two
indexes fewer for ingest to write per row. Only the indexes go, concurrently; the foreign-key
constraints stay as they are (AlterField alone would drop and re-validate them over the whole
table).
"""

import django.db.models.deletion
from django.db import migrations, models

INDEXES = {
    "route": "monitor_proberesult_route_id_19852050",
    "task": "monitor_proberesult_task_id_af56c776",
}


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("monitor", "0009_result_route_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="proberesult",
                    name="route",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="results",
                        to="monitor.route",
                    ),
                ),
                migrations.AlterField(
                    model_name="proberesult",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="results",
                        to="monitor.task",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"',
                    f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{name}"'
                    f' ON "monitor_proberesult" ("{field}_id")',
                )
                for field, name in INDEXES.items()
            ],
        ),
    ]
