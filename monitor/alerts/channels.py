"""Telling a channel: the message every channel carries, and one sender per channel kind.

- e-mail: the project's SMTP path (monitor.emails, templates/emails/alert-*), a Message-ID
  fixed per notification;
- webhook: JSON POSTed through monitor.imports.fetch.post (the engine's address policy,
  checked when resolved and connected to the checked address), signed with HMAC-SHA256:
      X-Routewatch-Timestamp: <unix seconds>
      X-Routewatch-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>
      X-Routewatch-Delivery: <notification id, the same on every retry>
  A receiver recomputes the HMAC over the raw body, compares in constant time, refuses
  timestamps more than five minutes old, and drops a delivery id it has seen (docs/alerts.md);
- Slack, Teams, Discord, PagerDuty, Opsgenie: Apprise (the library Uptime Kuma uses), from the
  service URL the admin entered (Apprise's own scheme, e.g. slack://T/B/C, or the service's
  webhook URL). PagerDuty: trigger and resolve by the alert's dedup key (Apprise's action and
  dedup parameters).

Failures raise ChannelError with a message that names no secret (a URL's tokens never reach
an error, a log line or the database).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from typing import TypedDict
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError

from monitor.alerts.models import (
    CHANNEL_DISCORD,
    CHANNEL_EMAIL,
    CHANNEL_OPSGENIE,
    CHANNEL_PAGERDUTY,
    CHANNEL_SLACK,
    CHANNEL_TEAMS,
    CHANNEL_WEBHOOK,
    AlertChannel,
)
from monitor.emails import make_message
from monitor.imports.base import ImportFileError
from monitor.imports.fetch import post
from monitor.models import check_provider_url

log = logging.getLogger(__name__)
# Apprise logs whole payloads (routing keys, webhook tokens) at DEBUG: never let them through.
logging.getLogger("apprise").setLevel(logging.WARNING)

SIGNATURE_HEADER = "X-Routewatch-Signature"
TIMESTAMP_HEADER = "X-Routewatch-Timestamp"
DELIVERY_HEADER = "X-Routewatch-Delivery"
SEND_TIMEOUT_S = 10.0

# Apprise schemes each kind accepts (the scheme picks the service: a Slack channel cannot be
# pointed at another service), and the https hosts of the services' own webhook URLs.
APPRISE_SCHEMES = {
    CHANNEL_SLACK: ("slack",),
    CHANNEL_TEAMS: ("workflow", "workflows"),  # Power Automate workflows (connectors retired)
    CHANNEL_DISCORD: ("discord",),
    CHANNEL_PAGERDUTY: ("pagerduty",),
    CHANNEL_OPSGENIE: ("opsgenie",),
}
NATIVE_HOSTS = {
    CHANNEL_SLACK: ("hooks.slack.com",),
    CHANNEL_TEAMS: (".webhook.office.com", ".logic.azure.com", ".powerplatform.com"),
    CHANNEL_DISCORD: ("discord.com", "discordapp.com"),
}
# The host an Apprise scheme reaches (checked against the address policy before each send).
SERVICE_HOSTS = {
    "slack": "hooks.slack.com",
    "discord": "discord.com",
    "pagerduty": "events.pagerduty.com",
    "opsgenie": "api.opsgenie.com",
}


class ChannelError(Exception):
    """The channel did not take the message; the text says why and names no secret."""


class AlertMessage(TypedDict):
    """What every notification carries (the webhook's JSON body, as it is)."""

    delivery_id: str
    alert_id: int | None
    dedup_key: str
    event: str  # fired, resolved, reminder, escalated, test
    state: str
    rule: str
    task: str
    title: str
    summary: str
    why: str
    metric: str
    unit: str
    figure: float | None
    low: float | None
    high: float | None
    samples: int | None
    threshold: float | None
    threshold_label: str
    regions: list[str]
    regions_total: int | None
    regions_needed: int | None
    at: str
    # When the breach began in data time (its evidence's onset, from which the minimum
    # duration counts) and when the rule became sure of it (ISO 8601; "" for a test), and
    # both for people: "slow since 10:02:13 UTC, confident since 10:03:01".
    onset_at: str
    confident_at: str
    since: str
    url: str  # the page that explains it
    history_url: str
    ack_url: str
    snooze_url: str


def check_target(kind: str, url: str) -> str:
    """Refuse a target URL this kind cannot use; the host it reaches (for people). Raises
    ValidationError with a message that does not repeat the URL."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if kind == CHANNEL_WEBHOOK:
        check_provider_url(url)
        return parts.hostname or ""
    if kind not in APPRISE_SCHEMES:
        raise ValidationError("This kind of channel takes no URL.")
    if scheme in ("https", "http"):
        host = (parts.hostname or "").lower()
        if not any(
            host == h or (h.startswith(".") and host.endswith(h))
            for h in NATIVE_HOSTS.get(kind, ())
        ):
            raise ValidationError("This is not the service's own webhook URL; use its Apprise URL.")
        check_provider_url(url)
        return host
    if scheme not in APPRISE_SCHEMES[kind]:
        allowed = ", ".join(f"{s}://" for s in APPRISE_SCHEMES[kind])
        raise ValidationError(f"Use a URL starting with {allowed}.")
    import apprise

    if apprise.Apprise.instantiate(url) is None:
        raise ValidationError("Apprise cannot read this URL: check its parts against the docs.")
    host = SERVICE_HOSTS.get(scheme) or (parts.hostname or "")
    check_provider_url(f"https://{host}/")  # the address policy, on the host it reaches
    return host


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"v1={digest.hexdigest()}"


def send(channel: AlertChannel, message: AlertMessage) -> None:
    """Deliver `message` to `channel`, or raise ChannelError."""
    if channel.kind == CHANNEL_EMAIL:
        _email(channel, message)
    elif channel.kind == CHANNEL_WEBHOOK:
        _webhook(channel, message)
    else:
        _apprise(channel, message)


def _email(channel: AlertChannel, message: AlertMessage) -> None:
    if not channel.email:
        raise ChannelError("the channel has no e-mail address")
    domain = urlsplit(settings.SITE_URL).hostname or "routewatch.invalid"
    headers = {
        "Message-ID": f"<alert-{message['delivery_id']}@{domain}>",
        "Auto-Submitted": "auto-generated",
    }
    try:
        make_message("alert", channel.email, {"m": message}, headers).send()
    except OSError as exc:  # smtplib.SMTPException is an OSError
        raise ChannelError(f"SMTP: {exc.__class__.__name__}: {exc}"[:250]) from None


def _webhook(channel: AlertChannel, message: AlertMessage) -> None:
    body = json.dumps(message, sort_keys=True).encode()
    timestamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "routewatch-alerts/1",
        TIMESTAMP_HEADER: str(timestamp),
        DELIVERY_HEADER: message["delivery_id"],
    }
    secret = channel.secret()
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, timestamp, body)
    try:
        status = post(channel.target(), body, headers, deadline_s=SEND_TIMEOUT_S)
    except ImportFileError as exc:
        raise ChannelError(exc.message) from None
    if not 200 <= status < 300:
        raise ChannelError(f"the receiver answered HTTP {status}")


def _text(message: AlertMessage) -> str:
    lines = [message["summary"], "", f"Why: {message['why']}"]
    if message.get("since"):
        lines.append(f"Since: {message['since']}")
    if message["regions"]:
        lines.append(
            f"Regions: {', '.join(message['regions'])}"
            + (
                f" ({len(message['regions'])} of {message['regions_total']})"
                if message["regions_total"]
                else ""
            )
        )
    lines += ["", f"Details: {message['url']}"]
    if message["ack_url"]:
        lines.append(f"Acknowledge: {message['ack_url']}")
        lines.append(f"Snooze: {message['snooze_url']}")
    return "\n".join(lines)


def _apprise_url(channel: AlertChannel, message: AlertMessage) -> str:
    url = channel.target()
    scheme = urlsplit(url).scheme.lower()
    if scheme == "pagerduty":
        # One incident per alert: trigger it, then resolve it, by its dedup key.
        action = "resolve" if message["event"] == "resolved" else "trigger"
        extra = {"action": action, "dedup": message["dedup_key"], "click": message["url"]}
        url += ("&" if "?" in url else "?") + urlencode(extra)
    return url


def _apprise(channel: AlertChannel, message: AlertMessage) -> None:
    import apprise

    url = channel.target()
    try:
        check_target(channel.kind, url)  # again, now: names resolve differently over time
    except ValidationError as exc:
        raise ChannelError(" ".join(exc.messages)) from None
    sender = apprise.Apprise()
    if not sender.add(_apprise_url(channel, message)):
        raise ChannelError("Apprise cannot read the channel's URL")
    kind = {
        "resolved": apprise.NotifyType.SUCCESS,
        "test": apprise.NotifyType.INFO,
    }.get(message["event"], apprise.NotifyType.FAILURE)
    ok = sender.notify(title=message["title"], body=_text(message), notify_type=kind)
    if not ok:
        raise ChannelError(
            f"{channel.get_kind_display()} did not accept it (see Apprise's warning)"
        )
