"""The route page's split of e2e into the provider's own time and the path's, per region.

Where a provider reports its own time for a request (ProbeResult.server_ms: Bedrock's
metrics.latencyMs for the whole request, an openai-processing-ms header up to the headers), the
rest of a probe's e2e was the path's: network, TLS, proxies, queues between us and the
provider. Medians over the route's comparison rows (monitor.pages.route), each region apart:
the same provider seen from two regions differs by its path, not its own time."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from monitor.models import OUTCOME_OK, Region


@dataclass
class ServerShare:
    region: Region
    probes: int  # ok probes whose provider reported its own time
    e2e_p50_ms: float
    server_p50_ms: float
    path_p50_ms: float  # the median of each probe's e2e minus its server time

    @property
    def server_share(self) -> float:
        """The provider's own share of the median e2e (0..1)."""
        return min(1.0, self.server_p50_ms / self.e2e_p50_ms) if self.e2e_p50_ms > 0 else 0.0


def server_time(rows: list[Any], regions: list[Region]) -> list[ServerShare]:
    """Per region, for the rows that report a server time; regions without any are left out
    (the provider reports none, or the region has no such probes in the window)."""
    by_region: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        if r.outcome == OUTCOME_OK and r.server_ms is not None and r.e2e_ms is not None:
            by_region.setdefault(r.region_id, []).append((r.e2e_ms, r.server_ms))
    out = []
    for region in regions:
        pairs = by_region.get(region.pk)
        if not pairs:
            continue
        out.append(
            ServerShare(
                region=region,
                probes=len(pairs),
                e2e_p50_ms=statistics.median(e for e, _ in pairs),
                server_p50_ms=statistics.median(s for _, s in pairs),
                path_p50_ms=statistics.median(max(0.0, e - s) for e, s in pairs),
            )
        )
    return out
