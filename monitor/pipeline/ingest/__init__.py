"""Ingest's side of the pipeline (monitor.pipeline): results stored once per slot, races and
scenarios filled in, rollups folded, missed slots recorded, old rows retired."""
