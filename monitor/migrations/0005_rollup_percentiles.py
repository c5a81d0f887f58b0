"""Each rollup row carries its own p50/p95/p99 of TTFT, e2e and tps, kept by PostgreSQL.

A chart point is one rollup row: reading its percentiles ready-made spares the page from
decoding and walking three histograms per point (720 points for a month of hours). The columns
are generated from the histograms, so no writer (ingest's UPSERT, a bulk load, an admin fix)
can leave them out of step. rw_pairs_pcts mirrors monitor.hist.percentiles (same bucket
representative, same minimum samples), rounded to 0.1 ms or tok/s as the charts show them
(rounding here, once per write, is cheaper than at every read); tests/monitor/test_hist_sql.py
holds them equal.
"""

import django.contrib.postgres.fields
from django.db import migrations, models

PCTS_SQL = """
CREATE OR REPLACE FUNCTION rw_pairs_pcts(pairs integer[], low float8)
RETURNS float8[] LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
-- p50, p95, p99 of a (bucket, count) pairs histogram (monitor.hist, RATIO = 1.05), rounded to
-- 0.1 as charts show them; NULL where there are fewer samples than monitor.hist.MIN_SAMPLES
-- asks for that percentile.
DECLARE
  len int := coalesce(array_length(pairs, 1), 0);
  qs int[] := ARRAY[50, 95, 99];
  min_n int[] := ARRAY[5, 20, 100];
  n bigint := 0;
  seen bigint := 0;
  k int := 1;
  j int;
  b int;
  rank float8;
  out float8[] := '{}';
BEGIN
  FOR j IN 2..len BY 2 LOOP
    n := n + pairs[j];
  END LOOP;
  FOR j IN 1..3 LOOP
    IF n = 0 OR n < min_n[j] THEN
      out := out || NULL::float8;
      CONTINUE;
    END IF;
    rank := ceil(qs[j]::float8 / 100 * n);
    WHILE k < len AND seen + pairs[k + 1] < rank LOOP
      seen := seen + pairs[k + 1];
      k := k + 2;
    END LOOP;
    b := pairs[least(k, len - 1)];
    out := out || round((CASE WHEN b = 0 THEN low
                             ELSE low * power(1.05::float8, b - 1) * sqrt(1.05::float8)
                        END)::numeric, 1)::float8;
  END LOOP;
  RETURN out;
END
$$;
"""


def _pcts(column: str, low: float) -> models.GeneratedField:
    return models.GeneratedField(
        expression=models.Func(
            models.F(column),
            models.Value(low),
            function="rw_pairs_pcts",
            output_field=django.contrib.postgres.fields.ArrayField(
                models.FloatField(null=True), size=3
            ),
        ),
        output_field=django.contrib.postgres.fields.ArrayField(
            models.FloatField(null=True), size=3
        ),
        db_persist=True,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("monitor", "0004_digest"),
    ]

    operations = [
        migrations.RunSQL(PCTS_SQL, "DROP FUNCTION IF EXISTS rw_pairs_pcts(integer[], float8);"),
        migrations.AddField(model_name="rollup", name="ttft_pcts", field=_pcts("ttft_hist", 1.0)),
        migrations.AddField(model_name="rollup", name="e2e_pcts", field=_pcts("e2e_hist", 1.0)),
        migrations.AddField(model_name="rollup", name="tps_pcts", field=_pcts("tps_hist", 0.1)),
    ]
