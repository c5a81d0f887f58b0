"""Hourly chart points kept ready per (task, route, region) and UTC day: monitor.HourStrip.

A trigger on monitor_rollup copies each hourly row's percentiles (the generated *_pcts columns,
migration 0005) into its hour of the day's strip on every insert and update, and blanks the
hour when the row is deleted, so no writer (ingest's UPSERT, a bulk load, an admin fix) can
leave the strips out of step. A month of hourly points is then 31 strips to read, not 720
rollup rows, and the page joins their text without parsing a number (pages_route.series).

rw_hour_strips_rebuild() builds every strip from the hourly rollups in one statement: it fills
them for the rollups already there, and tests/monitor/test_hour_strips.py holds its result
equal to what the trigger keeps.

On delete the trigger only updates a strip, never creates one: deleting a task, route or
region deletes its strips and rollups in either order without leaving a row behind.
"""

import django.db.models.deletion
from django.db import migrations, models

EMPTY_STRIP = "[" + ", ".join(["null"] * 24) + "]"

STRIPS_SQL = f"""
CREATE OR REPLACE FUNCTION rw_hour_point(ttft float8[], e2e float8[], tps float8[])
RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  -- One chart point: [ttft p50, p95, p99, e2e p50, p95, p99, tps p50, p95, p99].
  SELECT to_jsonb(coalesce(ttft, '{{NULL,NULL,NULL}}') || coalesce(e2e, '{{NULL,NULL,NULL}}')
                  || coalesce(tps, '{{NULL,NULL,NULL}}'))
$$;

CREATE OR REPLACE FUNCTION rw_hour_strip_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  r monitor_rollup%ROWTYPE;
  point jsonb;
  strip_day timestamptz;
  hour text;
BEGIN
  IF TG_OP = 'DELETE' THEN
    r := OLD;
    point := 'null';
  ELSE
    r := NEW;
    point := rw_hour_point(NEW.ttft_pcts, NEW.e2e_pcts, NEW.tps_pcts);
  END IF;
  strip_day := date_trunc('day', r.bucket_start, 'UTC');
  hour := extract(hour FROM r.bucket_start AT TIME ZONE 'UTC')::int::text;
  IF TG_OP = 'DELETE' THEN
    IF r.region_id IS NULL THEN
      UPDATE monitor_hourstrip SET points = jsonb_set(points::jsonb, ARRAY[hour], point)::text
      WHERE task_id = r.task_id AND route_id = r.route_id AND region_id IS NULL
        AND day = strip_day;
    ELSE
      UPDATE monitor_hourstrip SET points = jsonb_set(points::jsonb, ARRAY[hour], point)::text
      WHERE task_id = r.task_id AND route_id = r.route_id AND region_id = r.region_id
        AND day = strip_day;
    END IF;
  ELSE
    INSERT INTO monitor_hourstrip AS s (day, task_id, route_id, region_id, points)
    VALUES (strip_day, r.task_id, r.route_id, r.region_id,
            jsonb_set('{EMPTY_STRIP}'::jsonb, ARRAY[hour], point)::text)
    ON CONFLICT (task_id, route_id, region_id, day)
    DO UPDATE SET points = jsonb_set(s.points::jsonb, ARRAY[hour], point)::text;
  END IF;
  RETURN NULL;
END
$$;

CREATE TRIGGER rw_hour_strip_write AFTER INSERT OR UPDATE ON monitor_rollup
FOR EACH ROW WHEN (NEW.grain = 'hour') EXECUTE FUNCTION rw_hour_strip_write();
CREATE TRIGGER rw_hour_strip_delete AFTER DELETE ON monitor_rollup
FOR EACH ROW WHEN (OLD.grain = 'hour') EXECUTE FUNCTION rw_hour_strip_write();

CREATE OR REPLACE FUNCTION rw_hour_strips_rebuild() RETURNS bigint LANGUAGE sql AS $$
  DELETE FROM monitor_hourstrip;
  INSERT INTO monitor_hourstrip (day, task_id, route_id, region_id, points)
  SELECT strip_day, task_id, route_id, region_id,
    (SELECT jsonb_agg(hours -> h::text ORDER BY h) FROM generate_series(0, 23) AS h)::text
  FROM (
    SELECT date_trunc('day', bucket_start, 'UTC') AS strip_day, task_id, route_id, region_id,
      jsonb_object_agg(extract(hour FROM bucket_start AT TIME ZONE 'UTC')::int::text,
                       rw_hour_point(ttft_pcts, e2e_pcts, tps_pcts)) AS hours
    FROM monitor_rollup WHERE grain = 'hour'
    GROUP BY 1, 2, 3, 4
  ) AS days;
  SELECT count(*) FROM monitor_hourstrip;
$$;

SELECT rw_hour_strips_rebuild();
ANALYZE monitor_hourstrip;
"""

DROP_SQL = """
DROP TRIGGER IF EXISTS rw_hour_strip_write ON monitor_rollup;
DROP TRIGGER IF EXISTS rw_hour_strip_delete ON monitor_rollup;
DROP FUNCTION IF EXISTS rw_hour_strips_rebuild();
DROP FUNCTION IF EXISTS rw_hour_strip_write();
DROP FUNCTION IF EXISTS rw_hour_point(float8[], float8[], float8[]);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0007_result_statistics"),
    ]

    operations = [
        migrations.CreateModel(
            name="HourStrip",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("day", models.DateTimeField()),
                ("points", models.TextField()),
                (
                    "region",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        to="monitor.region",
                    ),
                ),
                (
                    "route",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, to="monitor.route"
                    ),
                ),
                (
                    "task",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, to="monitor.task"
                    ),
                ),
            ],
        ),
        migrations.AddConstraint(
            model_name="hourstrip",
            constraint=models.UniqueConstraint(
                fields=("task", "route", "region", "day"),
                name="hourstrip_key",
                nulls_distinct=False,
            ),
        ),
        migrations.RunSQL(STRIPS_SQL, DROP_SQL),
    ]
