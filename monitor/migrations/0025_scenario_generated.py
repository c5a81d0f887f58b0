"""ScenarioResult.generated: demo history's scenario results are marked like its probe results
(monitor.demo_history). Scenario results already stored were measured: false."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0024_schedule_health"),
    ]

    operations = [
        migrations.AddField(
            model_name="scenarioresult",
            name="generated",
            field=models.BooleanField(db_default=False, default=False),
        ),
    ]
