"""The generated demo history's span in one row (GeneratedSpan), filled from the results a
database already holds: pages read it instead of searching every partition of the results."""

from typing import Any

from django.db import migrations, models


def fill(apps: Any, schema_editor: Any) -> None:
    ProbeResult = apps.get_model("monitor", "ProbeResult")
    GeneratedSpan = apps.get_model("monitor", "GeneratedSpan")
    generated = ProbeResult.objects.filter(generated=True)
    first = generated.order_by("started_at").values_list("started_at", flat=True).first()
    last = generated.order_by("-started_at").values_list("started_at", flat=True).first()
    if first is not None and last is not None:
        GeneratedSpan.objects.create(key="results", start=first, last=last)


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0021_faster_pairs_add"),
    ]

    operations = [
        migrations.CreateModel(
            name="GeneratedSpan",
            fields=[
                (
                    "key",
                    models.CharField(
                        default="results", max_length=20, primary_key=True, serialize=False
                    ),
                ),
                ("start", models.DateTimeField()),
                ("last", models.DateTimeField()),
            ],
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
