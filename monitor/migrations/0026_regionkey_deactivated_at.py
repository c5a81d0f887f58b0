from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("monitor", "0025_scenario_generated")]

    operations = [
        # Keys deactivated before this existed stay without a date: no grace for them (when
        # they stopped signing is unknown).
        migrations.AddField(
            model_name="regionkey",
            name="deactivated_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
    ]
