"""The NDJSON export (issue 33 item 6): the JSON export's objects one a line, streamed, with the
probe log's filters and the export's row limit. Rows stored by the real ingest (PostgreSQL)."""

from __future__ import annotations

import json
from datetime import timedelta

from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from monitor.pipeline.ingest import results as ingest
from tests.monitor import factories as f


def _lines(response) -> list[str]:
    """The body read back a line at a time, as `jq` or a log shipper reads it."""
    assert response.streaming  # streamed, never built whole in memory
    body = b"".join(response.streaming_content).decode()
    assert body.endswith("\n")
    return body.split("\n")[:-1]


def test_ndjson_is_the_json_export_one_object_a_line_with_the_same_filters_and_limit(
    client: Client, teammate: User, db: None
) -> None:
    p = f.provider()
    chat, mini = f.route(p, "chat"), f.route(p, "mini")
    eu, us = f.region("eu-west"), f.region("us-east")
    qa = f.task("qa", [chat, mini], [eu, us])
    now = timezone.now().replace(microsecond=0)
    batch = [
        f.payload(qa, chat, eu, now - timedelta(minutes=9)),
        f.payload(qa, mini, eu, now - timedelta(minutes=8), outcome="error", error_kind="http_5xx"),
        f.payload(qa, chat, us, now - timedelta(minutes=7)),
        f.payload(qa, mini, us, now - timedelta(minutes=6)),
    ]
    # A provider's answer with a newline and a quote must not split or break its line.
    batch[0]["text"] = 'first line\nsecond "line"\r\n{"not": "a row"}'
    assert ingest.ingest(batch) == 4
    client.force_login(teammate)

    response = client.get(reverse("rw-export", args=["ndjson"]))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"].startswith('attachment; filename="routewatch-results-')
    assert response["Content-Disposition"].endswith('.ndjson"')
    lines = _lines(response)
    assert len(lines) == 4
    rows = [json.loads(line) for line in lines]  # each line is one whole JSON object
    assert all(isinstance(row, dict) for row in rows)
    assert rows[0]["text"] == batch[0]["text"]
    assert [(r["model"], r["region"], r["outcome"]) for r in rows] == [
        ("chat", "eu-west", "ok"),
        ("mini", "eu-west", "error"),
        ("chat", "us-east", "ok"),
        ("mini", "us-east", "ok"),
    ]  # oldest first, as the other exports
    # The same objects as the JSON export, field for field.
    whole = client.get(reverse("rw-export", args=["json"]))
    assert rows == json.loads(b"".join(whole.streaming_content))  # type: ignore[attr-defined]

    # The probe log's filters.
    url = reverse("rw-export", args=["ndjson"])
    only_us = [json.loads(x) for x in _lines(client.get(url, {"region": "us-east"}))]
    assert [r["model"] for r in only_us] == ["chat", "mini"]
    failed = [json.loads(x) for x in _lines(client.get(url, {"outcome": "error"}))]
    assert [(r["model"], r["error_kind"]) for r in failed] == [("mini", "http_5xx")]
    one_route = [json.loads(x) for x in _lines(client.get(url, {"route": chat.pk}))]
    assert {r["model"] for r in one_route} == {"chat"}

    # The export's row limit, said in a header.
    with override_settings(EXPORT_MAX_ROWS=3):
        limited = client.get(url)
        assert limited["X-Export-Row-Limit"] == "3"
        assert len(_lines(limited)) == 3

    assert client.get(reverse("rw-export", args=["xml"])).status_code == 404


def test_the_probe_log_links_the_ndjson_export_with_its_filter(
    client: Client, teammate: User, db: None
) -> None:
    p = f.provider()
    r = f.route(p, "chat")
    g = f.region("eu-west")
    f.task("qa", [r], [g])
    client.force_login(teammate)
    page = client.get(reverse("rw-log"), {"region": "eu-west"}).content.decode()
    link = reverse("rw-export", args=["ndjson"])
    assert f'href="{link}?' in page
    assert "region=eu-west" in page.split(f'href="{link}?', 1)[1].split('"', 1)[0]
    assert ">NDJSON</a>" in page
