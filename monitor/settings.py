"""Routewatch settings: everything comes from environment variables (see .env.example).

A malformed value stops start-up with a message naming the variable. PostgreSQL only.
The local stack (`devstack/`, behind `make run`, `make test` and `manage.py`) fills in
DATABASE_URL / REDIS_URL for the processes it starts; these settings never import it.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from monitor import limits
from monitor.crypto import fernet_key_is_valid
from monitor.env import SettingsError, envbool, envint, envlist, envsecret, envstr

# The type parameters django-stubs gives Django's classes (ModelAdmin[Task], ModelForm[Task])
# work at run time too; before any model or admin class is defined.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(envstr("RW_VAR_DIR", str(BASE_DIR / "var")))


def _fail(message: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"Routewatch configuration error: {message}")


def _verified_broker_url(url: str, ca_file: str) -> str:
    """A rediss:// URL that verifies the broker's certificate whoever reads it: kombu's Redis
    transport (Celery) does not verify one without `ssl_cert_reqs` (it warns and goes on
    insecurely), redis-py does; both read these query parameters, so every client of the
    broker (Celery, the beacons, the nonce claims) verifies against the same CA."""
    if not url.startswith("rediss://"):
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.setdefault("ssl_cert_reqs", "required")
    if ca_file:
        query.setdefault("ssl_ca_certs", ca_file)
    return urlunsplit(parts._replace(query=urlencode(query)))


try:
    DEBUG = envbool("DEBUG", False)
    # A region worker reaches only the broker: no database settings needed or used.
    WORKER_ONLY = envbool("RW_WORKER_ONLY", False)
    _database_url = "" if WORKER_ONLY else envstr("DATABASE_URL")
    # Region workers: "host:port=host:port,..." sends a provider's traffic through another
    # address (the demo's per-region delay proxies), like curl --connect-to.
    CONNECT_TO = envlist("RW_CONNECT_TO", [])
    REDIS_URL = envsecret("REDIS_URL")
    # The CA a rediss:// broker's certificate must chain to (a region elsewhere: the broker's
    # own CA, docs/remote-regions.md); empty: the system's CAs.
    REDIS_CA_FILE = envstr("REDIS_CA_FILE")
    # A region worker whose clock is further than this from the broker's (Redis TIME, the
    # central clock) refuses work, with a logged reason, until its time sync is fixed; within
    # it, the worker judges expiry and start times by the central clock (its own plus the
    # measured offset: monitor.pipeline.region.clock).
    CLOCK_TOLERANCE_SECONDS = envint("RW_CLOCK_TOLERANCE_SECONDS", 300, minimum=1, maximum=3600)
    # A region worker that has taken nothing for this long while messages wait in its queue and
    # it has threads free has stopped consuming (celery#10205): it exits, and its supervisor
    # starts it again (monitor.pipeline.region.liveness).
    CONSUMER_STALL_SECONDS = envint("RW_CONSUMER_STALL_SECONDS", 20, minimum=5, maximum=3600)
    # How long any exchange with the broker may take before the connection is taken as dead
    # (a WAN path cut without a reset), and how often an idle or consuming connection is
    # checked (kombu's health_check_interval): see CELERY_BROKER_TRANSPORT_OPTIONS.
    BROKER_SOCKET_TIMEOUT_S = envint("RW_BROKER_SOCKET_TIMEOUT_SECONDS", 5, minimum=2, maximum=300)
    BROKER_HEALTH_CHECK_S = envint("RW_BROKER_HEALTH_CHECK_SECONDS", 5, minimum=1, maximum=300)
    # A region worker holds no SECRET_KEY, database, mail or master key: its region's own
    # secrets (RW_REGION_KEYS, "key_id:secret,...") authenticate what it is sent and open
    # the provider keys the beat re-encrypted for it (monitor.pipeline.signing).
    RW_REGION = envstr("RW_REGION")
    RW_REGION_KEYS = envsecret("RW_REGION_KEYS")
    SECRET_KEY = envsecret("SECRET_KEY")
    ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1"])
    SITE_URL = envstr("SITE_URL", "http://localhost:8000").rstrip("/")
    CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
    # Behind a TLS-terminating proxy that sets X-Forwarded-Proto (and strips it from clients).
    BEHIND_TLS_PROXY = envbool("BEHIND_TLS_PROXY", False)
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", False)
    TIME_ZONE = envstr("TIME_ZONE", "UTC")
    FIELD_ENCRYPTION_KEYS = [
        k.strip() for k in envsecret("FIELD_ENCRYPTION_KEYS").split(",") if k.strip()
    ]
    # Login throttling (django-axes): this many wrong passwords lock the user name out for
    # AXES_COOLOFF_MINUTES.
    AXES_FAILURE_LIMIT = envint("AXES_FAILURE_LIMIT", 5, minimum=1)
    _axes_cooloff_minutes = envint("AXES_COOLOFF_MINUTES", 30, minimum=1)
    CONN_MAX_AGE = envint("DB_CONN_MAX_AGE", 60, minimum=0)
    PUBLIC_READONLY_PAGES = envbool("PUBLIC_READONLY_PAGES", False)
    # Dashboard pages: how often the overview refreshes itself; /metrics bearer token for
    # Prometheus scrapers (empty: /metrics follows the same login rule as the pages).
    DASHBOARD_REFRESH_SECONDS = envint("DASHBOARD_REFRESH_SECONDS", 15, minimum=1, maximum=3600)
    # A page's body (its figures, rendered) is built once and read by every viewer for this
    # long, then built again in the background while readers get the last one for up to
    # PAGE_SHARE_MAX_AGE_SECONDS (monitor.pages.shared). 0: every read builds its own.
    PAGE_SHARE_SECONDS = envint("PAGE_SHARE_SECONDS", 5, minimum=0, maximum=300)
    PAGE_SHARE_MAX_AGE_SECONDS = envint("PAGE_SHARE_MAX_AGE_SECONDS", 7, minimum=0, maximum=900)
    METRICS_BEARER_TOKEN = envsecret("METRICS_BEARER_TOKEN")
    # OTLP/HTTP export of each stored probe as OpenTelemetry GenAI metrics, from ingest
    # (monitor.pipeline.ingest.genai_otlp); off unless one of these is set. The SDK reads the rest
    # from the environment itself (OTEL_EXPORTER_OTLP_HEADERS, OTEL_METRIC_EXPORT_INTERVAL, ...),
    # and its resource detection reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES: they are
    # honoured as given, "routewatch" being the service name only when neither names one.
    OTEL_EXPORTER_OTLP_ENDPOINT = envstr("OTEL_EXPORTER_OTLP_ENDPOINT")
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT = envstr("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    # Exports stream at most this many rows (a bound on one request's work).
    EXPORT_MAX_ROWS = envint("EXPORT_MAX_ROWS", 100_000, minimum=1)
    PROVIDER_ALLOW_PRIVATE_NETWORKS = envbool("PROVIDER_ALLOW_PRIVATE_NETWORKS", False)
    TICK_SECONDS = envint("TICK_SECONDS", 10, minimum=1, maximum=3600)
    # The tick claims each probe slot this long before its time and sends it at once; the
    # region worker starts the probe at the slot's time. A slow tick or a queue's wait then
    # delays no probe, as long as they take less than this less one tick (docs/schedules.md).
    # Two ticks by default; 0 claims slots only once their time has come.
    SCHEDULE_AHEAD_SECONDS = envint(
        "SCHEDULE_AHEAD_SECONDS",
        min(2 * TICK_SECONDS, limits.SCHEDULE_AHEAD_MAX_S),
        minimum=0,
        maximum=limits.SCHEDULE_AHEAD_MAX_S,
    )
    ALERT_EVALUATION_SECONDS = envint("ALERT_EVALUATION_SECONDS", 30, minimum=1, maximum=3600)
    RAW_RETENTION_DAYS = envint("RAW_RETENTION_DAYS", 90, minimum=1)
    # Closed slots are bookkeeping (the result rows hold the outcome): kept this long, so a
    # late result can still find its slot, and the slot table stays a week, not 90 days.
    SLOT_RETENTION_DAYS = envint("SLOT_RETENTION_DAYS", 7, minimum=1)
    # A slot with no result by its probe deadline plus this grace is recorded missed.
    SLOT_GRACE_SECONDS = envint("SLOT_GRACE_SECONDS", 60, minimum=1)
    CELERY_TASK_SOFT_TIME_LIMIT = envint("CELERY_TASK_SOFT_TIME_LIMIT", 300, minimum=1)
    CELERY_TASK_TIME_LIMIT = envint("CELERY_TASK_TIME_LIMIT", 360, minimum=1)
    # Ingest: a database error is retried this many times with exponential backoff (1 s, 2 s,
    # ... up to INGEST_RETRY_BACKOFF_MAX_S); then the message is parked in the dead-letter list
    # (the status page shows it; `manage.py replay_dead_letters` or its button replays it).
    INGEST_RETRY_MAX = envint("INGEST_RETRY_MAX", 12, minimum=0, maximum=100)
    INGEST_RETRY_BACKOFF_MAX_S = envint(
        "INGEST_RETRY_BACKOFF_MAX_S",
        limits.INGEST_RETRY_BACKOFF_MAX_S,
        minimum=1,
        maximum=limits.INGEST_RETRY_BACKOFF_MAX_S,
    )
    DEAD_LETTER_MAX = envint("DEAD_LETTER_MAX", 10_000, minimum=1)
    # An ingest message a worker took and has held unacknowledged this long, with no retry
    # time ahead of it, goes back to the ingest queue (monitor.pipeline.queues.take_back_stalled):
    # its worker died or lost the broker before running it. Ingest is idempotent, so a copy
    # that was only slow is stored once. Without this, Redis gives it back only after the
    # visibility timeout (about 17 minutes).
    INGEST_STALLED_SECONDS = envint("INGEST_STALLED_SECONDS", 30, minimum=2, maximum=3600)
    # Region workers: results that cannot be published (broker down) wait in this directory,
    # at most this many batches and bytes (the oldest are dropped, with a counted log line),
    # and are published again every RW_SPOOL_RETRY_SECONDS and before each new batch.
    SPOOL_DIR = Path(envstr("RW_SPOOL_DIR") or str(VAR_DIR / "spool"))
    SPOOL_MAX_BATCHES = envint("RW_SPOOL_MAX_BATCHES", 2000, minimum=1)
    SPOOL_MAX_BYTES = envint("RW_SPOOL_MAX_BYTES", 256 * 1024 * 1024, minimum=1024)
    SPOOL_RETRY_SECONDS = envint("RW_SPOOL_RETRY_SECONDS", 15, minimum=1, maximum=3600)
    # A region worker sends its batch's results in chunks this often as probes end (0: all at
    # the batch's end, up to one tick later). Smaller: less ingest lag, more ingest messages.
    RESULT_FLUSH_SECONDS = envint("RW_RESULT_FLUSH_SECONDS", 2, minimum=0, maximum=60)
    # A region worker process runs at most this many probes at once, across all the batches,
    # races and scenarios it holds (monitor.pipeline.region.worker); past it, probes wait and their
    # start lag grows. The engine carries well over 1,000 streams a process (bench/RESULTS.md).
    PROBES_IN_FLIGHT_MAX = envint("RW_PROBES_IN_FLIGHT", 2000, minimum=1, maximum=100_000)
    # A probe that would start more than this after its planned start is not run: its slot is
    # recorded missed ("started late"), with its lag, so a saturated region shows as missed
    # slots, never as a sample taken at another time than planned.
    START_LAG_MAX_SECONDS = envint("RW_START_LAG_MAX_SECONDS", 10, minimum=1, maximum=600)
    # Celery workers (region, ingest, scheduler) lower their CPU priority to this nice value at
    # start (monitor.celery), so a page someone waits on gets a CPU first on a shared machine.
    # Probe timings come from the kernel's receive timestamps, so waiting for a CPU does not
    # enter them. 0: the same priority as the web.
    WORKER_NICE = envint("RW_WORKER_NICE", 10, minimum=0, maximum=19)
    # A region worker (RW_REGION set) keeps the web's priority by default: a probe's start lag
    # counts every moment it waits for a CPU (its timings do not: kernel timestamps), and at
    # nice 10 beside busy ingest and pages a region worker's start lag p99 was 12 s against
    # 154 ms at nice 0 (bench/RESULTS.md, make bench-region). Its probes cost little CPU.
    REGION_WORKER_NICE = envint("RW_REGION_WORKER_NICE", 0, minimum=0, maximum=19)
    EMAIL_BACKEND = envstr("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
    EMAIL_HOST = envstr("EMAIL_HOST", "localhost")
    EMAIL_PORT = envint("EMAIL_PORT", 25, minimum=1, maximum=65535)
    EMAIL_HOST_USER = envstr("EMAIL_HOST_USER")
    EMAIL_HOST_PASSWORD = envsecret("EMAIL_HOST_PASSWORD")
    EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", False)
    EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", False)
    EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT", 30, minimum=1)
    EMAIL_FILE_PATH = envstr("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
    DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "Routewatch <routewatch@localhost>")
    # Weekly digest: a p50/p95 worse than last week's by more than this percent is a regression.
    DIGEST_REGRESSION_PCT = envint("DIGEST_REGRESSION_PCT", 20, minimum=1, maximum=1000)
    DIGEST_UNSUBSCRIBE_MAX_AGE_DAYS = envint("DIGEST_UNSUBSCRIBE_MAX_AGE_DAYS", 90, minimum=1)
    LOG_LEVEL = envstr("LOG_LEVEL", "INFO").upper()
except SettingsError as exc:
    raise _fail(str(exc)) from None

# Values a deployment must replace (the .env.example placeholders, and the like).
_PLACEHOLDERS = ("change-me", "changeme", "replace-me", "your-secret", "secret-key")
if WORKER_ONLY and not SECRET_KEY:
    # A region worker signs nothing with it; Django still wants one.
    SECRET_KEY = secrets.token_urlsafe(50)
if not SECRET_KEY:
    raise _fail("SECRET_KEY is not set (make run and make test create one under ./var).")
if len(SECRET_KEY) < 50 or any(p in SECRET_KEY.lower() for p in _PLACEHOLDERS):
    raise _fail(
        "SECRET_KEY is a placeholder or shorter than 50 characters. Make one with: "
        'python -c "import secrets; print(secrets.token_urlsafe(50))"'
    )
if not _database_url and not WORKER_ONLY:
    raise _fail(
        "DATABASE_URL is not set. "
        "Set DATABASE_URL=postgresql://user:pass@host:5432/name, or use `make run` / manage.py, "
        "which start the embedded one."
    )
if not REDIS_URL:
    raise _fail(
        "REDIS_URL is not set (redis://host:6379/0); `make run` and manage.py start an embedded one."
    )
if not REDIS_URL.startswith(("redis://", "rediss://")):
    raise _fail(f"REDIS_URL must start with redis:// or rediss://, got {REDIS_URL.split(':')[0]}:")
REDIS_URL = _verified_broker_url(REDIS_URL, REDIS_CA_FILE)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise _fail("EMAIL_USE_TLS and EMAIL_USE_SSL cannot both be true.")
if LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise _fail(f"LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {LOG_LEVEL!r}")
try:
    ZoneInfo(TIME_ZONE)
except (ZoneInfoNotFoundError, ValueError):
    raise _fail(
        f"TIME_ZONE must be an IANA time zone such as Europe/Paris, got {TIME_ZONE!r}"
    ) from None
if not SITE_URL.startswith(("http://", "https://")):
    raise _fail(f"SITE_URL must start with http:// or https://, got {SITE_URL!r}")
# The dashboard's own origin is trusted for CSRF (a login behind a TLS-terminating proxy).
_site_origin = "{0.scheme}://{0.netloc}".format(urlsplit(SITE_URL))
if _site_origin not in CSRF_TRUSTED_ORIGINS:
    CSRF_TRUSTED_ORIGINS.append(_site_origin)
if BEHIND_TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# API keys of providers are encrypted with the first key; the others still decrypt (rotation).
# A region worker has none: it opens only what the beat re-encrypted for its region.
if WORKER_ONLY:
    if not RW_REGION or not RW_REGION_KEYS:
        raise _fail(
            "a region worker (RW_WORKER_ONLY=true) needs RW_REGION (its region's slug) and "
            "RW_REGION_KEYS (key_id:secret, from `manage.py region_key new <slug>`)."
        )
elif not FIELD_ENCRYPTION_KEYS:
    raise _fail(
        "FIELD_ENCRYPTION_KEYS is not set. Make one with: "
        'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
    )
for _position, _key in enumerate(FIELD_ENCRYPTION_KEYS, start=1):
    if any(p in _key.lower() for p in _PLACEHOLDERS) or not fernet_key_is_valid(_key):
        raise _fail(
            f"FIELD_ENCRYPTION_KEYS entry {_position} is not a Fernet key "
            "(32 url-safe base64-encoded bytes)."
        )

if not _database_url.startswith(("postgres://", "postgresql://")) and _database_url:
    raise _fail(
        "DATABASE_URL must be a PostgreSQL URL (postgresql://...); nothing else is supported."
    )
DATABASES: dict[str, dict[str, Any]] = {}
if _database_url:
    try:
        _db: dict[str, Any] = dict(dj_database_url.parse(_database_url, conn_max_age=CONN_MAX_AGE))
    except Exception as exc:  # dj-database-url raises several types for a bad URL
        raise _fail(f"DATABASE_URL is malformed ({exc.__class__.__name__}).") from None
    _db["CONN_HEALTH_CHECKS"] = True
    _db["OPTIONS"] = {
        **_db.get("OPTIONS", {}),
        "application_name": Path(sys.argv[0]).name[:60] or "routewatch",
    }
    DATABASES["default"] = _db
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "template_partials",
    "axes",
    "monitor",
]

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out user name before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Lock out by user name and address together: wrong passwords for a user from one address lock
# that address out for that user only, so nobody can lock the administrator out from elsewhere
# (the default user is `admin`); one address trying many user names is throttled as a whole
# (monitor.logins). Behind a reverse proxy, set its hop count so the client's address is read
# (axes.W006 warns about lockouts by address behind an unconfigured proxy).
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
SILENCED_SYSTEM_CHECKS = ["axes.W006"]
AXES_COOLOFF_TIME = _axes_cooloff_minutes / 60  # hours
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False

MIDDLEWARE = [
    # Before anything that validates the Host header: compose healthchecks ask 127.0.0.1.
    "monitor.middleware.HealthzMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "monitor.middleware.ContentSecurityPolicyMiddleware",
    # Last: turns a lockout from the authentication backend into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "monitor.urls"
WSGI_APPLICATION = "monitor.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "rw-overview"
LOGOUT_REDIRECT_URL = "login"

SESSION_COOKIE_HTTPONLY = True
try:
    SESSION_COOKIE_SECURE = envbool("SECURE_COOKIES", SITE_URL.startswith("https://"))
except SettingsError as exc:
    raise _fail(str(exc)) from None
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

# --- Celery (cookiecutter-django style: settings namespaced CELERY_) ---------------------------
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes every database connection before and after each task unless
# this is set; it then closes them only every this many tasks. Each ingest message, tick and
# rebuild paid a new PostgreSQL backend for it (its process, its catalog caches cold, ingest's
# temporary table made and dropped again): 7 new sessions a second at bench-load's 1x
# (bench/RESULTS.md). Connections now live as in the web, by CONN_MAX_AGE and
# CONN_HEALTH_CHECKS (monitor.celery closes the old or broken ones around each task); the
# fixup's own count is only a backstop.
CELERY_DB_REUSE_MAX = 100_000
# Reconnects to a lost broker at most 3 s apart (kombu's default grows to 30 s).
CELERY_WORKER_CONSUMER = "monitor.celery:BoundedRetryConsumer"
# Nothing sends a region worker remote-control commands (its state is its beacon,
# monitor.pipeline.region.liveness). Across a WAN its pidbox is a Redis PUBSUB connection
# more to lose, and the one whose loss crashed the worker when the broker restarted: kombu
# failed to close the consumer's channel ("Unrecoverable error: AttributeError: 'NoneType'
# object has no attribute 'hostname'", the PUBSUB read failing while a BRPOP was in flight),
# and the worker was restarted instead of reconnecting (tests/monitor/pipeline/test_remote_region.py).
CELERY_WORKER_ENABLE_REMOTE_CONTROL = not RW_REGION
# Derived from the longest probe deadline (monitor.limits), like the region tasks' limits.
# A broker across a WAN can vanish without closing the connection (a cut path, a NAT or a
# firewall forgetting it): every exchange is bounded, so a region worker notices within
# seconds and reconnects, and a result it cannot publish goes to its spool instead of waiting
# forever. kombu drops a consumer's BRPOP connection whose reply is overdue by
# health_check_interval (at most 1 + 2 * 5 s after the path went quiet), and Celery reconnects.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": limits.VISIBILITY_TIMEOUT_S,
    "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
    "socket_connect_timeout": BROKER_SOCKET_TIMEOUT_S,
    "socket_keepalive": True,
    "health_check_interval": BROKER_HEALTH_CHECK_S,
}
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    # monitor.pipeline.queues.SCHEDULE_QUEUE: its own worker process (the scheduler).
    "monitor.tasks.tick": {"queue": "schedule"},
    "monitor.tasks.ingest_results": {"queue": "ingest"},
    "monitor.tasks.ingest_race": {"queue": "ingest"},
    "monitor.tasks.ingest_scenario": {"queue": "ingest"},
    # Alerts: evaluation and delivery on the default queue (monitor.alerts).
    "monitor.tasks.evaluate_alerts": {"queue": "default"},
    "monitor.tasks.deliver_alerts": {"queue": "default"},
}
# Every periodic task expires by its next run: during an outage of its worker, ticks do not
# pile up in the queue to run all at once when it returns (the next one does the work).
CELERY_BEAT_SCHEDULE = {
    "tick": {
        "task": "monitor.tasks.tick",
        "schedule": float(TICK_SECONDS),
        "options": {"expires": float(TICK_SECONDS)},
    },
    "retention": {
        "task": "monitor.tasks.delete_old_results",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
    # Raw results' daily partitions, created days ahead (monitor.partitions).
    "partitions": {
        "task": "monitor.tasks.ensure_partitions",
        "schedule": 3600.0,
        "options": {"expires": 3600.0},
    },
    # Digests go out at a chosen local hour; a few minutes late is fine, and cheap to ask.
    "digests": {
        "task": "monitor.tasks.send_digests",
        "schedule": 300.0,
        "options": {"expires": 300.0},
    },
    # The overview snapshot is rebuilt twice per dashboard refresh (monitor.answer.board).
    "overview": {
        "task": "monitor.tasks.refresh_overview",
        "schedule": max(1.0, DASHBOARD_REFRESH_SECONDS / 2),
        "options": {"expires": float(DASHBOARD_REFRESH_SECONDS)},
    },
}
# Alert rules are evaluated (and due notifications sent) this often (monitor.alerts).
CELERY_BEAT_SCHEDULE["alerts"] = {
    "task": "monitor.tasks.evaluate_alerts",
    "schedule": float(ALERT_EVALUATION_SECONDS),
    "options": {"expires": float(ALERT_EVALUATION_SECONDS)},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# --- logging: API keys never reach a log line (monitor.logfilters.RedactSecrets) -------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "redact": {"()": "monitor.logfilters.RedactSecrets"},
        "require_debug_true": {"()": "django.utils.log.RequireDebugTrue"},
        "require_debug_false": {"()": "django.utils.log.RequireDebugFalse"},
    },
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "django.server": {
            "()": "django.utils.log.ServerFormatter",
            "format": "[{server_time}] {message}",
            "style": "{",
        },
    },
    # Django's own handlers (django.utils.log.DEFAULT_LOGGING) are declared again here with
    # the redaction filter, so they keep it however often logging is configured: django.setup
    # configures it afresh each time it runs, and Celery's Django fixup runs it again.
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact"]},
        "django_console": {
            "class": "logging.StreamHandler",
            "level": "INFO",
            "filters": ["require_debug_true", "redact"],
        },
        "django.server": {
            "class": "logging.StreamHandler",
            "level": "INFO",
            "formatter": "django.server",
            "filters": ["redact"],
        },
        "mail_admins": {
            "class": "django.utils.log.AdminEmailHandler",
            "level": "ERROR",
            "filters": ["require_debug_false", "redact"],
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django": {"handlers": ["django_console", "mail_admins"], "level": "INFO"},
        "django.server": {"handlers": ["django.server"], "level": "INFO", "propagate": False},
        "django.db.backends": {"level": "INFO"},
    },
}
