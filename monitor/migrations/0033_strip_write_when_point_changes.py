"""An hourly rollup row's update rewrites its hour strip only when its chart point changed.

Ingest updates two hourly rollup rows a result (its region's and all regions'); each update
rewrote its strip (an UPSERT parsing and writing the day's 24 points as JSON), about a third
of the row's write on a quiet machine, though many updates leave the hour's percentiles where
they were: an error or a missed probe adds no sample, and one more sample often leaves every
percentile in its histogram bucket. The update trigger now fires only when the point's
inputs changed (the stored *_pcts columns, the ttfat percentiles, the row's key); inserts and
deletes are as before (migration 0008, 0013). The strip then already holds that point: every
earlier write of the row put it there.
"""

from django.db import migrations

FORWARD = """
DROP TRIGGER IF EXISTS rw_hour_strip_write ON monitor_rollup;
CREATE TRIGGER rw_hour_strip_write AFTER INSERT ON monitor_rollup
FOR EACH ROW WHEN (NEW.grain = 'hour') EXECUTE FUNCTION rw_hour_strip_write();
CREATE TRIGGER rw_hour_strip_update AFTER UPDATE ON monitor_rollup
FOR EACH ROW WHEN (NEW.grain = 'hour' AND (
  (OLD.grain, OLD.bucket_start, OLD.task_id, OLD.route_id, OLD.region_id)
    IS DISTINCT FROM (NEW.grain, NEW.bucket_start, NEW.task_id, NEW.route_id, NEW.region_id)
  OR OLD.ttft_pcts IS DISTINCT FROM NEW.ttft_pcts
  OR OLD.e2e_pcts IS DISTINCT FROM NEW.e2e_pcts
  OR OLD.tps_pcts IS DISTINCT FROM NEW.tps_pcts
  OR (OLD.ttfat_hist IS DISTINCT FROM NEW.ttfat_hist
      AND rw_pairs_pcts(OLD.ttfat_hist, 1.0) IS DISTINCT FROM rw_pairs_pcts(NEW.ttfat_hist, 1.0))
)) EXECUTE FUNCTION rw_hour_strip_write();
"""

BACKWARD = """
DROP TRIGGER IF EXISTS rw_hour_strip_update ON monitor_rollup;
DROP TRIGGER IF EXISTS rw_hour_strip_write ON monitor_rollup;
CREATE TRIGGER rw_hour_strip_write AFTER INSERT OR UPDATE ON monitor_rollup
FOR EACH ROW WHEN (NEW.grain = 'hour') EXECUTE FUNCTION rw_hour_strip_write();
"""


class Migration(migrations.Migration):
    dependencies = [("monitor", "0032_alert_onset")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
