from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from monitor.digest import report, sending


class Command(BaseCommand):
    help = (
        "Send the weekly digests that are due now (what beat's send_digests task does). "
        "With --dry-run, print what would go and change nothing."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="print the due digests; send and claim nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        if not options["dry_run"]:
            summary = sending.send_due(now)
            self.stdout.write(
                f"Sent {summary.sent}, failed {summary.failed} (retried later), "
                f"skipped {summary.skipped} (claimed by another sender)."
            )
            return
        subscriptions = list(sending.due(now))
        for sub in subscriptions:
            period = report.period_ending(sub.previous_slot(now))
            tasks = list(report.tasks_for(sub))
            message = sending.digest_message(sub, period, report.build_report(tasks, period))
            to = sub.user.email or "(no e-mail address: would be skipped)"
            self.stdout.write(
                f"would send to {to} [{sub.user.get_username()}]: {message.subject!r}; "
                f"due {sub.next_send_at:%Y-%m-%d %H:%M} UTC, week ending "
                f"{period.until:%Y-%m-%d %H:%M} UTC, tasks: "
                f"{', '.join(t.name for t in tasks) or 'none'}"
                + (f" (attempt {sub.send_attempts + 1})" if sub.send_attempts else "")
            )
        self.stdout.write(f"{len(subscriptions)} digest(s) due; dry run, nothing sent.")
