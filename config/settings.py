"""Settings, all read from the environment through django-environ.

Safe by default: DEBUG is off unless asked for, and a missing SECRET_KEY only
falls back to a development key while DEBUG is on.
"""

from __future__ import annotations

from pathlib import Path

import environ

from config.database import database_config, extra_aliases

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str(
    "SECRET_KEY",
    default="dev-only-insecure-key-set-SECRET_KEY-in-production" if DEBUG else "",
)
if not SECRET_KEY:
    # Django refuses to start without one; say what to do instead of a traceback.
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("Set SECRET_KEY (or DEBUG=1 for a development key).")

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    # Layered: each app imports only the ones above it in this list (see docs/architecture.md).
    "core",
    "inventory",
    "ledger",
    "reservations",
    "capacity",
    "operations",
    "worker",
    "fleets",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Outermost after it: every answer says its X-Request-ID, and the JSON log its request line.
    "core.request_id.RequestIdMiddleware",
    # API answers counted by method and status, and each create's outcome (GET /metrics).
    "operations.metrics.middleware.MetricsMiddleware",
    # The admin's and the API docs' static files, served by the app server itself,
    # from the apps' folders (no collectstatic step, no CDN, same in dev and production).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Django's sessions, user and messages, for the admin's pages; the API's methods (bearer
    # tokens only) pass them by (core/pages_middleware.py).
    "core.pages_middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "core.pages_middleware.AuthenticationMiddleware",
    "core.pages_middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Nodes are told about a create or a release after its response has gone out.
    "reservations.api.middleware.DeliverAfterResponse",
]

ROOT_URLCONF = "config.urls"

# The Procfile's `agents` process: an ASGI server that answers only the agents' long poll
# (`config.agents_urls`) with async views, so it runs only middleware that is async too.
AGENTS_PROCESS = env.bool("AGENTS_PROCESS", default=False)
if AGENTS_PROCESS:
    ROOT_URLCONF = "config.agents_urls"
    MIDDLEWARE = ["django.middleware.security.SecurityMiddleware", "core.request_id.RequestIdMiddleware"]
# Where agents long-poll `nodes/assignments` (the `agents` process), told them by `nodes/register`;
# empty: the web process's own URL (its threaded method, fine for a few dozen agents).
AGENT_ASSIGNMENTS_URL = env.str("AGENT_ASSIGNMENTS_URL", default="")

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

WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

DATABASES = {"default": database_config(env, BASE_DIR)}
# Past one machine (docs/scaling.md): a streaming replica for the reads that may lag, a
# direct connection to the primary beside a transaction pooler; neither exists unless set.
DATABASES |= extra_aliases(env)
DATABASE_ROUTERS = ["config.routers.ReplicaRouter"]
# Reads leave the replica when it lags more than this, or when the tenant wrote this recently.
DATABASE_REPLICA_MAX_LAG_SECONDS = env.float("DATABASE_REPLICA_MAX_LAG_SECONDS", default=5.0)
DATABASE_REPLICA_AFTER_WRITE_SECONDS = env.int("DATABASE_REPLICA_AFTER_WRITE_SECONDS", default=5)
DATABASE_REPLICA_CHECK_SECONDS = env.float("DATABASE_REPLICA_CHECK_SECONDS", default=1.0)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# WhiteNoise serves the apps' static files where they are (no collectstatic step), so
# there is no STATIC_ROOT to fill (an empty one would only make it warn at start).
WHITENOISE_USE_FINDERS = True

# API bodies above this size are refused with INVALID_INPUT before parsing.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("API_MAX_BODY_BYTES", default=1_048_576)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["core.authentication.BearerTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "core.api.envelope.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU capacity API",
    "DESCRIPTION": "Capacity, placement and reservations of a GPU cloud. "
    "Every method is `POST /api/compute/<group>/<method>` with a JSON object body.",
    # The document's version: minor for an addition, major for a break (docs/decisions.md).
    "VERSION": "1.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Inputs and outputs are separate serializers already: no `…Request` twin of each component.
    "COMPONENT_SPLIT_REQUEST": False,
    # 3.1: its schemas are JSON Schema 2020-12, which can say what a map's keys may be
    # (`patternProperties`), as a selector's attribute names and a pool's label keys need.
    "OAS_VERSION": "3.1.0",
    # Enum components named for what they are (a generated client's type names), not `StateEnum`.
    "ENUM_NAME_OVERRIDES": {
        "Binding": "reservations.request.types.BINDINGS",
        "ChangeKind": "reservations.models.DeliveryKind.values",
        "DeviceClass": "inventory.choices.DeviceClass.values",
        "ErrorCode": "core.errors.ERROR_CODES",
        "MaintenanceWindowState": "reservations.models.MaintenanceWindowState.values",
        "NodeBucket": "operations.api.serializers.NODE_BUCKETS",
        "QuotaMode": "ledger.models.QuotaMode.values",
        "ReservationState": "reservations.models.ReservationState.values",
        "Sharing": "inventory.choices.Sharing.values",
        "TaintEffect": "inventory.choices.TaintEffect.values",
        "Topology": "reservations.request.types.TOPOLOGIES",
        "UsageUnit": "capacity.api.usage.USAGE_UNITS",
    },
}

# The capacity reconciler's period (the seeds' `rollupEvery`).
CAPACITY_ROLLUP_EVERY_SECONDS = env.int("CAPACITY_ROLLUP_EVERY_SECONDS", default=300)
# Liveness: a node that has reported before and sent nothing for this long becomes
# `disconnected` (nodes that never reported, as fleet-file nodes, are not watched).
CAPACITY_NODE_STALE_SECONDS = env.int("CAPACITY_NODE_STALE_SECONDS", default=120)
# The worker sleeps until its next deadline or a NOTIFY, but never longer than this.
CAPACITY_WORKER_MAX_SLEEP_SECONDS = env.float("CAPACITY_WORKER_MAX_SLEEP_SECONDS", default=60.0)
# /healthz answers 503 when a worker job is overdue by more than this.
CAPACITY_WORKER_LAG_SECONDS = env.float("CAPACITY_WORKER_LAG_SECONDS", default=30.0)
# A delivery a node did not take is retried after this, doubling per attempt (capped at 5 min).
CAPACITY_DELIVERY_RETRY_SECONDS = env.float("CAPACITY_DELIVERY_RETRY_SECONDS", default=2.0)
# How long a MIG or slot layout change books the GPU's atoms (guard 2).
CAPACITY_LAYOUT_CHANGE_SECONDS = env.int("CAPACITY_LAYOUT_CHANGE_SECONDS", default=600)
# The booking horizon: a reservation may start at most this far after `compute_now()`
# (and so end at most this plus the longest duration, 366 days).
CAPACITY_MAX_START_AHEAD = env.int("CAPACITY_MAX_START_AHEAD", default=365 * 86400)
# Creates waiting for capacity (`wait.timeoutMs`): at most this many per tenant across
# every server, and per server process; beyond either the create answers 429 at once.
CAPACITY_WAITERS_PER_TENANT = env.int("CAPACITY_WAITERS_PER_TENANT", default=8)
CAPACITY_WAITERS_PER_PROCESS = env.int("CAPACITY_WAITERS_PER_PROCESS", default=16)
# Hourly usage: an hour is closed (written once) this long after it ends, and each time
# hours close, the hours closed this many hours before are counted again (a difference
# becomes a correction row).
CAPACITY_USAGE_CLOSE_GRACE_SECONDS = env.int("CAPACITY_USAGE_CLOSE_GRACE_SECONDS", default=300)
CAPACITY_USAGE_RECHECK_HOURS = env.int("CAPACITY_USAGE_RECHECK_HOURS", default=6)
# Writes (reservations/create, release, renew) per minute, counted across every server.
API_WRITES_PER_MINUTE_PER_TOKEN = env.int("API_WRITES_PER_MINUTE_PER_TOKEN", default=6000)
API_WRITES_PER_MINUTE_PER_TENANT = env.int("API_WRITES_PER_MINUTE_PER_TENANT", default=12000)
# BookingRepair retries the moves of reservations already at risk for at most this long per
# run (the rest in later runs, one per release cooldown): a run stays short on a busy fleet.
CAPACITY_REPAIR_RETRY_SECONDS = env.float("CAPACITY_REPAIR_RETRY_SECONDS", default=0.5)
# Between these scans of the whole fleet, BookingRepair looks for new problems only on the nodes
# a change named (`RepairRequest`): the scan catches what no change named, at a cost that grows
# with the fleet (about 1 s at 10,000 nodes and a million bookings). A worker scans on its first run.
CAPACITY_REPAIR_FLEET_SCAN_SECONDS = env.float("CAPACITY_REPAIR_FLEET_SCAN_SECONDS", default=300)
# A signed-in token is remembered this long per process (`core.auth_cache`), forgotten at
# once on any revocation (NOTIFY); 0 reads it on every request.
AUTH_CACHE_SECONDS = env.float("AUTH_CACHE_SECONDS", default=1.0)

if not DEBUG:
    SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=True)
    CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=True)
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
    # Off unless the deployment says so: HSTS on subdomains and preloading are
    # promises about the whole domain, which only its operator can make.
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
    SECURE_CONTENT_TYPE_NOSNIFF = True

# `plain`: the message alone, as always; `json`: one object per line (core/logs.py), with a
# request line per request (`better_compute.request`) in place of gunicorn's access line.
LOG_FORMAT = env.str("LOG_FORMAT", default="plain")
if LOG_FORMAT not in ("plain", "json"):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("LOG_FORMAT is plain or json.")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(message)s"}, "json": {"()": "core.logs.JsonFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
    # Django's default config gives `django` a console handler of its own; with the
    # root's, every line would print twice. One handler: the root's.
    "loggers": {
        "django": {"handlers": [], "propagate": True},
        "better_compute.request": {"level": "INFO" if LOG_FORMAT == "json" else "WARNING"},
    },
}

# GET /metrics (operations/metrics): answered without a token to a peer in these networks
# (the TCP peer; X-Forwarded-For is never believed), and to a `metrics` role token from anywhere.
METRICS_ALLOWED_NETS = env.list("METRICS_ALLOWED_NETS", default=["127.0.0.1/32", "::1/128"])
