"""Time to first answer token on the route page's charts.

Chart points grow from 9 to 12 numbers: [ttft p50, p95, p99, e2e p50, p95, p99, tps p50, p95,
p99, ttfat p50, p95, p99]. The strip trigger (migration 0008) computes the ttfat percentiles
from the hourly row's ttfat_hist with rw_pairs_pcts (migration 0005) instead of a generated
column, so adding them rewrites no table. Strips written before keep their 9-number points
(their hours held no ttfat histogram): the page reads the missing three as "no data", so the
migration rebuilds nothing and runs in no time on any data set.
"""

from django.db import migrations

EMPTY_STRIP = "[" + ", ".join(["null"] * 24) + "]"

POINT_SQL = """
CREATE OR REPLACE FUNCTION rw_chart_point(ttft float8[], e2e float8[], tps float8[],
                                          ttfat float8[])
RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  -- One chart point: [ttft p50, p95, p99, e2e p50, p95, p99, tps p50, p95, p99,
  --                   ttfat p50, p95, p99].
  SELECT to_jsonb(coalesce(ttft, '{NULL,NULL,NULL}') || coalesce(e2e, '{NULL,NULL,NULL}')
                  || coalesce(tps, '{NULL,NULL,NULL}') || coalesce(ttfat, '{NULL,NULL,NULL}'))
$$;
"""


def _write_fn(point: str) -> str:
    return f"""
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
    point := {point};
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
"""


def _rebuild_fn(point: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION rw_hour_strips_rebuild() RETURNS bigint LANGUAGE sql AS $$
  DELETE FROM monitor_hourstrip;
  INSERT INTO monitor_hourstrip (day, task_id, route_id, region_id, points)
  SELECT strip_day, task_id, route_id, region_id,
    (SELECT jsonb_agg(hours -> h::text ORDER BY h) FROM generate_series(0, 23) AS h)::text
  FROM (
    SELECT date_trunc('day', bucket_start, 'UTC') AS strip_day, task_id, route_id, region_id,
      jsonb_object_agg(extract(hour FROM bucket_start AT TIME ZONE 'UTC')::int::text,
                       {point}) AS hours
    FROM monitor_rollup WHERE grain = 'hour'
    GROUP BY 1, 2, 3, 4
  ) AS days;
  SELECT count(*) FROM monitor_hourstrip;
$$;
"""


NEW_POINT = (
    "rw_chart_point(NEW.ttft_pcts, NEW.e2e_pcts, NEW.tps_pcts, rw_pairs_pcts(NEW.ttfat_hist, 1.0))"
)
OLD_POINT = "rw_hour_point(NEW.ttft_pcts, NEW.e2e_pcts, NEW.tps_pcts)"
NEW_ROW_POINT = "rw_chart_point(ttft_pcts, e2e_pcts, tps_pcts, rw_pairs_pcts(ttfat_hist, 1.0))"
OLD_ROW_POINT = "rw_hour_point(ttft_pcts, e2e_pcts, tps_pcts)"


class Migration(migrations.Migration):
    dependencies = [("monitor", "0012_trust")]

    operations = [
        migrations.RunSQL(
            POINT_SQL + _write_fn(NEW_POINT) + _rebuild_fn(NEW_ROW_POINT),
            _write_fn(OLD_POINT)
            + _rebuild_fn(OLD_ROW_POINT)
            + "DROP FUNCTION IF EXISTS rw_chart_point(float8[], float8[], float8[], float8[]);",
        )
    ]
