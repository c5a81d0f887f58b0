"""The pages over data probed for real against the simulator (see conftest.probed_world)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from monitor.models import ProbeResult, RaceRun
from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f
from tests.monitor.conftest import World
from tests.support import unfold_series


def _get(client: Client, url: str, **params: str) -> str:
    response = client.get(url, params)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def _json(body: str, element_id: str) -> Any:
    """Chart data: a json_script element inside <template id=...> (see static/js/app.js)."""
    m = re.search(
        rf'<template id="{element_id}"><script type="application/json">(.*?)</script></template>',
        body,
        re.S,
    )
    assert m, element_id
    return json.loads(m.group(1))


def _as_ms(text: str) -> float:
    number, unit = text.split()
    return float(number) * (1000 if unit == "s" else 1)


def _row(body: str, marker: str) -> str:
    return body[body.index(marker) :].split("</tr>")[0]


def test_the_task_page_ranks_the_fastest_qualifier_first_and_dims_the_rest(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    body = _get(client, reverse("rw-task", args=["arithmetic"]))
    fast, slow, limited = (probed_world.routes[m] for m in ("fast-small", "slow-large", "tiny"))
    ranked = re.findall(r'<tr class="([^"]*)" data-route="(\d+)"', body)
    classes = dict((int(pk), cls) for cls, pk in ranked)
    # The winner heads the table: the lowest e2e p50 among the two routes that answer right
    # (fast-small and claudish-mid; which one is faster is measured, not assumed).
    assert ranked[0][0] == " winner"
    winner = int(ranked[0][1])
    other = ({fast.pk, probed_world.routes["claudish-mid"].pk} - {winner}).pop()
    assert "dimmed" not in classes[other]
    metric = {
        int(pk): value
        for pk, value in re.findall(
            # The ranking figure, before its interval.
            r'data-route="(\d+)"><td>\d+</td><td class="route">.*?</td><td class="num">([^<]*?) <small',
            body,
            re.S,
        )
    }
    assert _as_ms(metric[winner]) <= _as_ms(metric[other])
    # slow-large answers right half the time: under the 80% bar, dimmed, with its reason.
    assert "dimmed" in classes[slow.pk]
    assert "below the quality bar" in _row(body, f'data-route="{slow.pk}"')
    # The rate-limited route mostly fails with 429s: too few graded probes to qualify.
    assert "dimmed" in classes[limited.pk]
    scatter = _json(body, "scatter-data")
    assert scatter["bar"] == 80.0
    points = {p["route_id"]: p for p in scatter["points"]}
    assert points[winner]["winner"]
    assert points[winner]["y"] >= 80
    assert [p["route_id"] for p in scatter["points"] if p["winner"]] == [winner]
    assert not points[slow.pk]["qualifies"]
    assert points[slow.pk]["y"] < 80


def test_the_task_page_for_one_region_reads_that_regions_rollups(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    body = _get(client, reverse("rw-task", args=["arithmetic"]), region="us-east")
    assert "Fastest qualifying route in US East" in body
    assert 'class="chip active" data-region="us-east"' in body


def test_the_route_page_shows_percentiles_by_region_and_says_p99_has_too_few_samples(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    route = probed_world.routes["fast-small"]
    body = _get(client, reverse("rw-route", args=[route.pk]), task="arithmetic")
    for slug in ("eu-west", "us-east", "all"):
        row = _row(body, f'<tr data-region="{slug}"')
        cells = re.findall(r'<td class="num">([^<]*)</td>', row)
        ttft_p50, ttft_p95, ttft_p99 = cells[0:3]
        assert ttft_p50.endswith("ms")
        assert ttft_p95.endswith("ms")
        assert ttft_p99 == "too few"  # 24 or 48 probes: p99 needs 100
    series = unfold_series(_json(body, "series-data"))
    assert len(series["labels"]) == 25  # 24 h, one point an hour, both ends included
    probed = [i for i, v in enumerate(series["ttft_ms"]["p50"]) if v is not None]
    assert len(probed) >= 3  # probes spread over three hours
    assert all(v is None for v in series["ttft_ms"]["p99"])
    # Waterfall of the median probe: phases in order, ending at its e2e.
    segments = _json(body, "waterfall-data")
    names = [s["name"] for s in segments]
    assert names[-3:] == ["upload", "queue + prefill", "decode"]
    assert all(a["end_ms"] <= b["start_ms"] + 0.11 for a, b in itertools.pairwise(segments))
    median = ProbeResult.objects.filter(route=route, outcome="ok", e2e_ms__isnull=False)
    nearest = [p for p in median if abs(segments[-1]["end_ms"] - p.e2e_ms) < 0.11]  # type: ignore[operator]
    assert nearest
    said = re.search(r"nearest the median \(([^,]+),", body)
    assert said is not None
    assert said.group(1) in {p.region.name for p in nearest}  # the probe's own region


def test_the_route_page_compares_the_probe_options_the_task_probes_both_ways(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    route = probed_world.routes["fast-small"]
    body = _get(client, reverse("rw-route", args=[route.pk]), task="arithmetic")
    # Grouped by what happened: the negotiated version, whether a connection was reused.
    for dimension, a, b in (
        ("HTTP version (negotiated)", "HTTP/1.1", "HTTP/2"),
        ("connection", "new connection", "reused connection"),
        ("request body", "JSON", "msgpack + gzip"),
    ):
        table = body[body.index(f'data-dimension="{dimension}"') :].split("</table>")[0]
        assert f">{a}</th>" in table
        assert f">{b}</th>" in table
    # The prefix mode was probed one way only: no comparison for it.
    assert 'data-dimension="prompt prefix"' not in body
    # Every new connection paid for its setup, so it has a setup time.
    new = _row(body[body.index('data-dimension="connection"') :], ">new connection</th>")
    cells = re.findall(r'<td class="num">(.*?)</td>', new)
    assert cells[-2].endswith("ms")  # setup p50, before the request bytes
    # Percentiles carry their 95% intervals.
    assert re.search(r'class="ci">\(\d+ ms', new)


def test_the_route_page_counts_errors_by_kind_and_shows_rate_limit_headroom(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    route = probed_world.routes["tiny"]
    body = _get(client, reverse("rw-route", args=[route.pk]), task="arithmetic")
    errors = body[body.index('id="errors"') :].split("</table>")[0]
    throttled = ProbeResult.objects.filter(route=route, error_kind="http_429").count()
    assert throttled > 0
    assert f'<code>http_429</code></th><td class="num">{throttled}</td>' in errors
    headroom = body[body.index('id="headroom"') :].split("</table>")[0]
    assert "no rate-limit headers in the last hour" not in headroom
    assert re.search(r'<td class="num over">\d+</td>', headroom)


def test_the_route_page_tells_not_reported_cache_from_zero(
    client: Client, teammate: User, db: None
) -> None:
    p = f.provider()
    silent, reporting = f.route(p, "silent"), f.route(p, "reporting")
    g = f.region("eu-west")
    t = f.task("qa", [silent, reporting], [g])
    now = timezone.now()
    ingest.ingest(
        [f.payload(t, silent, g, now - timedelta(seconds=i), cached_tokens=None) for i in range(5)]
        + [
            f.payload(t, reporting, g, now - timedelta(seconds=i), cached_tokens=0)
            for i in range(5)
        ]
    )
    client.force_login(teammate)
    silent_row = _row(
        _get(client, reverse("rw-route", args=[silent.pk])), '<tr data-region="eu-west"'
    )
    reporting_row = _row(
        _get(client, reverse("rw-route", args=[reporting.pk])), '<tr data-region="eu-west"'
    )
    assert "not reported" in silent_row
    assert '<td class="num cache">0%</td>' in reporting_row


def test_the_regions_matrix_marks_each_regions_winner_and_switches_metric(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    fast = probed_world.routes["fast-small"]
    body = _get(client, reverse("rw-regions"))
    table = body[body.index('id="matrix"') :].split("</table>")[0]
    for slug in ("eu-west", "us-east"):
        stars = re.findall(rf'class="num cell-\w+( winner)?" data-region="{slug}"', table)
        assert stars.count(" winner") == 1  # one fastest qualifier per region
    assert table.count("★") == 2
    slow = probed_world.routes["slow-large"]
    assert "★" not in _row(table, f'<tr data-route="{slow.pk}"')  # below the quality bar
    tps = _get(client, reverse("rw-regions"), metric="tps_p50")
    assert "tok/s" in _row(tps, f'<tr data-route="{fast.pk}"')
    assert "speed p50 · Arithmetic" in tps


def test_the_probe_log_filters_by_outcome_and_pages_back(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    errors = _get(client, reverse("rw-log"), outcome="error")
    outcomes = re.findall(r'<tr class="outcome-(\w+)" data-result', errors)
    assert outcomes
    assert set(outcomes) == {"error"}
    first = _get(client, reverse("rw-log"))
    first_ids = re.findall(r'data-result="(\d+)"', first)
    assert len(first_ids) == 50
    older = re.search(r'id="older" href="([^"]+)"', first).group(1).replace("&amp;", "&")  # type: ignore[union-attr]
    second = client.get(older).content.decode()
    second_ids = re.findall(r'data-result="(\d+)"', second)
    assert second_ids
    assert not set(first_ids) & set(second_ids)
    # Newest first across the page boundary.
    assert int(ProbeResult.objects.get(pk=first_ids[-1]).started_at.timestamp()) >= int(
        ProbeResult.objects.get(pk=second_ids[0]).started_at.timestamp()
    )
    total = ProbeResult.objects.count()
    seen, url, pages = set(first_ids), older, 1
    while url:
        pages += 1
        page = client.get(url).content.decode()
        seen |= set(re.findall(r'data-result="(\d+)"', page))
        m = re.search(r'id="older" href="([^"]+)"', page)
        url = m.group(1).replace("&amp;", "&") if m else ""
    assert len(seen) == total  # every probe once, across all pages


def test_the_csv_export_streams_the_filtered_rows(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    route = probed_world.routes["slow-large"]
    response = client.get(
        reverse("rw-export", args=["csv"]), {"route": route.pk, "region": "eu-west"}
    )
    assert response.streaming
    assert response["Content-Disposition"].startswith("attachment;")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]
    expected = ProbeResult.objects.filter(route=route, region__slug="eu-west").count()
    assert len(rows) == expected == 24
    assert {r["model"] for r in rows} == {"slow-large"}
    assert {r["region"] for r in rows} == {"eu-west"}
    assert [r["started_at"] for r in rows] == sorted(r["started_at"] for r in rows)


def test_the_json_export_is_valid_json_and_bounded(
    client: Client, probed_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    with override_settings(EXPORT_MAX_ROWS=7):
        response = client.get(reverse("rw-export", args=["json"]), {"outcome": "ok"})
        data = json.loads(b"".join(response.streaming_content))  # type: ignore[attr-defined]
    assert len(data) == 7
    assert all(row["outcome"] == "ok" for row in data)
    assert {"ttft_ms", "e2e_ms", "tps", "cached_tokens", "text"} <= set(data[0])


def test_the_csv_export_defuses_spreadsheet_formulas_in_provider_text(
    client: Client, probed_world: World, teammate: User
) -> None:
    ProbeResult.objects.filter(pk=ProbeResult.objects.order_by("pk")[0].pk).update(
        text='=HYPERLINK("http://evil.example","x")'
    )
    client.force_login(teammate)
    response = client.get(reverse("rw-export", args=["csv"]))
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))  # type: ignore[attr-defined]
    texts = [r["text"] for r in rows if "HYPERLINK" in r["text"]]
    assert texts == ['\'=HYPERLINK("http://evil.example","x")']


def test_the_csv_export_defuses_formulas_in_every_segment_and_quotes_every_field(
    client: Client, probed_world: World, teammate: User
) -> None:
    # A spreadsheet told to split on ";" (or "|", or tabs) splits inside a cell: each segment
    # must read as text.
    texts = ["ok;=1+1", "ok;@SUM(A1)", "ok;-2+3+cmd|'/C calc'!A0", "a|+1", "b\t=2", "c; =3"]
    pks = ProbeResult.objects.order_by("pk").values_list("pk", flat=True)[: len(texts)]
    for pk, text in zip(pks, texts, strict=True):
        ProbeResult.objects.filter(pk=pk).update(text=text)
    client.force_login(teammate)
    response = client.get(reverse("rw-export", args=["csv"]))
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    assert body.startswith('"started_at","task",')
    cells = {r["text"] for r in csv.DictReader(io.StringIO(body))}
    assert {
        "ok;'=1+1",
        "ok;'@SUM(A1)",
        "ok;'-2+3+cmd|'/C calc'!A0",
        "a|'+1",
        "b\t'=2",
        "c;' =3",
    } <= cells
    for line in body.splitlines():
        for segment in re.split(r"[;|\t]", line):
            assert not segment.lstrip(' "').startswith(("=", "+", "@")), line
        assert not re.search(r"[;|\t] *-", line), line


def test_the_races_page_shows_win_rates_time_saved_and_extra_tokens(
    client: Client, probed_world: World, teammate: User
) -> None:
    fast, slow = probed_world.routes["fast-small"], probed_world.routes["slow-large"]
    eu = probed_world.regions[0]
    now = timezone.now()
    for i in range(4):
        winner, loser = (fast, slow) if i < 3 else (slow, fast)
        RaceRun.objects.create(
            task=probed_world.task,
            region=eu,
            slot_at=now - timedelta(minutes=i + 1),
            deadline_at=now,
            status="done",
            started_at=now - timedelta(minutes=i + 1),
            winner=winner,
            winner_ms=200.0,
            lanes={
                str(winner.pk): {
                    "elapsed_ms": 200.0,
                    "cancelled": False,
                    "tokens_paid": 40,
                    "saved_ms": 0.0,
                    "outcome": "ok",
                },
                str(loser.pk): {
                    "elapsed_ms": 200.0,
                    "cancelled": True,
                    "tokens_paid": 10,
                    "saved_ms": 300.0,
                    "outcome": "ok",
                },
            },
            loser_tokens=10,
            loser_cost_usd=Decimal("0.0001"),
        )
    client.force_login(teammate)
    body = _get(client, reverse("rw-races"))
    fast_row = _row(body, f'<tr data-route="{fast.pk}"')
    cells = re.findall(r'<td class="num">([^<]*)</td>', fast_row)
    assert cells[:3] == ["4", "3", "75%"]
    assert cells[4] == "300 ms"  # saved against fast-small alone in the race it lost
    assert cells[5] == "10"  # tokens paid for fast-small while losing
    assert "40" in body[body.index('id="race-totals"') :].split("</div>\n  </div>")[0]


def test_every_page_has_an_empty_state_before_the_first_probe(
    client: Client, empty_world: World, teammate: User
) -> None:
    client.force_login(teammate)
    assert "No probes yet" in _get(client, reverse("rw-overview"))
    task = _get(client, reverse("rw-task", args=["arithmetic"]))
    assert "No measurements in this window yet" in task
    assert "Nothing to plot yet" in task
    route = _get(client, reverse("rw-route", args=[empty_world.routes["fast-small"].pk]))
    assert "No measurements in this window yet" in route
    assert "No measurements for Arithmetic" in _get(client, reverse("rw-regions"))
    assert "No probes match" in _get(client, reverse("rw-log"))
    assert "No races yet" in _get(client, reverse("rw-races"))


def test_pages_say_so_when_no_task_is_configured(client: Client, teammate: User, db: None) -> None:
    client.force_login(teammate)
    for name in ("rw-overview", "rw-regions", "rw-races"):
        assert "No tasks configured" in _get(client, reverse(name))


def test_a_route_probed_long_ago_is_stale_and_cannot_win(
    client: Client, teammate: User, db: None
) -> None:
    p = f.provider()
    old = f.route(p, "old-model")
    g = f.region("eu-west")
    t = f.task("qa", [old], [g])  # probes every 60 s: stale after 4 min
    then = timezone.now() - timedelta(hours=2)
    ingest.ingest([f.payload(t, old, g, then - timedelta(seconds=i)) for i in range(10)])
    client.force_login(teammate)
    task = _get(client, reverse("rw-task", args=["qa"]))
    assert "badge stale" in _row(task, f'data-route="{old.pk}"')
    assert "No qualifying route" in task
    route = _get(client, reverse("rw-route", args=[old.pk]))
    assert "No recent probe of this route" in route


def test_a_task_with_no_qualifying_route_says_why(
    client: Client, probed_world: World, teammate: User
) -> None:
    probed_world.task.min_pass_rate = 1.01 - 0.001  # above anything but a perfect score
    probed_world.task.min_quality_index = 99
    probed_world.task.save()
    client.force_login(teammate)
    body = _get(client, reverse("rw-task", args=["arithmetic"]))
    assert "No qualifying route: no route meets the bar" in body
    assert "no quality index" in body
    overview = _get(client, reverse("rw-overview"))
    assert "no route meets the bar" in overview


def test_provider_text_is_escaped_everywhere_it_is_shown(
    client: Client, probed_world: World, teammate: User
) -> None:
    hostile = '<script>alert(1)</script><a hx-get="/x" href="javascript:alert(2)">x</a>'
    fast = probed_world.routes["fast-small"]
    fast.display_name = hostile
    fast.save()
    ProbeResult.objects.filter(route=fast).update(text=hostile)
    ProbeResult.objects.filter(outcome="error").update(error_detail=hostile)
    client.force_login(teammate)
    for url in (
        reverse("rw-overview"),
        reverse("rw-task", args=["arithmetic"]),
        reverse("rw-route", args=[fast.pk]),
        reverse("rw-regions"),
        reverse("rw-log"),
        reverse("rw-log") + "?outcome=error",
    ):
        body = _get(client, url)
        assert "<script>alert" not in body, url
        assert 'hx-get="/x"' not in body, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body or "\\u003Cscript\\u003E" in body, (
            url
        )
