"""Logins: a throttle per client address in front of django-axes' lockout.

django-axes locks out after AXES_FAILURE_LIMIT wrong passwords within AXES_COOLOFF_MINUTES,
counted per user name (settings.AXES_LOCKOUT_PARAMETERS) and recorded one AccessAttempt row
per user name, address and user agent; each failure deletes the rows older than the cool-off.
What that leaves open: one address trying many user names (a row each, and every guess at a
password of a user it has not yet locked). So a login POST from an address with
ADDRESS_FAILURE_LIMIT failures within the cool-off, over all user names, is answered 429
before any password is checked, and records nothing more: the attempts table holds at most
that many failures per address and cool-off.

The client address is axes' own (axes.helpers.get_client_ip_address: REMOTE_ADDR unless the
AXES_IPWARE_* settings say which proxies to trust), so the throttle and the lockout count the
same address. Behind a proxy (BEHIND_TLS_PROXY) with no AXES_IPWARE_PROXY_COUNT, REMOTE_ADDR is
the proxy's, every client's: there the throttle is off, as it would lock everyone out at once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from functools import wraps
from typing import Any

from axes.helpers import get_client_ip_address, get_cool_off  # type: ignore[import-untyped]
from axes.models import AccessAttempt  # type: ignore[import-untyped]
from django.conf import settings
from django.db.models import Sum
from django.http import HttpRequest, HttpResponseBase
from django.shortcuts import render
from django.utils import timezone

# Failed logins from one address, over every user name, within one cool-off. Above
# AXES_FAILURE_LIMIT: a few people behind one address who mistype still get in.
ADDRESS_FAILURE_LIMIT = 20

View = Callable[..., HttpResponseBase]


def cool_off() -> timedelta:
    return get_cool_off() or timedelta(minutes=30)


def failures_from(address: str) -> int:
    """Failed logins from `address` within the cool-off, over every user name."""
    since = timezone.now() - cool_off()
    total = AccessAttempt.objects.filter(ip_address=address, attempt_time__gte=since).aggregate(
        n=Sum("failures_since_start")
    )["n"]
    return int(total or 0)


def _addresses_are_clients() -> bool:
    behind_proxy = getattr(settings, "BEHIND_TLS_PROXY", False)
    return not behind_proxy or bool(getattr(settings, "AXES_IPWARE_PROXY_COUNT", None))


def throttled(view: View) -> View:
    """A login view that refuses (429) a POST from an address past ADDRESS_FAILURE_LIMIT."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        on = getattr(settings, "AXES_ENABLED", True) and _addresses_are_clients()
        if request.method == "POST" and on:
            address = get_client_ip_address(request)
            if address and failures_from(address) >= ADDRESS_FAILURE_LIMIT:
                ctx = {"failure_limit": ADDRESS_FAILURE_LIMIT, "cooloff": cool_off()}
                return render(request, "registration/address_throttled.html", ctx, status=429)
        return view(request, *args, **kwargs)

    return wrapper
