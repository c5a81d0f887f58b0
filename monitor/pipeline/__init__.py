"""From a schedule to stored results, laid out by process: beat -> region worker -> ingest.

One principle throughout: a module lives in the package of the process that runs it, and
probes, races and scenarios stand side by side in each. A reader follows one slot down the
tree the way it travels, and each process's package is what that process imports (a region
worker has no database: nothing in `region/` writes one; nothing in `beat/` runs a probe).
By feature would have put each kind of work's three processes in one place, but the
processes are what differ in deployment (where they run, what they may reach, how they fail),
and the three kinds of work share each process's machinery (slots, the event loop, the rows).

- `beat/`: what is due and claimed once, and the message for it (`slots.py` the slot
  arithmetic; `scheduling.py` probes and the tick's plan; `races.py`, `scenarios.py`).
- `region/`: the region worker (`worker.py` probes and races, `scenarios.py`), its spool,
  replay record, clock and liveness beacon.
- `ingest/`: storing results (`results.py` probes and missed slots, `rows.py` a payload as a
  row, `races.py`, `scenarios.py`), retention, the optional OTLP export.
- Here, between the processes: `messages.py` (the typed wire contract), `signing.py` (the
  envelopes) and `queues.py` (what waits in the broker, dead letters).

`monitor/tasks.py` wires them to Celery: the one module that enqueues.
"""
