"""How long the overview snapshot took to build: beat paces its next rebuild by it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0022_generated_span"),
    ]

    operations = [
        migrations.AddField(
            model_name="overviewsnapshot",
            name="build_s",
            field=models.FloatField(default=0.0),
        ),
    ]
