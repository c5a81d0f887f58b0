"""`manage.py region_broker_acl <slug>`: the Redis ACL user a region's workers log in as.

A region worker needs, from the broker (Celery's Redis transport, kombu 5.7):
- its own queue, `probes.<slug>`, and kombu's priority lists beside it
  (`probes.<slug>\\x06\\x16<n>`), with the binding table of its exchange;
- to publish its results to `ingest` (kombu looks the queue up in `_kombu.binding.ingest`);
- kombu's acknowledgement records, `unacked`, `unacked_index` and `unacked_mutex`, which are
  one set shared by every queue (docs/security.md says what that leaves open);
- Celery's remote control (the compose health check's `inspect ping`): the worker's own
  `<node>.celery.pidbox` list, replies in `<id>.reply.celery.pidbox`, and the broadcast
  channel; and the binding tables of those exchanges and of `celeryev`;
- Routewatch's own keys of its region: nonce claims and run counts
  (monitor.pipeline.signing), the spend ledger of runs after the first (monitor.stats.spend),
  its liveness beacon (monitor.pipeline.region.liveness).
Nothing else: not another region's queue or keys, not the dead letters, not `KEYS` or `SCAN`.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from monitor.models import Region

# Commands by category: the key patterns below are what limit a region's reach; these keep out
# what no worker sends (server administration, KEYS, SCAN, FLUSHALL, CONFIG, DEBUG...).
# Checked by running a real region worker under this user with `ACL LOG` empty
# (tests/monitor/management/test_region_broker_acl.py).
COMMANDS = (
    "-@all",
    "+@read",
    "+@write",
    "+@pubsub",
    "+@transaction",
    "+@connection",
    "+@scripting",
    "-@dangerous",
    "-scan",
    "-randomkey",
    "+time",  # in kombu's binding scripts
    "+client|setinfo",  # redis-py names its library on connect
    "+client|setname",
    "+client|id",
)
# Characters of a queue name right after `probes.<slug>` that start kombu's priority suffix
# (\x06\x16): anything but a slug character, so region `eu` never reaches `probes.eu-west`.
_NOT_SLUG = "[^-_.a-zA-Z0-9]"
SLUG = re.compile(r"^[-a-zA-Z0-9_]+$")


def user_name(slug: str) -> str:
    return f"rw-region-{slug}"


def rules(slug: str, db: int = 0) -> list[str]:
    """The ACL rules (after the user name and password) of region `slug`'s workers, for
    the Redis database number `db` of REDIS_URL (kombu's pub/sub channels name it)."""
    if not SLUG.match(slug):
        raise ValueError(f"not a region slug: {slug!r}")
    queue = f"probes.{slug}"
    keys = [
        queue,
        f"{queue}{_NOT_SLUG}*",
        f"_kombu.binding.{queue}",
        f"_kombu.binding_permanent.{queue}",
        "ingest",
        f"ingest{_NOT_SLUG}*",
        "_kombu.binding.ingest",
        "_kombu.binding_permanent.ingest",
        "unacked",
        "unacked_index",
        "unacked_mutex",
        "_kombu.binding_deadlines",
        "*.celery.pidbox",  # a worker's own control queue, and replies (*.reply.celery.pidbox)
        f"*.celery.pidbox{_NOT_SLUG}*",
        "_kombu.binding.celery.pidbox",
        "_kombu.binding.reply.celery.pidbox",
        "_kombu.binding.celeryev",
        "_kombu.binding_permanent.celeryev",
        "celeryev.*",  # workers' gossip queues (Celery's events)
        f"rw:nonce:{slug}:*",
        f"rw:runs:{slug}:*",
        f"rw:reruns:{slug}:*",
        f"rw:worker:{slug}:*",
    ]
    return [
        "resetkeys",
        *(f"~{k}" for k in keys),
        "resetchannels",
        # Remote control broadcasts and worker events (online, heartbeat, offline). kombu
        # subscribes with PSUBSCRIBE, which Redis checks against these literally.
        f"&/{db}.celery.pidbox",
        f"&/{db}.celery.pidbox/*",
        f"&/{db}.celeryev/*",
        f"&/{db}.celeryev/worker.*",  # gossip's subscription
        *COMMANDS,
    ]


class Command(BaseCommand):
    help = (
        "Print the Redis ACL user for a region's workers, as an `ACL SETUSER` command and as a "
        "users.acl line; a new password unless --password is given. The workers' REDIS_URL "
        "then names the user: redis://rw-region-<slug>:<password>@host:6379/0."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("region", help="the region's slug")
        parser.add_argument("--password", help="the user's password (default: a new one)")
        parser.add_argument("--db", type=int, default=0, help="REDIS_URL's database number")

    def handle(self, *args: Any, **options: Any) -> None:
        slug = options["region"]
        if not Region.objects.filter(slug=slug).exists():
            raise CommandError(f"no region with slug {slug!r}")
        password = options["password"] or secrets.token_urlsafe(32)
        line = " ".join(["on", f">{password}", *rules(slug, options["db"])])
        self.stdout.write(f"ACL SETUSER {user_name(slug)} reset {line}")
        self.stdout.write(f"user {user_name(slug)} {line}")
