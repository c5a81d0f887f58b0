# The onset of an alert's evidence, in data time: its minimum duration counts from here
# (monitor.alerts.onset). Alerts from before keep null and count from started_at.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0031_alert_window_exact"),
    ]

    operations = [
        migrations.AddField(
            model_name="alert",
            name="onset_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
