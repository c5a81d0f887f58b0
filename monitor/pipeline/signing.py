"""Authenticated messages between the beat, region workers and ingest, and the provider keys
they carry.

Whoever can write to the broker must not be able to make a worker probe for them, nor learn a
provider key. So every message on a region queue, and every result a region worker sends back,
travels in an envelope signed with a secret of that region (monitor.models.RegionKey):

    {"v": 1, "kind": "batch", "region": "eu-west", "kid": "<key id>", "nonce": "<hex>",
     "issued_at": <unix s>, "expires_at": <unix s or null>, "body": <the message>,
     "sig": HMAC-SHA256(key derived from the region secret, canonical JSON of the rest)}

- A region worker holds only its own region's secrets (RW_REGION_KEYS), never
  FIELD_ENCRYPTION_KEYS. It refuses an envelope that is not one, is for another region or
  kind, names a key it does not hold, has a wrong signature, has expired, or was seen before:
  its nonce is claimed once, until it expires, both in Redis (SET NX: across hosts) and in
  the worker host's own record (monitor.pipeline.region.replay), which no broker write can erase.
  Every run after a message's first is counted in the spend cap's in flight (`count_run`).
  Refusals are logged with the reason only, and nothing in a refused message is decrypted.
- The beat (which holds FIELD_ENCRYPTION_KEYS) re-encrypts each provider key and secret
  header for the batch under a key derived from the region's secret, together with the
  origin (scheme://host:port) it may be sent to. The worker opens it only for a probe whose
  base URL has that origin, whatever the message says (`open_secret`).
- Results are sealed by the worker with the key its batch came under; ingest verifies them
  with the region's keys (active, or deactivated less than `results_grace` ago: results
  waiting out a rotation still count) and keeps only results for that region. A result's
  issue time ahead of ours is not a refusal (a worker's clock may run fast): it is taken as
  our now, logged and counted.

Keys rotate with overlap: several keys of a region may be active; the newest active one
signs; a worker accepts any key it holds.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from monitor.crypto import ApiKeyDecryptionError, bind, decrypt_bound, origin_of, unbind
from monitor.logfilters import register_secret
from monitor.pipeline.region import clock, replay

log = logging.getLogger(__name__)

VERSION = 1
KIND_BATCH = "batch"
KIND_RACE = "race"
KIND_RESULTS = "results"
KIND_RACE_RESULT = "race-result"
KIND_SCENARIO = "scenario"
KIND_SCENARIO_RESULT = "scenario-result"
# How far a sender's clock may run ahead of ours: a message to a region worker issued further in
# the future is refused; a result is not (open_results: its issue time is clamped to ours).
CLOCK_SKEW_S = 30.0
# Heartbeat rows counting results sealed by a worker whose clock ran ahead of ours by more than
# CLOCK_SKEW_S, one per region (admin, Heartbeats).
CLOCK_AHEAD_COUNTER = "results-clock-ahead:"
# Prefix of a provider secret re-encrypted for one region: "rwr1.<key id>.<Fernet token>".
WRAPPED = "rwr1."
# A secret the beat could not open for the batch: the worker fails the probe as `config`.
UNUSABLE = "rw-unusable:"
_SIGNED_FIELDS = ("v", "kind", "region", "kid", "nonce", "issued_at", "expires_at", "body")


class Refused(Exception):
    """A message that is not authentic, not for us, expired or replayed. The text says which,
    never any value from the message."""


class SecretRefused(Exception):
    """A provider secret this worker may not open for this probe (another region's, another
    origin's, or unusable)."""


@dataclass(frozen=True)
class RegionSecret:
    key_id: str
    secret: str

    def signing_key(self) -> bytes:
        return _derive(self.secret, b"routewatch message signing v1")

    def fernet(self) -> Fernet:
        return Fernet(base64.urlsafe_b64encode(_derive(self.secret, b"routewatch key wrap v1")))


@cache
def _derive(secret: str, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret.encode())


def new_key_id() -> str:
    return secrets.token_hex(8)


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def canonical(value: object) -> bytes:
    # NaN and infinities as Celery's JSON writes them (a worker's figures may hold them).
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _signature(key: RegionSecret, envelope: Mapping[str, Any]) -> str:
    signed = {name: envelope.get(name) for name in _SIGNED_FIELDS}
    return hmac.new(key.signing_key(), canonical(signed), hashlib.sha256).hexdigest()


def seal(
    key: RegionSecret,
    region: str,
    kind: str,
    body: object,
    expires_at: float | None,
    issued_at: float | None = None,
) -> dict[str, Any]:
    """`body` signed with `key`, issued now (central time) or at `issued_at`."""
    envelope: dict[str, Any] = {
        "v": VERSION,
        "kind": kind,
        "region": region,
        "kid": key.key_id,
        "nonce": secrets.token_hex(16),
        # central time (a region worker corrects its clock)
        "issued_at": clock.now() if issued_at is None else issued_at,
        "expires_at": expires_at,
        "body": body,
    }
    envelope["sig"] = _signature(key, envelope)
    return envelope


def verify(
    envelope: object,
    keys: Mapping[str, RegionSecret],
    region: str | None,
    kind: str,
    now: float | None = None,
    *,
    future_ok: bool = False,
) -> tuple[RegionSecret, dict[str, Any]]:
    """The key that signed it and the envelope, or Refused. `region` None: any region (the
    caller checks it against the key's). `future_ok`: an issue time ahead of our clock is
    accepted (results: the caller clamps it)."""
    if not isinstance(envelope, dict) or envelope.get("v") != VERSION:
        raise Refused("not a signed envelope")
    if envelope.get("kind") != kind:
        raise Refused(f"not a {kind} message")
    if region is not None and envelope.get("region") != region:
        raise Refused("for another region")
    kid = envelope.get("kid")
    key = keys.get(kid) if isinstance(kid, str) else None
    if key is None:
        raise Refused("signed with a key this side does not hold")
    sig = envelope.get("sig")
    try:
        expected = _signature(key, envelope)
    except (TypeError, ValueError):
        raise Refused("not canonical JSON") from None
    if not isinstance(sig, str) or not hmac.compare_digest(sig, expected):
        raise Refused("bad signature")
    now = clock.now() if now is None else now
    issued_at, expires_at = envelope.get("issued_at"), envelope.get("expires_at")
    if not isinstance(issued_at, int | float) or not math.isfinite(issued_at):
        raise Refused("no issue time")
    if issued_at > now + CLOCK_SKEW_S and not future_ok:
        raise Refused("issued in the future")
    if expires_at is not None and (not isinstance(expires_at, int | float) or now > expires_at):
        raise Refused("expired")
    if not isinstance(envelope.get("nonce"), str) or len(envelope["nonce"]) > 64:
        raise Refused("no nonce")
    return key, envelope


# --- the beat's side (holds FIELD_ENCRYPTION_KEYS and the database) ---------------------------


class NoRegionKey(Exception):
    """A region with no active key, or one whose secret cannot be decrypted with
    FIELD_ENCRYPTION_KEYS: nothing can be sent to it (the admin must add one, or put back the
    encryption key that was dropped before `manage.py rotate_api_keys` ran)."""


class KeyUnavailable(Exception):
    """Results signed with a region key whose stored secret cannot be decrypted with
    FIELD_ENCRYPTION_KEYS: not a refusal of the results (they may be authentic), but ours to
    fix; ingest retries them, then parks them (monitor.tasks), never drops them."""


def signing_key(region_slug: str) -> RegionSecret:
    """The newest active key of a region."""
    from monitor.models import RegionKey

    row = (
        RegionKey.objects.filter(region__slug=region_slug, is_active=True)
        .order_by("-created_at", "-pk")
        .first()
    )
    if row is None:
        raise NoRegionKey(f"region {region_slug} has no active key (admin, Regions)")
    try:
        return RegionSecret(row.key_id, row.get_secret())
    except ApiKeyDecryptionError as exc:
        raise NoRegionKey(f"region {region_slug}'s key {row.key_id}: {exc}") from None


def probe_messages(kind: str, body: Any) -> Iterator[dict[str, Any]]:
    """The probe messages inside a batch or race body (whatever the contract says later)."""
    if kind == KIND_BATCH and isinstance(body, dict) and isinstance(body.get("probes"), list):
        yield from (p for p in body["probes"] if isinstance(p, dict))
    elif kind == KIND_RACE and isinstance(body, dict) and isinstance(body.get("lanes"), dict):
        yield from (p for p in body["lanes"].values() if isinstance(p, dict))
    elif kind == KIND_SCENARIO and isinstance(body, dict) and isinstance(body.get("probe"), dict):
        yield body["probe"]


def wrap_secret(key: RegionSecret, token: str, url: str) -> str:
    """A stored secret (FIELD_ENCRYPTION_KEYS) re-encrypted for the region, bound to `url`'s
    origin; "" stays "". One the beat cannot open travels as UNUSABLE with the reason."""
    if not token:
        return ""
    try:
        secret = decrypt_bound(token, url, accept_unbound=True)
    except ApiKeyDecryptionError as exc:
        return UNUSABLE + str(exc)
    sealed = key.fernet().encrypt(bind(origin_of(url), secret).encode()).decode()
    return f"{WRAPPED}{key.key_id}.{sealed}"


def wrap_secrets(key: RegionSecret, kind: str, body: Any) -> Any:
    """The body with every provider key and secret header token re-encrypted for the region."""
    done: dict[tuple[str, str], str] = {}

    def wrap(token: str, url: str) -> str:
        if (token, url) not in done:
            done[token, url] = wrap_secret(key, token, url)
        return done[token, url]

    for message in probe_messages(kind, body):
        provider, request = message.get("provider"), message.get("request")
        if not isinstance(provider, dict):
            continue
        url = str(provider.get("base_url", ""))
        provider["api_key_token"] = wrap(str(provider.get("api_key_token") or ""), url)
        if isinstance(request, dict):
            token = str(request.get("secret_headers_token") or "")
            request["secret_headers_token"] = wrap(token, url)
    return body


def seal_dispatch(
    kind: str, queue: str, message: dict[str, Any], expires: datetime
) -> dict[str, Any]:
    """What the beat puts on a region queue: the message with its secrets re-encrypted for
    the region, signed with the region's newest key, valid until `expires`."""
    region = queue.removeprefix("probes.")
    key = signing_key(region)
    body = wrap_secrets(key, kind, json.loads(json.dumps(message)))
    return seal(key, region, kind, body, expires.timestamp())


@dataclass(frozen=True)
class Opened:
    """Results opened by ingest: the signing region, the body, and when the worker sealed
    them (its signed issue time, clamped to our clock: a worker whose clock runs fast cannot
    make its results look sealed earlier than we got them, nor later than they were).
    Lateness is judged by this time, not by when ingest got to them: results that waited out
    an ingest or broker outage were still sealed in time."""

    region_id: int
    body: Any
    sealed_at: datetime


def results_grace() -> timedelta:
    """How long after its deactivation a region key still opens results: as long as a result
    can wait and still be stored. A result is kept only for an open slot, and closed slots
    (missed ones included) are deleted after SLOT_RETENTION_DAYS, so nothing sealed before a
    rotation (in a worker's spool, the ingest queue or the dead letters) can be stored later
    than that; past it, the key opens nothing."""
    return timedelta(days=settings.SLOT_RETENTION_DAYS)


def open_results(envelope: object, kind: str) -> Opened:
    """Ingest's side: results signed with an active key of their region, or with one
    deactivated less than `results_grace` ago (results sealed before a rotation still count,
    for that key's region only); Refused otherwise. KeyUnavailable when the key's secret
    cannot be decrypted (the results wait for that to be fixed)."""
    from django.db.models import Q
    from django.utils import timezone

    from monitor.models import RegionKey

    kid = envelope.get("kid") if isinstance(envelope, dict) else None
    now = timezone.now()
    usable = Q(is_active=True) | Q(deactivated_at__gte=now - results_grace())
    row = (
        RegionKey.objects.filter(usable, key_id=kid).select_related("region").first()
        if isinstance(kid, str)
        else None
    )
    if row is None:
        raise Refused("signed with a key that is not a region key (or one retired too long)")
    try:
        key = RegionSecret(row.key_id, row.get_secret())
    except ApiKeyDecryptionError as exc:
        raise KeyUnavailable(f"region key {row.key_id}: {exc}") from None
    clock = now.timestamp()
    _, opened = verify(envelope, {key.key_id: key}, row.region.slug, kind, clock, future_ok=True)
    issued_at = float(opened["issued_at"])
    if issued_at > clock + CLOCK_SKEW_S:
        _clock_ahead(row.region.slug, issued_at - clock)
    sealed_at = datetime.fromtimestamp(min(issued_at, clock), tz=UTC)
    return Opened(row.region_id, opened["body"], sealed_at)


def _clock_ahead(region_slug: str, ahead_s: float) -> None:
    """A region worker's clock runs ahead of ours: its results still count (sealed as of our
    now), but its batches may look expired to it early; say so where an admin looks."""
    from monitor.models import Heartbeat

    log.warning(
        "results from region %s were sealed %.0f s in the future: that worker's clock is "
        "ahead of this server's (sealed time taken as now)",
        region_slug,
        ahead_s,
    )
    Heartbeat.add(CLOCK_AHEAD_COUNTER + region_slug)


# --- a region worker's side (RW_REGION, RW_REGION_KEYS; no master key) ------------------------


@cache
def _parse_keys(raw: str) -> dict[str, RegionSecret]:
    keys = {}
    for entry in raw.split(","):
        key_id, _, secret = entry.strip().partition(":")
        if key_id and secret:
            keys[key_id] = RegionSecret(key_id, secret)
            register_secret(secret)
    return keys


def worker_keys() -> dict[str, RegionSecret]:
    return _parse_keys(settings.RW_REGION_KEYS)


@cache
def _redis() -> Any:
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)


def _claimer() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _dead_here(claimer: str) -> bool:
    """Did a process of this host claim it, one that no longer runs (killed mid-batch)?"""
    host, _, pid = claimer.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _nonce_ttl_s(expires_at: float | None) -> int:
    return max(1, int((expires_at or clock.now() + 86400) - clock.now() + CLOCK_SKEW_S) + 1)


def claim_nonce(region: str, nonce: str, expires_at: float | None) -> bool:
    """True when this process may run the message: the first time it is seen, and for Celery's
    redelivery of a message whose worker process died running it (acks_late,
    reject_on_worker_lost), once. Kept until the message expires.

    Two records decide: this host's own (monitor.pipeline.region.replay), which refuses what this host
    ran or runs whatever the broker says, and the broker's (`rw:nonce:<region>:<nonce>`, SET NX,
    naming the claiming process), which refuses what another host claimed. A claim in the
    broker naming a process of this host is taken over only when this host's record says that
    process died running it: a claim rewritten by whoever can write to the broker proves
    nothing."""
    local = replay.claim(region, nonce, expires_at)
    if local is replay.Claim.REFUSED:
        return False
    ttl = _nonce_ttl_s(expires_at)
    key = f"rw:nonce:{region}:{nonce}"
    me = _claimer().encode()
    client = _redis()
    if client.set(key, me, nx=True, ex=ttl):
        return True
    held = client.get(key)
    taken = held is not None and _may_take_over(local, held.decode(errors="replace"))
    if taken and _take_over(client, key, held, me, ttl):
        return True
    replay.settle(region, nonce)  # claimed elsewhere: never run here either
    return False


def _may_take_over(local: replay.Claim, held: str) -> bool:
    if local is replay.Claim.RETAKEN:  # this host's record: its claimer here died
        return held.rpartition(":")[0] == socket.gethostname()
    if local is replay.Claim.UNRECORDED:  # no local record (a full disk): the broker's alone
        return _dead_here(held)
    return False  # this host never claimed it, whatever the broker's record says


def _take_over(client: Any, key: str, held: bytes, me: bytes, ttl: int) -> bool:
    """Replace the dead claimer's claim (compare-and-set: one redelivery wins)."""
    with client.pipeline() as pipe:
        try:
            pipe.watch(key)
            if pipe.get(key) != held:
                return False
            pipe.multi()
            pipe.set(key, me, ex=ttl)
            pipe.execute()
        except Exception as exc:  # WatchError: another process took it first
            log.info("nonce take-over lost (%s)", type(exc).__name__)
            return False
    return True


def count_run(region: str, nonce: str, expires_at: float | None, kind: str, body: Any) -> int:
    """Count a run of a message about to start (its probes are about to be sent); returns
    which run it is. A run after the first (a redelivery after a killed worker, a replay on
    another host) is reported to the spend ledger at once, each probe for its (task, route):
    ingest keeps one result a slot, so the cap would never see what it cost
    (monitor.stats.spend)."""
    from monitor.stats import spend

    client = _redis()
    key = f"rw:runs:{region}:{nonce}"
    with client.pipeline(transaction=True) as pipe:
        pipe.incr(key)
        pipe.expire(key, _nonce_ttl_s(expires_at))
        runs = int(pipe.execute()[0])
    if runs > 1:
        slots = [
            (slot["task_id"], slot["route_id"])
            for message in probe_messages(kind, body)
            if isinstance(slot := message.get("slot"), dict)
            and isinstance(slot.get("task_id"), int)
            and isinstance(slot.get("route_id"), int)
        ]
        spend.record_reruns(client, region, slots, time.time())
        log.warning(
            "running a %s message again (run %d): %d probes counted in flight",
            kind,
            runs,
            len(slots),
        )
    return runs


def open_dispatch(envelope: object, kind: str) -> tuple[str, Any]:
    """A region worker's side: (key id, body) of a message for this region, or Refused."""
    if not settings.RW_REGION:
        raise Refused("this worker has no RW_REGION, so it accepts no region messages")
    key, opened = verify(envelope, worker_keys(), settings.RW_REGION, kind)
    body = opened["body"]
    if kind == KIND_BATCH and isinstance(body, dict) and body.get("region") != settings.RW_REGION:
        raise Refused("batch for another region")
    region, nonce, expires_at = settings.RW_REGION, opened["nonce"], opened["expires_at"]
    try:
        first = claim_nonce(region, nonce, expires_at)
        if first:
            count_run(region, nonce, expires_at, kind, body)
    except Exception as exc:  # redis-py raises several types; fail closed
        if not isinstance(exc, replay.Unavailable):
            replay.settle(region, nonce)  # not run: never run here later either
        raise Refused(f"cannot check for a replay ({type(exc).__name__})") from None
    if not first:
        raise Refused("replayed (its nonce was seen before)")
    return key.key_id, body


def seal_results(
    key_id: str, kind: str, body: object, issued_at: float | None = None
) -> dict[str, Any]:
    """Results signed with the key the batch came under (active at the beat), issued now or
    at `issued_at` (when the worker had them in hand: monitor.pipeline.region.outbox)."""
    keys = worker_keys()
    key = keys.get(key_id) or next(iter(keys.values()))
    return seal(key, settings.RW_REGION, kind, body, None, issued_at)


def open_secret(token: str, url: str) -> str:
    """A provider secret from a message, opened only for `url`'s origin.

    Region-wrapped tokens open with this worker's region keys. A process that holds
    FIELD_ENCRYPTION_KEYS (not a region worker: the CLI, tests running the worker in-process)
    also opens stored tokens, bound the same way."""
    if not token:
        return ""
    if token.startswith(UNUSABLE):
        raise SecretRefused(token.removeprefix(UNUSABLE)[:200])
    if token.startswith(WRAPPED):
        key_id, _, sealed = token.removeprefix(WRAPPED).partition(".")
        key = worker_keys().get(key_id)
        if key is None:
            raise SecretRefused("encrypted for a region key this worker does not hold")
        try:
            plaintext = key.fernet().decrypt(sealed.encode()).decode()
        except InvalidToken:
            raise SecretRefused("cannot be decrypted with this region's key") from None
        origin, secret = unbind(plaintext)
        if origin is None or origin != origin_of(url):
            raise SecretRefused("bound to another origin than the probe's base URL")
        register_secret(secret)
        return secret
    if settings.WORKER_ONLY or not settings.FIELD_ENCRYPTION_KEYS:
        raise SecretRefused("not encrypted for this region")
    try:
        return decrypt_bound(token, url)
    except ApiKeyDecryptionError as exc:
        raise SecretRefused(str(exc)) from None
