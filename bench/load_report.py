"""What a bench-load run measured on and what it measured (bench/bench_load.py), and its
report: each figure against its target, in the order the bench's docstring lists them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.load_pages import Pages


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


@dataclass
class Setup:
    """What preparing the run made: the bench's database, broker and world, one key per region."""

    mix: Any
    env: dict[str, str]
    tmp: Path
    sim_port: int
    world: Any
    routes: int
    keys: dict[str, str]
    region_args: list[str]
    alternate: tuple[int, ...]


@dataclass
class Window:
    """What the measured window gave: the slots, the stored results and the processes' costs."""

    start: datetime
    end: datetime
    wall: float
    cpu: dict[str, float]
    rss: dict[str, float]
    counts: dict[str, int]
    swept: int
    lags: list[float]
    written: int
    outcomes: list[Any]
    failures: list[Any]  # (model, error kind, connected, count, connect_ms p50)
    measured: tuple[list[float], list[float]]
    lag_known: bool
    start_lags: list[float]
    late: int
    unsent: int
    other_missed: int
    flight: list[int]
    by_nice: dict[int, tuple[list[float], list[float]]]
    durations: dict[str, list[float]]
    skipped: dict[str, int]


def report(
    ns: argparse.Namespace,
    setup: Setup,
    w: Window,
    idle: Pages,
    pages: Pages,
    urls: list[tuple[str, str]],
) -> None:
    """Each figure against its target, in the order the module's docstring lists them."""
    _report_slots(ns, setup, w)
    _report_probes(ns, setup, w)
    _report_pages(idle, pages, urls)
    if setup.alternate:
        _report_alternation(ns, setup.alternate, w, pages, urls)
    _report_reads(pages, urls)
    with contextlib.suppress(Exception):
        print(f"  machine load after: {os.getloadavg()}")


def _report_slots(ns: argparse.Namespace, setup: Setup, w: Window) -> None:
    combos, counts = setup.world.combinations, w.counts
    expected = combos * ns.measure / ns.interval
    print(
        f"\nwindow {ns.measure} s ({w.start:%H:%M:%S}-{w.end:%H:%M:%S} UTC), ~{expected:,.0f} slots due"
    )
    # Slots the tick never created in the window (it fell behind) count as missed too.
    absent = max(0, round(expected) - sum(counts.values()))
    missed_ok = counts["missed"] == 0 and counts["dispatched"] == 0 and absent <= expected / 100
    print(
        f"  slots: {counts['done']:,} done, {counts['missed']:,} missed, {counts['dispatched']:,} "
        f"still open{f' (swept {w.swept})' if w.swept else ''}, ~{absent:,} never created  "
        f"{'ok' if missed_ok else 'MISSES TARGET'} (0 missed)"
    )
    print(
        f"  missed results: {w.late:,} started late (a worker did not run them), {w.unsent:,} not "
        f"sent (the tick created them too late), {w.other_missed:,} no result by the deadline"
    )
    if w.lag_known:
        start_lags = w.start_lags
        start_p99_s = _p(start_lags, 0.99) / 1000
        print(
            f"  start lag: p50 {_p(start_lags, 0.5):.0f} ms, p99 {start_p99_s * 1000:.0f} ms, max "
            f"{max(start_lags, default=float('nan')):.0f} ms over {len(start_lags):,} probes  "
            f"{'ok' if start_p99_s <= 1 else 'MISSES TARGET'} (p99 <= 1 s)"
        )
    else:
        print("  start lag: not recorded by this version (no start_lag_ms column)")
    shown = ", ".join(f"{o}/{k or '-'} {n}" for o, k, n in w.outcomes)
    print(f"  outcomes of the window's rows: {shown}")
    for model, kind, connected, n, connect_ms in w.failures:
        how = f"connected (connect p50 {connect_ms:.0f} ms)" if connected else "never connected"
        print(f"    failed: {model} {kind} {n}, {how}")


def _report_probes(ns: argparse.Namespace, setup: Setup, w: Window) -> None:
    from bench import probe_stats

    slugs, cpu, rss, flight = setup.world.regions, w.cpu, w.rss, w.flight
    mean_flight = probe_stats.mean(flight)
    per_k = mean_flight / 1000 or float("nan")  # none in flight: no per-1,000 figure
    print(
        f"  probes in flight (every 5 s): mean {mean_flight:,.0f}, max {max(flight, default=0):,}; "
        f"region workers per 1,000 in flight: {cpu['region workers'] / per_k:.2f} cores, "
        f"{rss['region workers'] / per_k:,.0f} MiB RSS ({len(slugs)} processes, "
        f"{rss['region workers'] / len(slugs):,.0f} MiB each)"
    )
    ttfts, e2es = w.measured
    print(
        f"  measured: TTFT p50 {_p(ttfts, 0.5):.0f} ms, p99 {_p(ttfts, 0.99):.0f} ms; e2e p50 "
        f"{_p(e2es, 0.5):.0f} ms, p99 {_p(e2es, 0.99):.0f} ms (compare runs at another "
        "--worker-nice)"
    )
    lags = w.lags
    lag_p99 = _p(lags, 0.99)
    print(
        f"  ingest lag: p50 {_p(lags, 0.5):.2f} s, p99 {lag_p99:.2f} s, max "
        f"{max(lags) if lags else float('nan'):.2f} s over {len(lags):,} successful probes (scenario "
        "calls left out)  "
        f"{'ok' if lag_p99 < 5 else 'MISSES TARGET'} (p99 < 5 s)"
    )
    for task_name in (
        "monitor.tasks.tick",
        "monitor.tasks.ingest_results",
        "monitor.tasks.refresh_overview",
    ):
        d = w.durations.get(task_name, [])
        print(
            f"  {task_name.split('.')[-1]:16} duration p50 {_p(d, 0.5) * 1000:7.0f} ms, "
            f"p99 {_p(d, 0.99) * 1000:7.0f} ms ({len(d)} runs"
            + (f"; {w.skipped[task_name]} skipped, not due" if task_name in w.skipped else "")
            + ")"
        )
    combos = setup.world.combinations
    print(f"  rows written: {w.written / w.wall:,.1f} /s (due: {combos / ns.interval:,.1f} /s)")
    # CPU seconds per 1,000 results written: the cost per probe, comparable across runs whose
    # machines let them write more or fewer results.
    per_k_rows = 1000 * w.wall / w.written if w.written else float("nan")
    print(f"  {'component':18} {'CPU (cores)':>11} {'s/1k results':>12} {'RSS (MiB)':>10}")
    for name in cpu:
        print(f"  {name:18} {cpu[name]:11.2f} {cpu[name] * per_k_rows:12.2f} {rss[name]:10.0f}")


def _report_pages(idle: Pages, pages: Pages, urls: list[tuple[str, str]]) -> None:
    print(
        f"  {'page':14} {'idle p95':>9} {'load p50':>9} {'load p95':>9} {'load/idle':>9}"
        f"  {'queries':>7} {'SQL p50':>8} {'SQL p95':>8} {'CPU p50':>8} {'CPU p95':>8} {'idle CPU':>8}"
    )
    worst = 0.0
    for name, _url in urls:
        base = idle.times.get(name, [])
        during = pages.times.get(name, [])
        p95 = _p(during, 0.95)
        worst = max(worst, p95)
        sql = pages.sql.get(name, [])
        own = pages.cpu.get(name, [])
        print(
            f"  {name:14} {_p(base, 0.95):7.1f}ms {_p(during, 0.5):7.1f}ms {p95:7.1f}ms "
            f"{p95 / _p(base, 0.95):8.1f}x  {pages.queries.get(name, 0):7} "
            f"{_p(sql, 0.5):6.1f}ms {_p(sql, 0.95):6.1f}ms {_p(own, 0.5):6.1f}ms "
            f"{_p(own, 0.95):6.1f}ms {_p(idle.cpu.get(name, []), 0.5):6.1f}ms  ({len(during)} reads)"
        )
    print(
        f"  pages: worst p95 {worst:.1f} ms  {'ok' if worst < 100 else 'MISSES TARGET'} (< 100 ms); {pages.failed} failed reads"
    )


def _report_alternation(
    ns: argparse.Namespace,
    alternate: tuple[int, ...],
    w: Window,
    pages: Pages,
    urls: list[tuple[str, str]],
) -> None:
    a, b = alternate
    print(
        f"  workers' nice alternated {a} and {b} every {ns.phase} s (same run): page p95 "
        f"at {a} / at {b}, then probes' TTFT and e2e p50/p99 by the phase they started in"
    )
    for name, _url in urls:
        got = pages.by_phase.get(name, {})
        at_a, at_b = got.get(a, []), got.get(b, [])
        print(
            f"  {name:14} {_p(at_a, 0.95):7.1f}ms / {_p(at_b, 0.95):7.1f}ms  "
            f"({len(at_a)} / {len(at_b)} reads)"
        )
    for nice in alternate:
        ttfts, e2es = w.by_nice.get(nice, ([], []))
        print(
            f"  probes at nice {nice:2}: TTFT {_p(ttfts, 0.5):.0f}/{_p(ttfts, 0.99):.0f} ms, "
            f"e2e {_p(e2es, 0.5):.0f}/{_p(e2es, 0.99):.0f} ms ({len(ttfts):,} probes)"
        )


def _report_reads(pages: Pages, urls: list[tuple[str, str]]) -> None:
    print(
        "  where a read's time went under load, p50 / p95 (ms): the reader's CPU, its wait for a"
        " CPU, its PostgreSQL backend's CPU and wait for a CPU"
    )
    for name, _url in urls:
        parts = (pages.cpu, pages.wait, pages.pg_cpu, pages.pg_wait)
        shown = "  ".join(
            f"{_p(part.get(name, []), 0.5):5.1f}/{_p(part.get(name, []), 0.95):5.1f}"
            for part in parts
        )
        print(f"  {name:14} {shown}")
    print("  each page's slowest queries under load, p50 / p95 (#n: its place in the page)")
    for name, _url in urls:
        found = pages.per_query.get(name, {})
        top = sorted(found.items(), key=lambda kv: -_p(kv[1], 0.95))[:3]
        shown = ", ".join(f"{label} {_p(v, 0.5):.1f}/{_p(v, 0.95):.1f}" for label, v in top)
        print(f"  {name:14} {shown}")
