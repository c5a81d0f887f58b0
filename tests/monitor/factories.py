"""Small builders for configuration rows and probe-result payloads used by several tests."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from monitor.models import Provider, Region, RegionKey, Route, Task


def provider(slug: str = "acme", **kw: Any) -> Provider:
    defaults: dict[str, Any] = {
        "name": slug.title(),
        "base_url": f"http://127.0.0.1:9/{slug}/v1",
        "wire_format": "openai",
    }
    defaults.update(kw)
    p = Provider(slug=slug, **defaults)
    p.set_api_key(f"sk-{slug}-secret-0123456789")
    p.save()
    return p


def route(p: Provider, model: str, **kw: Any) -> Route:
    kw.setdefault("price_input_per_mtok", Decimal("1.00"))
    kw.setdefault("price_output_per_mtok", Decimal("2.00"))
    return Route.objects.create(provider=p, model_id=model, **kw)


def region(slug: str) -> Region:
    """A region with one active key (monitor.pipeline.signing): the beat can send to it."""
    g = Region.objects.create(name=slug.upper(), slug=slug)
    RegionKey.issue(g)
    return g


def task(slug: str, routes: list[Route], regions: list[Region], **kw: Any) -> Task:
    kw.setdefault("user_template", "Q: {input}")
    kw.setdefault("probe_interval_s", 60)
    # The tests here were written for e2e p50; latency-class defaults have tests of their own.
    kw.setdefault("latency_metric", "e2e_p50")
    kw.setdefault("min_graded", 10)
    t = Task.objects.create(name=slug.title(), slug=slug, **kw)
    t.routes.set(routes)
    t.regions.set(regions)
    return t


def payload(
    t: Task,
    r: Route,
    g: Region,
    at: datetime,
    *,
    slot: bool = True,
    ttft_ms: float = 500.0,
    ttfat_ms: float | None = None,
    e2e_ms: float = 2000.0,
    tps: float = 100.0,
    outcome: str = "ok",
    error_kind: str = "",
    quality_pass: bool | None = None,
    cached_tokens: int | None = None,
) -> dict[str, Any]:
    return {
        "task_id": t.pk,
        "route_id": r.pk,
        "region_id": g.pk,
        "slot_at": at.isoformat() if slot else None,
        "started_at": at.isoformat(),
        "ttft_ms": ttft_ms if outcome == "ok" else None,
        "ttfat_ms": ttfat_ms if outcome == "ok" else None,
        "e2e_ms": e2e_ms if outcome == "ok" else None,
        "tps": tps if outcome == "ok" else None,
        "outcome": outcome,
        "error_kind": error_kind,
        "quality_pass": quality_pass,
        "input_tokens": 1000,
        "output_tokens": 200,
        "cached_tokens": cached_tokens,
        "http_version": "HTTP/1.1",
    }
