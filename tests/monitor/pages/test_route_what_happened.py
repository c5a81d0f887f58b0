"""The route page tells what happened, not what was asked: comparisons grouped by the
negotiated HTTP version, real connection reuse, the served model and tier; hidden reasoning
shown apart from speed; options the provider cannot take named as not sent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from monitor.models import ProbeResult
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f


def _table(body: str, dimension: str) -> str:
    return body[body.index(f'data-dimension="{dimension}"') :].split("</table>")[0]


def test_comparisons_group_by_what_happened_and_reasoning_stands_apart(
    client: Client, teammate: User, db: None
) -> None:
    p = f.provider("gateway", http2=True)
    r = f.route(p, "gpt-5.5", token_limit_param="max_completion_tokens")
    g = f.region("eu-west")
    t = f.task("qa", [r], [g], http_versions=["1.1", "2"], connection_modes=["warm", "cold"])
    now = timezone.now()
    payloads: list[dict[str, Any]] = []
    for i in range(12):
        payload = f.payload(t, r, g, now - timedelta(seconds=10 * i + 5), ttft_ms=900.0)
        # The task asked for HTTP/2 on every other probe, but the gateway always answered
        # HTTP/1.1: the page must show one negotiated version, not two asked-for ones.
        payload.update(
            http2=i % 2 == 0,
            http_version="HTTP/1.1",
            cold=i % 3 == 0,
            connection_reused=i % 3 != 0 and i != 1,  # one warm probe had to reconnect
            # An aggregator switched the model behind the route for a third of the probes.
            served_model="gpt-5.5-2026-08-01" if i % 3 else "gpt-5.5-mini-2026-08-01",
            service_tier="default",
            reasoning_tokens=2000,
            hidden_reasoning_tokens=2000,
            ttfat_ms=900.0,
            tps=99.0,
            tps_token_source="usage-minus-hidden-reasoning",
        )
        payloads.append(payload)
    assert ingest.ingest(payloads) == 12
    client.force_login(teammate)
    response = client.get(reverse("rw-route", args=[r.pk]), {"task": "qa"})
    body = response.content.decode()
    assert 'data-dimension="HTTP version (negotiated)"' not in body  # one way only
    connection = _table(body, "connection")
    assert '>new connection</th><td class="num">5</td>' in connection
    assert '>reused connection</th><td class="num">7</td>' in connection
    served = _table(body, "served model")
    assert '>gpt-5.5-2026-08-01</th><td class="num">8</td>' in served
    assert '>gpt-5.5-mini-2026-08-01</th><td class="num">4</td>' in served
    reasoning = body[body.index('class="card reasoning"') :].split("</div>")[0]
    assert "12 ok probes that reported it" in reasoning
    assert "Of which hidden (billed, never streamed), p50</dt><dd>2,000" in reasoning
    assert "usage-minus-hidden-reasoning" in reasoning
    # No option this task asks for is refused by the provider.
    assert "Not sent to this route" not in body


def test_the_page_names_options_the_provider_cannot_take(
    client: Client, teammate: User, db: None
) -> None:
    p = f.provider("plain")  # neither HTTP/2 nor msgpack
    r = f.route(p, "chat")
    g = f.region("eu-west")
    f.task("qa", [r], [g], http_versions=["1.1", "2"], body_encodings=["json", "msgpack-gzip"])
    client.force_login(teammate)
    body = client.get(reverse("rw-route", args=[r.pk]), {"task": "qa"}).content.decode()
    assert "Not sent to this route: HTTP/2: Plain is not set to support it" in body
    assert "msgpack + gzip bodies: Plain does not accept them" in body
    assert 'class="card reasoning"' not in body  # nothing reasoned


def test_comparison_rows_read_the_newest_part_of_the_window_and_all_of_it_when_needed(
    db: None, monkeypatch: Any
) -> None:
    """The newest COMPARISON_ROWS probes, whether the window's probes are spread evenly (the
    newest part holds them) or bunched at its start (the whole window is read)."""
    from monitor.pages import route as pages_route

    monkeypatch.setattr(pages_route, "COMPARISON_ROWS", 20)
    p = f.provider("gateway")
    r = f.route(p, "chat")
    g = f.region("eu-west")
    t = f.task("qa", [r], [g])
    now = timezone.now()
    since = now - timedelta(hours=24)
    # 96 probes spread over the day, one every 15 minutes.
    even = [f.payload(t, r, g, now - timedelta(minutes=15 * i + 1)) for i in range(96)]
    assert ingest.ingest(even) == 96
    newest = [row.id for row in pages_route._newest(r, t, None, since)]
    assert len(newest) == 20
    rows = pages_route.comparison_rows(r, t, None, since, now, 96)
    assert [row.id for row in rows] == newest

    # Another task's probes, bunched: 90 in the window's first hours, 5 recent ones.
    t2 = f.task("bunched", [r], [g])
    old = [f.payload(t2, r, g, since + timedelta(minutes=2 * i + 1)) for i in range(90)]
    recent = [f.payload(t2, r, g, now - timedelta(minutes=i + 1)) for i in range(5)]
    assert ingest.ingest(old + recent) == 95
    rows = pages_route.comparison_rows(r, t2, None, since, now, 95)
    expected = [row.id for row in pages_route._newest(r, t2, None, since)]
    assert len(rows) == 20
    assert [row.id for row in rows] == expected
    assert sum(row.at > (now - timedelta(hours=1)).timestamp() for row in rows) == 5


def test_the_probe_logs_newest_page_comes_from_one_read_of_the_newest_seconds(db: None) -> None:
    """On a busy deployment the log's first page is one short read. Its first slice of time
    once began at now and ended a minute ahead (empty but for clock skew), so every read went
    on to sort the four minutes before now. Results stamped a little ahead of our clock still
    come first; the next page goes on where this one ends."""
    from monitor.pages import log

    p = f.provider("gateway")
    r = f.route(p, "chat")
    g = f.region("eu-west")
    t = f.task("qa", [r], [g])
    now = timezone.now()
    # 60 results over the last 6 seconds, one 20 s ahead of our clock, 30 from 10 min ago.
    recent = [f.payload(t, r, g, now - timedelta(milliseconds=100 * i + 50)) for i in range(60)]
    ahead = f.payload(t, r, g, now + timedelta(seconds=20))
    older = [f.payload(t, r, g, now - timedelta(minutes=10, seconds=i)) for i in range(30)]
    assert ingest.ingest([*recent, ahead, *older]) == 91
    everything = list(
        ProbeResult.objects.order_by("-started_at", "-id").values_list("id", flat=True)
    )

    first = log.page(log.LogFilter(), None, now)
    assert first.slices_read == 1
    assert [row.pk for row in first.rows] == everything[:50]
    assert first.rows[0].started_at > now  # ahead of our clock, still first
    assert first.next_cursor is not None
    second = log.page(log.LogFilter(), first.next_cursor, now)
    assert [row.pk for row in second.rows] == everything[50:]
    assert second.next_cursor is None


def test_headroom_is_each_regions_latest_headers_of_the_last_hour(db: None) -> None:
    """Per region, the newest probe of the last hour that carried rate-limit headers, past
    newer probes that carried none; a region with none in the hour shows none, and other
    routes' headers never stand in."""
    from monitor.pages import route as pages_route

    p = f.provider("gateway")
    r, other = f.route(p, "chat"), f.route(p, "other")
    east, west, south = f.region("us-east"), f.region("eu-west"), f.region("ap-south")
    t = f.task("qa", [r, other], [east, west, south])
    now = timezone.now()

    def probe(route: Any, g: Any, minutes: float, **headers: Any) -> dict[str, Any]:
        return {**f.payload(t, route, g, now - timedelta(minutes=minutes)), **headers}

    rows = [
        probe(r, east, 30, ratelimit_remaining_requests=40, ratelimit_remaining_tokens=9000),
        probe(r, east, 20, ratelimit_remaining_requests=12),
        probe(r, east, 5),  # newer, without headers
        probe(r, west, 90, ratelimit_remaining_requests=7),  # over an hour ago
        probe(r, west, 3),
        probe(r, south, 10, retry_after_s=30.0),
        probe(other, west, 1, ratelimit_remaining_requests=999),  # another route
    ]
    assert ingest.ingest(rows) == len(rows)
    shown = {h.region.slug: h for h in pages_route.headroom(r, [east, west, south], {}, now)}
    assert list(shown) == ["us-east", "eu-west", "ap-south"]
    assert shown["us-east"].remaining_requests == 12
    assert shown["us-east"].remaining_tokens is None
    assert shown["us-east"].started_at is not None
    assert abs((now - shown["us-east"].started_at) - timedelta(minutes=20)) < timedelta(seconds=1)
    assert shown["eu-west"].started_at is None
    assert shown["eu-west"].remaining_requests is None
    assert shown["ap-south"].retry_after_s == 30.0
    assert shown["ap-south"].remaining_requests is None
