"""Tell the planner that a route belongs to few tasks (and a region to all of them).

Without it, PostgreSQL multiplies the selectivities of task, route and region as if they were
independent, takes one (task, route, region) for ~1/5 of its true rows, and answers the route
page's raw reads (median probe, option comparisons: one route, last 24 h) by ANDing the BRIN
index with a scan of that combination's whole history: 60 ms instead of 12 ms for the page on
a year of rows (make bench-pages). Functional-dependency statistics fix the estimate.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0006_overview_snapshot"),
    ]

    operations = [
        migrations.RunSQL(
            "CREATE STATISTICS IF NOT EXISTS result_task_route_region (dependencies)"
            " ON task_id, route_id, region_id FROM monitor_proberesult;"
            " ANALYZE monitor_proberesult;",
            "DROP STATISTICS IF EXISTS result_task_route_region;",
        ),
    ]
