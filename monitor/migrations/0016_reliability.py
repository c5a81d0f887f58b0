"""Probe deadlines are bounded by the longest one the region tasks' time limits allow
(monitor.limits.PROBE_TIMEOUT_MAX_S); tasks set above it are brought down to it."""

from typing import Any

import django.core.validators
from django.db import migrations, models

# The value at the time of this migration (monitor.limits may change later; this does not).
PROBE_TIMEOUT_MAX_S = 900


def clamp(apps: Any, schema_editor: Any) -> None:
    Task = apps.get_model("monitor", "Task")
    Task.objects.filter(probe_timeout_s__gt=PROBE_TIMEOUT_MAX_S).update(
        probe_timeout_s=PROBE_TIMEOUT_MAX_S
    )


class Migration(migrations.Migration):
    dependencies = [("monitor", "0015_region_keys")]

    operations = [
        migrations.RunPython(clamp, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="task",
            name="probe_timeout_s",
            field=models.PositiveIntegerField(
                default=180,
                help_text="Total wall-clock bound of one probe; a slot with no result by then plus a minute of grace is recorded as missed.",
                validators=[
                    django.core.validators.MinValueValidator(5),
                    django.core.validators.MaxValueValidator(PROBE_TIMEOUT_MAX_S),
                ],
                verbose_name="probe deadline (s)",
            ),
        ),
    ]
