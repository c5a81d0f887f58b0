"""The web process's heap policy for Python's cyclic collector (monitor.wsgi applies it once the
application is loaded; bench-load's page reader applies it as a web worker would).

- What is loaded by then (modules, functions, classes, settings, the templates: ~150,000
  objects) lives as long as the process: frozen out of the collector's full passes, which
  otherwise walk all of it in the middle of a request (a full pass over the unfrozen heap of
  a process that read every page took 140 ms CPU; regions page reads of 119 and 131 ms with
  one, against 43 at the median). Collected first: garbage frozen would never be freed.
- A young collection every YOUNG_THRESHOLD net allocations of tracked objects instead of
  CPython's 700. A page read makes tens of thousands (route 7 d: its hours' histograms, rows,
  template contexts); at 700, those still alive two young passes later were promoted to the
  old generation mid-read, and with the frozen heap left out, a few thousand promoted was
  enough to start a full pass in the middle of a read (53 ms each, 4 in 80 route 7 d reads on
  2026-11-28). A young pass costs more the more objects it holds, so the threshold is a
  middle: 200 reads on the 30-day set (2026-11-28 20:10) spent in the collector, at 700 /
  3,000 / 7,000 / 20,000: route 7 d 587 / 265 / 50 / 53 ms (its longest pause 31 / 25 / 8 /
  19 ms), the API's route list 310 / 186 / 168 / 204 ms (young passes of 20,000 took 10-14 ms
  each, a read's whole time). Memory: at most that many young objects waiting for a pass.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 7_000


def settle() -> None:
    """Freeze what is loaded now and set the collector's thresholds (see the module)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
