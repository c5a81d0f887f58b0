"""A result payload as a ProbeResult row that fits its columns (ingest.results writes it).

Values of the right type but outside their column's range are made to fit (`_fit`): integers
clamped or nulled, NaN and infinities nulled, text cut. A value no column can take (a string
for a number, an unparseable time) makes the payload a BadPayload, named by field and reason,
never by value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any

from django.db import (
    connection,
    models,
)

from monitor.models import (
    ProbeResult,
    Route,
)

TEXT_LIMIT = 4000


DETAIL_LIMIT = 500


# PostgreSQL `integer`: the range of the count columns (PositiveIntegerField and IntegerField).
INT_MAX = 2**31 - 1


_FIELDS: list[models.Field[Any, Any]] = [
    f for f in ProbeResult._meta.concrete_fields if f.name != "id"
]


COLUMNS = [f.column for f in _FIELDS]


# Each column's value when a payload leaves it out: the model's default ("" for text without
# one), except callable defaults (started_at's now(), set per batch instead).
_DEFAULTS: dict[str, Any] = {
    f.attname: (None if f.has_default() and callable(f.default) else f.get_default())
    for f in _FIELDS
}


# Longer text is cut to these (the answer is kept for grading and the probe log, not whole).
_TEXT_LIMITS = {"text": TEXT_LIMIT, "error_detail": DETAIL_LIMIT}


class BadPayload(ValueError):
    """A result payload that cannot be stored (named field, reason; never the value)."""


@dataclass(frozen=True)
class _Column:
    """What a ProbeResult column accepts, read off the model once."""

    attname: str
    kind: str  # "int", "float", "decimal", "bool", "text", "datetime"
    null: bool
    low: int = 0  # integers: the column's range
    high: int = 0
    foreign_key: bool = False
    max_length: int | None = None  # text
    decimal_max: Decimal = Decimal(0)  # decimals: the first magnitude that does not fit


_KINDS = {
    "FloatField": "float",
    "BooleanField": "bool",
    "CharField": "text",
    "TextField": "text",
    "DateTimeField": "datetime",
}


@cache
def _columns() -> dict[str, _Column]:
    # Built on first use, not at import: a region worker imports this module (through
    # monitor.tasks) without any database configured.
    ranges = connection.ops.integer_field_range
    out = {}
    for f in _FIELDS:
        internal = f.get_internal_type()
        if isinstance(f, models.ForeignKey):
            low, high = ranges(f.target_field.get_internal_type())
            out[f.attname] = _Column(f.attname, "int", f.null, low, high, foreign_key=True)
        elif internal.endswith("IntegerField"):
            low, high = ranges(internal)
            out[f.attname] = _Column(f.attname, "int", f.null, low, high)
        elif isinstance(f, models.DecimalField):
            top = Decimal(10) ** (f.max_digits - f.decimal_places)
            out[f.attname] = _Column(f.attname, "decimal", f.null, decimal_max=top)
        elif internal in _KINDS:
            limit = _TEXT_LIMITS.get(f.attname, f.max_length)
            out[f.attname] = _Column(f.attname, _KINDS[internal], f.null, max_length=limit)
        else:  # a column type this module does not know how to check: refuse to guess
            raise TypeError(f"ingest: no check for {f.attname} ({internal})")
    return out


def _bounded(value: str, limit: int | None) -> str:
    text = value.replace("\x00", "")  # PostgreSQL text cannot hold NUL
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 1] + "…"


def _fit(column: _Column, value: Any) -> Any:
    """The value as its column can store it; BadPayload when its type is wrong.

    Integers outside the column's range (PostgreSQL `integer` for counts and rate-limit
    headers, `bigint` for ids): above it, clamped to the top (the reading was at least that:
    2**40 tokens of headroom stays "more than we can count"); below it, null (a negative
    count is no reading; 0 would claim one, and cached_tokens 0 means "reported, no hit").
    An id out of range is refused. Floats: NaN and infinities are null. Decimals that do not
    fit are null (cost is then worked out from the route's prices). Text is cut."""
    if value is None:
        return None
    kind = column.kind
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadPayload(f"{column.attname}: expected an integer, got {type(value).__name__}")
        if column.low <= value <= column.high:
            return value
        if column.foreign_key:
            raise BadPayload(f"{column.attname}: out of range")
        return column.high if value > column.high else None
    if kind == "float":
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise BadPayload(f"{column.attname}: expected a number, got {type(value).__name__}")
        return float(value) if math.isfinite(value) else None
    if kind == "decimal":
        if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
            raise BadPayload(f"{column.attname}: expected a number, got {type(value).__name__}")
        try:
            number = Decimal(str(value))
        except InvalidOperation:
            raise BadPayload(f"{column.attname}: not a number") from None
        return number if number.is_finite() and abs(number) < column.decimal_max else None
    if kind == "bool":
        if not isinstance(value, bool):
            raise BadPayload(
                f"{column.attname}: expected true or false, got {type(value).__name__}"
            )
        return value
    if kind == "text":
        if not isinstance(value, str):
            raise BadPayload(f"{column.attname}: expected a string, got {type(value).__name__}")
        return _bounded(value, column.max_length)
    # datetime
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise BadPayload(f"{column.attname}: expected a time, got {type(value).__name__}")
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise BadPayload(f"{column.attname}: not an ISO 8601 time") from None


def row_from_payload(
    payload: Mapping[str, Any], prices: Mapping[int, Route], now: datetime
) -> tuple[Any, ...]:
    """The row for one result, every value fitted to its column (see `_fit`). Keys that are not
    columns are ignored; a column the payload leaves out (or nulls, when the column cannot be
    null) gets the column's default."""
    columns = _columns()
    values = dict(_DEFAULTS)
    values["started_at"] = now
    for name, value in payload.items():
        column = columns.get(name)
        if column is None:
            continue
        fitted = _fit(column, value)
        if fitted is not None or column.null:
            values[name] = fitted
    if values["route_id"] is None or values["region_id"] is None:
        raise BadPayload("route_id and region_id are required")
    # Cost is ours to work out, from the tokens and the route's prices: a worker's figure is
    # never trusted (it could hide spend from the cap).
    route = prices.get(values["route_id"])
    values["cost_usd"] = (
        _fit(
            columns["cost_usd"],
            route.cost_usd(
                values["input_tokens"] or 0, values["output_tokens"] or 0, values["cached_tokens"]
            ),
        )
        if route is not None
        else None
    )
    return tuple(values[f.attname] for f in _FIELDS)
