"""The route page's probe-option comparisons (HTTP version, connection, request body, prompt
prefix, served model, service tier: each side by side where the probes took it more than one
way) and its reasoning figures, over the window's newest raw rows
(monitor.pages.route.comparison_rows)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monitor.models import BODY_MSGPACK_GZIP, OUTCOME_OK
from monitor.stats import hist
from monitor.stats.confidence import Estimate, percentile


@dataclass
class OptionGroup:
    value: str
    probes: int
    ok: int
    ttft_p50: Estimate  # each with its 95% interval (monitor.stats.confidence)
    ttft_p95: Estimate
    e2e_p50: Estimate
    e2e_p95: Estimate
    upload_p50_ms: float | None
    setup_p50_ms: float | None  # dns + connect + tls, where there was any
    mean_request_bytes: float | None

    @property
    def ttft_p50_ms(self) -> float | None:
        return self.ttft_p50.point

    @property
    def e2e_p50_ms(self) -> float | None:
        return self.e2e_p50.point


@dataclass
class Comparison:
    dimension: str
    groups: list[OptionGroup]


def _connection(r: Any) -> str:
    reused = r.connection_reused
    if reused is None:  # rows from before reuse was recorded: what was asked
        return "cold (asked)" if r.cold else "warm (asked)"
    return "reused connection" if reused else "new connection"


# Grouped by what happened (the negotiated version, whether the connection was really reused,
# what the provider says served the probe), not by what was asked: a provider that ignores
# an HTTP/2 offer or a pool that had to reconnect shows as such. Rows: see
# monitor.pages.route._newest.
_DIMENSIONS: tuple[tuple[str, Callable[[Any], str]], ...] = (
    ("HTTP version (negotiated)", lambda r: r.http_version or "not negotiated"),
    ("connection", _connection),
    (
        "request body",
        lambda r: "msgpack + gzip" if r.body_encoding == BODY_MSGPACK_GZIP else "JSON",
    ),
    ("prompt prefix", lambda r: r.prefix_mode),
    ("served model", lambda r: r.served_model or "not reported"),
    ("service tier", lambda r: r.service_tier or "not reported"),
)


def _p50(values: list[float]) -> float | None:
    return hist.percentile(hist.build(values, hist.MS), 50, hist.MS) if values else None


def _median(values: list[int]) -> float | None:
    return float(statistics.median(values)) if values else None


@dataclass
class Reasoning:
    """Reasoning the provider reported over the comparison rows: shown apart from speed."""

    probes: int  # ok probes that reported reasoning tokens
    reasoning_tokens_p50: float | None
    hidden_tokens_p50: float | None  # billed but never streamed
    ttft_p50_ms: float | None  # first output of any kind (a reasoning token, when streamed)
    ttfat_p50_ms: float | None  # first answer token
    speed_counted: list[str]  # how speed's tokens were counted, for these probes


def reasoning(rows: list[Any]) -> Reasoning | None:
    ok = [r for r in rows if r.outcome == OUTCOME_OK and r.reasoning_tokens]
    if not ok:
        return None
    return Reasoning(
        probes=len(ok),
        reasoning_tokens_p50=_median([r.reasoning_tokens for r in ok]),
        hidden_tokens_p50=_median(
            [r.hidden_reasoning_tokens for r in ok if r.hidden_reasoning_tokens is not None]
        ),
        ttft_p50_ms=_p50([r.ttft_ms for r in ok if r.ttft_ms is not None]),
        ttfat_p50_ms=_p50([r.ttfat_ms for r in ok if r.ttfat_ms is not None]),
        speed_counted=sorted({r.tps_token_source for r in ok if r.tps_token_source}),
    )


def _bucket(value: float | None) -> int | None:
    """A value's histogram bucket (monitor.stats.hist.MS), None where hist.build skips it."""
    if value is None or not math.isfinite(value):
        return None
    return hist.MS.index(value)


@dataclass(slots=True)
class _Facts:
    """What the comparisons need of one raw row, worked out once (not once per dimension)."""

    ok: bool
    ttft: int | None  # buckets, of successful probes only
    e2e: int | None
    upload: int | None
    setup: int | None  # dns + connect + tls, where a connection was made
    request_bytes: int | None


def _facts(r: Any) -> _Facts:
    ok = r.outcome == OUTCOME_OK
    setup = None
    if ok and r.connect_ms is not None:
        setup = _bucket((r.dns_ms or 0) + r.connect_ms + (r.tls_ms or 0))
    return _Facts(
        ok=ok,
        ttft=_bucket(r.ttft_ms) if ok else None,
        e2e=_bucket(r.e2e_ms) if ok else None,
        upload=_bucket(r.upload_ms) if ok else None,
        setup=setup,
        request_bytes=r.request_bytes,
    )


def _histogram(buckets: list[int | None]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for b in buckets:
        if b is not None:
            counts[b] = counts.get(b, 0) + 1
    return counts


def _group(value: str, members: list[_Facts]) -> OptionGroup:
    ttft = _histogram([m.ttft for m in members])
    e2e = _histogram([m.e2e for m in members])
    sizes = [m.request_bytes for m in members if m.request_bytes is not None]
    return OptionGroup(
        value=value,
        probes=len(members),
        ok=sum(m.ok for m in members),
        ttft_p50=percentile(ttft, 50),
        ttft_p95=percentile(ttft, 95),
        e2e_p50=percentile(e2e, 50),
        e2e_p95=percentile(e2e, 95),
        upload_p50_ms=percentile(_histogram([m.upload for m in members]), 50).point,
        setup_p50_ms=percentile(_histogram([m.setup for m in members]), 50).point,
        mean_request_bytes=sum(sizes) / len(sizes) if sizes else None,
    )


def comparisons(rows: list[Any]) -> list[Comparison]:
    """Side by side, for each dimension the rows took more than one way (each row's facts
    worked out only when some dimension splits them)."""
    split = []
    for dimension, key in _DIMENSIONS:
        keys = list(map(key, rows))
        if len(set(keys)) >= 2:
            split.append((dimension, keys))
    if not split:
        return []
    facts = [_facts(r) for r in rows]
    out = []
    for dimension, keys in split:
        groups: dict[str, list[_Facts]] = defaultdict(list)
        for k, f in zip(keys, facts, strict=True):
            groups[k].append(f)
        stats = [_group(value, members) for value, members in sorted(groups.items())]
        out.append(Comparison(dimension=dimension, groups=stats))
    return out
