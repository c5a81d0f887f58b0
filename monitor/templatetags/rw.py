"""Number formatting shared by every page: one unit style everywhere."""

from __future__ import annotations

import time

from django import template

register = template.Library()
DASH = "—"


@register.filter
def ms(value: float | None) -> str:
    """840 ms, 1.62 s, 13 min 54 s."""
    if value is None:
        return DASH
    if value < 1000:
        return f"{value:.0f} ms"
    seconds = value / 1000
    if seconds < 60:
        return f"{seconds:.2f} s" if seconds < 10 else f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


@register.filter
def unix_ago(value: float | None) -> str:
    """A Unix time (a worker's beacon) as how long ago, by this server's clock."""
    if value is None:
        return ""
    s = max(0, int(time.time() - float(value)))
    return f"{s} s ago" if s < 120 else (f"{s // 60} min ago" if s < 7200 else f"{s // 3600} h ago")


@register.filter
def tps(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f} tok/s"


@register.filter
def pct(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:.0f}%"


def _end(value: float | None, unit: str) -> str:
    if value is None:
        return "?"
    return ms(value) if unit == "ms" else pct(value)


@register.simple_tag
def interval(low: float | None, high: float | None, unit: str = "ms") -> str:
    """A 95% interval, "(1.05 s to 1.41 s)" with an en dash; an end the samples cannot give shows as "?"
    (monitor.stats.confidence)."""
    if low is None and high is None:
        return ""
    return f"({_end(low, unit)}\u2013{_end(high, unit)})"


@register.simple_tag
def errors(k: int, n: int) -> str:
    """The provider's failures out of its attempts: "2.1% (3 of 140)"."""
    if not n:
        return DASH
    rate = k / n * 100
    shown = f"{rate:.1f}%" if 0 < rate < 10 else f"{rate:.0f}%"
    return f"{shown} ({k} of {n})"
