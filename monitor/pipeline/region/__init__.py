"""The region worker's side of the pipeline (monitor.pipeline): messages in, probes, races and
scenarios run, results out; no database."""
