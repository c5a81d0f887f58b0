"""Sending over real SMTP (aiosmtpd on loopback): who gets a digest, once, with which figures."""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from monitor.celery import app
from monitor.digest import sending
from monitor.models import Subscription, Task
from tests.monitor.digest.conftest import (
    NEXT_WEEK,
    NOW,
    WEEK_END,
    Inbox,
    Scenario,
    free_port,
    html_of,
    subscribe,
    text_of,
)


def _figure(block: str, label: str) -> float:
    """The this-week value of a figure line such as '  TTFT p50: 409 ms (last week ...)'."""
    match = re.search(rf"{label}: ([\d.,]+) (ms|s) ", block)
    assert match, f"no {label} in {block!r}"
    value = float(match.group(1).replace(",", ""))
    return value * 1000 if match.group(2) == "s" else value


def _region_block(text: str, region: str) -> str:
    start = text.index(f"* {region}:")
    end = text.find("\n* ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _near(value: float, expected: float) -> bool:
    return abs(value - expected) <= expected * 0.03  # read back from log-bucket histograms


def test_due_subscribers_each_receive_exactly_one_digest_with_the_seeded_figures(
    smtp: Inbox, scenario: Scenario, owner: User, teammate: User, outsider: User
) -> None:
    subscribe(owner)
    subscribe(teammate)
    unsubscribed = subscribe(outsider)
    unsubscribed.is_active = False
    unsubscribed.reschedule(NOW)
    unsubscribed.save()

    assert sending.send_due(NOW) == sending.SendSummary(sent=2)
    assert sending.send_due(NOW + timedelta(minutes=5)) == sending.SendSummary()

    assert len(smtp) == 2
    assert len(smtp.to("owner@example.com")) == 1
    assert len(smtp.to("teammate@example.com")) == 1
    assert smtp.to("outsider@example.com") == []
    message = smtp.to("owner@example.com")[0]
    assert message["Subject"] == "Routewatch weekly: 1 task, 2 route changes, 1 regression"
    text = text_of(message)

    eu = _region_block(text, "EU-WEST")
    assert eu.startswith(
        "* EU-WEST: Acme / fast-model (changed, faster route appeared; last week Acme / slow-model)"
    )
    assert _near(_figure(eu, "TTFT p50"), 400)
    assert _near(_figure(eu, "e2e p95"), 1500)
    assert re.search(r"TTFT p50: [\d.]+ ms \(last week [\d.]+ ms, -4\d% faster\)", eu)
    assert "Budget TTFT p95 600 ms: within budget" in eu
    assert "Budget e2e p95 3000 ms: within budget" in eu

    us = _region_block(text, "US-EAST")
    assert us.startswith(
        "* US-EAST: Acme / slow-model (changed, errors; last week Acme / fast-model)"
    )
    assert "Acme / fast-model failed 90.0% of its probes (18 of 20)." in us
    assert _near(_figure(us, "e2e p50"), 4000)
    assert "Budget TTFT p95 600 ms: over budget" in us
    assert "Budget e2e p95 3000 ms: over budget" in us

    regressions = re.findall(r"- Acme / slow-model in US-EAST: (e2e p\d\d) .* \(\+(\d+)%\)", text)
    # p95 rose as much, but 20 samples give a p95 no upper bound: not a confident regression.
    assert sorted(label for label, _ in regressions) == ["e2e p50"]
    assert all(28 <= int(pct) <= 38 for _, pct in regressions)  # 3000 -> 4000 ms is +33%
    assert "Latency budgets: met in 1 of 2 regions." in text
    assert "Errors: 22.5% of 80 probes (last week 0.0% of 60): http_5xx 18" in text
    assert "Probe spend: $0.1120 (last week $0.0840)" in text
    assert "Week of Mon 9 Nov 08:00 to Mon 16 Nov 2026 07:59 UTC" in text

    html = html_of(message)
    assert "22.5%" in html
    assert "$0.1120" in html
    assert "http://localhost:8000/" in html  # links are absolute, from SITE_URL

    for sub in Subscription.objects.filter(user__in=[owner, teammate]):
        assert sub.next_send_at == NEXT_WEEK
        assert sub.last_sent_at == NOW
        assert sub.send_attempts == 0
    unsubscribed.refresh_from_db()
    assert unsubscribed.next_send_at is None
    assert unsubscribed.last_sent_at is None


def test_digests_carry_one_click_unsubscribe_headers_that_work_without_a_session(
    smtp: Inbox, scenario: Scenario, owner: User
) -> None:
    subscribe(owner)
    sending.send_due(NOW)
    message = smtp.to("owner@example.com")[0]
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    url = str(message["List-Unsubscribe"]).strip().removeprefix("<").removesuffix(">")
    assert url.startswith("http://localhost:8000/digest/unsubscribe/")
    assert message["Message-ID"].startswith("<digest-")
    assert url in text_of(message)

    # What a mail client does on "unsubscribe": a POST, no cookies, no CSRF token.
    client = Client(enforce_csrf_checks=True)
    with time_machine.travel(NOW + timedelta(minutes=1), tick=False):
        response = client.post(
            url.removeprefix("http://localhost:8000"),
            "List-Unsubscribe=One-Click",
            content_type="application/x-www-form-urlencoded",
        )
    assert response.status_code == 200
    sub = Subscription.objects.get(user=owner)
    assert sub.is_active is False
    assert sub.next_send_at is None

    assert sending.send_due(NEXT_WEEK + timedelta(minutes=1)) == sending.SendSummary()
    assert len(smtp.to("owner@example.com")) == 1


def test_two_concurrent_senders_still_send_each_digest_once(
    smtp: Inbox, transactional_db: None, django_user_model: type[User]
) -> None:
    Task.objects.create(name="Summarise", slug="summarise", user_template="Q: {input}")
    users = [
        django_user_model.objects.create_user(f"user{i}", f"user{i}@example.com", "pw-user-1")
        for i in range(12)
    ]
    for user in users:
        subscribe(user)
    # A slow SMTP server keeps both senders busy at once, so their claims interleave.
    smtp.delay_s = 0.05
    start = threading.Barrier(2)
    summaries: list[sending.SendSummary] = []
    errors: list[BaseException] = []

    def sender() -> None:
        try:
            start.wait()
            summaries.append(sending.send_due(NOW))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=sender) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert errors == []
    assert len(summaries) == 2
    assert sum(s.sent for s in summaries) == 12
    # Both senders saw digests that the other one had claimed first: they really raced.
    assert sum(s.skipped for s in summaries) >= 1
    assert len(smtp) == 12
    for user in users:
        assert len(smtp.to(user.email)) == 1
    assert set(Subscription.objects.values_list("next_send_at", flat=True)) == {NEXT_WEEK}


def test_a_digest_the_smtp_server_refuses_is_retried_later_and_sent_once(
    smtp: Inbox, scenario: Scenario, owner: User
) -> None:
    sub = subscribe(owner)
    smtp.refuse_next = 1

    assert sending.send_due(NOW) == sending.SendSummary(failed=1)
    sub.refresh_from_db()
    assert sub.next_send_at == NOW + sending.RETRY_DELAYS[0]
    assert sub.send_attempts == 1
    assert sub.last_error.startswith("SMTPDataError")
    assert len(smtp) == 0

    assert sending.send_due(NOW + timedelta(minutes=1)) == sending.SendSummary()
    assert sending.send_due(NOW + sending.RETRY_DELAYS[0]) == sending.SendSummary(sent=1)
    assert sending.send_due(NOW + timedelta(minutes=30)) == sending.SendSummary()

    assert len(smtp.to("owner@example.com")) == 1
    # The retry reports on the same week as the first attempt would have.
    assert "Week of Mon 9 Nov 08:00 to Mon 16 Nov 2026 07:59 UTC" in text_of(smtp.messages[0])
    sub.refresh_from_db()
    assert sub.next_send_at == NEXT_WEEK
    assert sub.send_attempts == 0
    assert sub.last_error == ""
    assert sub.last_sent_at == NOW + sending.RETRY_DELAYS[0]


def test_an_unreachable_smtp_server_is_retried_with_back_off_then_the_week_is_given_up(
    settings: object, scenario: Scenario, owner: User
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"  # type: ignore[attr-defined]
    settings.EMAIL_HOST = "127.0.0.1"  # type: ignore[attr-defined]
    settings.EMAIL_PORT = free_port()  # type: ignore[attr-defined]  # nothing listens there
    sub = subscribe(owner)
    when = NOW
    for attempt, delay in enumerate(sending.RETRY_DELAYS, start=1):
        assert sending.send_due(when) == sending.SendSummary(failed=1)
        sub.refresh_from_db()
        assert sub.send_attempts == attempt
        assert sub.next_send_at == when + delay
        assert "ConnectionRefusedError" in sub.last_error
        when = sub.next_send_at

    assert sending.send_due(when) == sending.SendSummary(failed=1)
    sub.refresh_from_db()
    assert sub.next_send_at == NEXT_WEEK
    assert sub.send_attempts == 0
    assert sub.last_error.startswith(f"gave up after {sending.MAX_ATTEMPTS} attempts")
    assert sub.last_sent_at is None


def test_a_digest_whose_sender_died_mid_send_is_retried_once_its_lease_runs_out(
    smtp: Inbox, scenario: Scenario, owner: User
) -> None:
    sub = subscribe(owner)
    # The state a sender leaves when it dies after claiming: a lease and one attempt.
    Subscription.objects.filter(pk=sub.pk).update(next_send_at=NOW + sending.LEASE, send_attempts=1)

    assert sending.send_due(NOW + sending.LEASE - timedelta(seconds=1)) == sending.SendSummary()
    assert sending.send_due(NOW + sending.LEASE) == sending.SendSummary(sent=1)
    assert len(smtp.to("owner@example.com")) == 1
    sub.refresh_from_db()
    assert sub.next_send_at == NEXT_WEEK


def test_subscribers_not_yet_due_or_without_an_address_receive_nothing(
    smtp: Inbox, scenario: Scenario, owner: User, teammate: User
) -> None:
    later = subscribe(owner, hour=9)  # due at 09:00, it is 08:30
    teammate.email = ""
    teammate.save()
    no_address = subscribe(teammate)

    assert sending.send_due(NOW) == sending.SendSummary(failed=1)
    assert len(smtp) == 0
    later.refresh_from_db()
    assert later.next_send_at == WEEK_END + timedelta(hours=1)
    no_address.refresh_from_db()
    assert no_address.last_error == "the user has no e-mail address"
    assert no_address.next_send_at == NEXT_WEEK


def test_send_digests_dry_run_prints_what_would_go_and_sends_nothing(
    smtp: Inbox, scenario: Scenario, owner: User, teammate: User, outsider: User
) -> None:
    subscribe(owner)
    subscribe(teammate)
    subscribe(outsider, hour=12)
    out = StringIO()
    with time_machine.travel(NOW, tick=False):
        call_command("send_digests", "--dry-run", stdout=out)
    printed = out.getvalue()
    assert "would send to owner@example.com [owner]" in printed
    assert "would send to teammate@example.com [teammate]" in printed
    assert "Routewatch weekly: 1 task, 2 route changes, 1 regression" in printed
    assert "outsider" not in printed
    assert "2 digest(s) due; dry run, nothing sent." in printed
    assert len(smtp) == 0
    assert set(Subscription.objects.values_list("next_send_at", flat=True)) == {
        WEEK_END,
        WEEK_END + timedelta(hours=4),
    }

    with time_machine.travel(NOW, tick=False):
        call_command("send_digests", stdout=out)
    assert "Sent 2, failed 0" in out.getvalue()
    assert len(smtp) == 2


def test_beat_schedules_the_digest_task_which_a_worker_finds_and_runs(
    settings: object, smtp: Inbox, scenario: Scenario, owner: User
) -> None:
    schedule = settings.CELERY_BEAT_SCHEDULE  # type: ignore[attr-defined]
    assert "monitor.tasks.send_digests" in {entry["task"] for entry in schedule.values()}
    app.loader.import_default_modules()  # what a worker does at start: autodiscover tasks
    subscribe(owner)
    with time_machine.travel(NOW, tick=False):
        result = app.tasks["monitor.tasks.send_digests"].apply()
    assert result.get() == {"sent": 1, "skipped": 0, "failed": 0}
    assert len(smtp.to("owner@example.com")) == 1


@pytest.mark.parametrize("bad", ["<script>alert(1)</script>", 'Q&A "beta" <b>'])
def test_provider_supplied_text_is_escaped_in_the_html_digest(
    smtp: Inbox, scenario: Scenario, owner: User, bad: str
) -> None:
    scenario.fast.display_name = bad
    scenario.fast.save()
    subscribe(owner)
    sending.send_due(NOW)
    message = smtp.to("owner@example.com")[0]
    html = html_of(message)
    assert bad not in html
    assert "&lt;" in html
    assert bad in text_of(message)  # plain text is not HTML: shown as is


def test_links_are_absolute_and_point_at_the_task_and_route_pages(
    smtp: Inbox, scenario: Scenario, owner: User, settings: object
) -> None:
    subscribe(owner)
    sending.send_due(NOW)
    message = smtp.to("owner@example.com")[0]
    site = settings.SITE_URL  # type: ignore[attr-defined]
    task_url = site + reverse("rw-task", args=[scenario.task.slug])
    route_url = site + reverse("rw-route", args=[scenario.fast.pk])
    assert task_url in text_of(message)
    assert f'href="{task_url}"' in html_of(message)
    assert f'href="{route_url}"' in html_of(message)
    assert f'href="{site}{reverse("rw-digest-settings")}"' in html_of(message)


def test_the_demo_file_backend_writes_each_digest_to_a_file(
    settings: object, scenario: Scenario, owner: User, tmp_path: Path
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"  # type: ignore[attr-defined]
    settings.EMAIL_FILE_PATH = str(tmp_path)  # type: ignore[attr-defined]
    subscribe(owner)
    assert sending.send_due(NOW) == sending.SendSummary(sent=1)
    [written] = list(tmp_path.iterdir())
    content = written.read_text()
    assert "Subject: Routewatch weekly: 1 task, 2 route changes, 1 regression" in content
    assert "To: owner@example.com" in content
