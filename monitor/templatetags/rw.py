"""Number formatting shared by every page: one unit style everywhere."""

from __future__ import annotations

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
def tps(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f} tok/s"


@register.filter
def pct(value: float | None) -> str:
    return DASH if value is None else f"{value * 100:.0f}%"
