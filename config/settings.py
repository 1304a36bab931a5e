"""Proofwork settings: one file, every value from the environment.

With no environment at all (a laptop, ``make run``) the platform runs embedded:
SQLite and the Celery filesystem broker under ``var/``, an in-memory channel layer,
DEBUG on and a generated development secret. ``DATABASE_URL`` and ``REDIS_URL`` switch
to PostgreSQL, Redis and channels-redis; ``PROOFWORK_PRODUCTION=1`` hardens the rest.
docs/configuration.md lists every variable.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from config.env import (
    check_node_broker,
    env_bool,
    env_choice,
    env_fraction,
    env_int,
    env_list,
    env_str,
    env_url,
    next_redis_database,
    refuse_shared_cache,
    without_credentials,
)

django_stubs_ext.monkeypatch()  # lets admin.ModelAdmin[Model] work at run time

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("PROOFWORK_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

PRODUCTION = env_bool("PROOFWORK_PRODUCTION", False)
DEBUG = env_bool("DJANGO_DEBUG", not PRODUCTION)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured("DJANGO_DEBUG cannot be on when PROOFWORK_PRODUCTION is set")


def _development_secret() -> str:
    """A per-checkout secret kept under var/ so sessions survive restarts."""
    path = VAR_DIR / "dev-secret-key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = env_str("DJANGO_SECRET_KEY")
if not SECRET_KEY:
    if PRODUCTION:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY is required when PROOFWORK_PRODUCTION is set")
    SECRET_KEY = _development_secret()
elif len(SECRET_KEY) < 50:
    raise ImproperlyConfigured("DJANGO_SECRET_KEY must be at least 50 characters")

ALLOWED_HOSTS = env_list(
    "DJANGO_ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]", "testserver"]
)
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "axes",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "marketplace",
    "ledger",
    "workers",
    "payments",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a login refused for too many failures into the locked-out page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = None

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

# --- Database -------------------------------------------------------------------
DATABASE_URL = env_url("DATABASE_URL", ("postgres", "postgresql", "sqlite"))
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(VAR_DIR / "db.sqlite3"),
            "TEST": {"NAME": str(VAR_DIR / "test.sqlite3")},  # a file: the e2e tests' daphne subprocess shares it
        }
    }
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several processes write one file (web, the platform and control workers): WAL lets
    # readers go on while one writes, IMMEDIATE takes the write lock at BEGIN (no upgrade
    # deadlock), and a writer waits up to 20 s for the lock instead of SQLite's 5 s.
    sqlite_options = DATABASES["default"].setdefault("OPTIONS", {})
    sqlite_options.setdefault("init_command", "PRAGMA journal_mode=WAL;")
    sqlite_options.setdefault("transaction_mode", "IMMEDIATE")
    sqlite_options.setdefault("timeout", 20)
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    # Under ASGI every request runs in its own thread, so persistent per-thread connections
    # pile up; a process-wide psycopg pool bounds them instead (CONN_MAX_AGE must stay 0).
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": env_int("PROOFWORK_DB_POOL_SIZE", 10, minimum=1, maximum=500),
        "timeout": 10,
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "marketplace.User"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
# A provider without tasks lands on My workers, anyone else on My tasks (workers.views.start).
LOGIN_REDIRECT_URL = "start"
LOGOUT_REDIRECT_URL = "home"

# --- Login throttling (django-axes) ---------------------------------------------
# Every login that goes through django.contrib.auth.authenticate with its request (the
# site's login page, the admin's) counts: an account, and apart from it an address, with
# PROOFWORK_LOGIN_FAILURE_LIMIT failed logins within the cool-off is refused, the right
# password too, until the cool-off has passed since its last counted failure. The counts are
# rows in the database (SQLite or PostgreSQL), so every web process sees the same ones. The
# API has no password login: it takes tokens, or the session the login page signed in.
AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out account or address before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("PROOFWORK_LOGIN_FAILURE_LIMIT", 10, minimum=1, maximum=1000)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("PROOFWORK_LOGIN_COOLOFF_MINUTES", 15, minimum=1, maximum=7 * 24 * 60))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # each counted on its own: either one locks
# A success clears nothing: axes would clear every failure from the address, those against
# other accounts included, so an attacker's own account would reset the count.
AXES_RESET_ON_SUCCESS = False
# Tries while locked out are refused unrecorded: the lock ends at a time the page can name,
# which the owner's own retries do not push back.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_DISABLE_ACCESS_LOG = True  # failures are kept (until the cool-off), successful logins are not
AXES_ENABLE_ADMIN = False  # marketplace/admin.py registers the attempts, its action behind a permission
# The address is the connection's (REMOTE_ADDR); behind a proxy, daphne --proxy-headers
# sets it from X-Forwarded-For (docker-compose.yml).
AXES_LOCKOUT_CALLABLE = "marketplace.views.accounts.locked_out"
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False

# --- E-mail: password reset --------------------------------------------------------
# Development prints each message on the web process's console; production sends it
# through the SMTP server named here.
EMAIL_BACKEND = env_str(
    "DJANGO_EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend" if PRODUCTION else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1, maximum=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)  # implicit TLS (port 465)
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", not EMAIL_USE_SSL)  # STARTTLS (port 587)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL cannot both be on")
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DJANGO_DEFAULT_FROM_EMAIL", "Proofwork <noreply@localhost>")
SERVER_EMAIL = DEFAULT_FROM_EMAIL
# A password reset link works this long (Django's default is three days).
PASSWORD_RESET_TIMEOUT = env_int("PROOFWORK_PASSWORD_RESET_TIMEOUT", 3600, minimum=60)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# --- Static and media -----------------------------------------------------------
STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("PROOFWORK_STATIC_ROOT", str(VAR_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns about a missing root
MEDIA_URL = "media/"
MEDIA_ROOT = Path(env_str("PROOFWORK_MEDIA_ROOT", str(VAR_DIR / "media")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

# Uploads: datasets are streamed to disk past 2.5 MB; the cap is checked before saving.
# Every later stage streams too (the posting checks, the held-out split into shards, the
# node's download by ranges), so the cap is the platform's disk, not its memory.
DATASET_MAX_BYTES = env_int("PROOFWORK_DATASET_MAX_BYTES", 64 * 1024**3, minimum=1)
# Larger datasets go up in ordered parts of at most this size (marketplace/dataset_uploads.py):
# daphne holds a request's whole body in memory, so one request must stay small.
DATASET_UPLOAD_PART_BYTES = env_int("PROOFWORK_DATASET_UPLOAD_PART_BYTES", 32 * 1024 * 1024, minimum=64 * 1024)
# An unfinished upload in parts is deleted, bytes and all, this many seconds after it began.
DATASET_UPLOAD_TTL = env_int("PROOFWORK_DATASET_UPLOAD_TTL", 24 * 3600, minimum=60)
FILE_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
FILE_UPLOAD_PERMISSIONS = 0o640

# --- Redis: broker and channel layer ---------------------------------------------
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss"))
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    # In memory for the one web process; the Celery processes reach it through a spool
    # directory (config/channel_layers.py).
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "config.channel_layers.EmbeddedChannelLayer",
            "CONFIG": {"spool": str(VAR_DIR / "channels")},
        }
    }

# --- Cache: the API's throttle counters -----------------------------------------
# With Redis every web process counts against the same limits (the database after
# REDIS_URL's, or PROOFWORK_CACHE_URL); the embedded platform's one web process keeps them
# in its memory.
CACHE_URL = env_url("PROOFWORK_CACHE_URL", ("redis", "rediss")) or (REDIS_URL and next_redis_database(REDIS_URL))
if CACHE_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": CACHE_URL,
            "KEY_PREFIX": "proofwork",
        }
    }

# --- Celery ---------------------------------------------------------------------
CELERY_BROKER_DIR = VAR_DIR / "celery"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or REDIS_URL or "filesystem://"
if CELERY_BROKER_URL == "filesystem://":
    for sub in ("out", "processed", "control"):
        (CELERY_BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "data_folder_in": str(CELERY_BROKER_DIR / "out"),
        "data_folder_out": str(CELERY_BROKER_DIR / "out"),
        "processed_folder": str(CELERY_BROKER_DIR / "processed"),
        "control_folder": str(CELERY_BROKER_DIR / "control"),
        "store_processed": False,
        # The transport polls its folder (1 s by default, which cost a second per hop from
        # post to agent); a listing of a near-empty folder every 0.1 s is cheap.
        "polling_interval": 0.1,
    }
    # Kombu's transport with atomic message files: the stock one lets a consumer read a
    # message before it is written and die on it (workers/agent/fsbroker.py).
    CELERY_BROKER_TRANSPORT = "workers.agent.fsbroker:Transport"
elif CELERY_BROKER_URL.split("://", 1)[0] in ("redis", "rediss"):
    # A message not acknowledged within the visibility timeout goes back to its queue (an
    # hour by default): a verification or a job running longer would be delivered twice.
    # A message whose consumer died for good is recovered by the platform itself (resent
    # verifications, expired and reassigned jobs), so it may wait a day.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 24 * 3600}
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
if CACHE_URL:
    refuse_shared_cache(CACHE_URL, CELERY_BROKER_URL=CELERY_BROKER_URL, REDIS_URL=REDIS_URL)
# --- Node broker: RabbitMQ for provider nodes' queues ------------------------------
# Untrusted nodes never touch the broker above. Each takes its jobs from its own queue
# ``w.<address>`` on a RabbitMQ vhost of node queues, logging in as its own broker user
# whose only permission is reading that queue (workers/assignments/nodebroker.py, docs/node-broker.md).
# PROOFWORK_NODE_BROKER_URL is the platform's publishing user, its path the vhost; the
# management API (URL, an administrator's user and password) creates each node's user and
# queue and revokes them; PROOFWORK_NODE_BROKER_PUBLIC_URL is where nodes are told to
# connect (scheme, host, port, vhost, no credentials; default: the platform's URL less its
# user); PROOFWORK_NODE_BROKER_CA a CA file for amqps/https to a broker with a private CA.
# Unset: node queues stay on the filesystem broker under var/ for agents on this machine
# (make run), even when REDIS_URL is set: a node is never handed the platform's Redis.
NODE_BROKER_URL = env_url("PROOFWORK_NODE_BROKER_URL", ("amqp", "amqps"))
NODE_BROKER_PUBLIC_URL = env_url("PROOFWORK_NODE_BROKER_PUBLIC_URL", ("amqp", "amqps"))
NODE_BROKER_API_URL = env_url("PROOFWORK_NODE_BROKER_API_URL", ("http", "https"))
NODE_BROKER_API_USER = env_str("PROOFWORK_NODE_BROKER_API_USER")
NODE_BROKER_API_PASSWORD = env_str("PROOFWORK_NODE_BROKER_API_PASSWORD")
NODE_BROKER_CA = env_str("PROOFWORK_NODE_BROKER_CA")
NODE_QUEUE_DIR = CELERY_BROKER_DIR / "out"  # the filesystem node queues without a node broker
if NODE_BROKER_URL:
    check_node_broker(
        NODE_BROKER_URL,
        public_url=NODE_BROKER_PUBLIC_URL,
        api_url=NODE_BROKER_API_URL,
        api_user=NODE_BROKER_API_USER,
        api_password=NODE_BROKER_API_PASSWORD,
        ca=NODE_BROKER_CA,
        production=PRODUCTION,
    )
    NODE_BROKER_PUBLIC_URL = NODE_BROKER_PUBLIC_URL or without_credentials(NODE_BROKER_URL)
elif PRODUCTION:
    raise ImproperlyConfigured(
        "PROOFWORK_NODE_BROKER_URL (amqps://...) is required when PROOFWORK_PRODUCTION is set:"
        " provider nodes take their jobs from RabbitMQ, never from the platform's own broker"
    )
else:
    for sub in ("out", "processed", "control"):
        (CELERY_BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)

CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Two trusted queues, each with its own worker process (Procfile, docker-compose.yml):
# ``platform`` verifies results (seconds to minutes each: a 1.6 GB product takes 7-9 s,
# a model evaluation longer) and sends payouts; ``control`` runs the short periodic jobs
# that must keep their beat while that happens: sealing blocks, offering waiting tasks,
# expiring silent workers' jobs. Routes live here only; callers never name a queue.
CELERY_TASK_DEFAULT_QUEUE = "platform"
CELERY_TASK_ROUTES = {
    "workers.verify_assignment": {"queue": "platform"},
    "marketplace.expire_dataset_uploads": {"queue": "platform"},
    "workers.schedule_task": {"queue": "control"},
    "workers.schedule_waiting": {"queue": "control"},
    "workers.purge_rejected_artifacts": {"queue": "control"},
    "workers.sync_node_broker": {"queue": "control"},
    "ledger.tasks.seal_pending": {"queue": "control"},
}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}
CELERY_TIMEZONE = "UTC"
# Unfinished dataset uploads in parts past DATASET_UPLOAD_TTL lose their bytes. On platform,
# not control: it may wait on the lock of an upload whose last part is being checked.
CELERY_BEAT_SCHEDULE["marketplace-expire-dataset-uploads"] = {
    "task": "marketplace.expire_dataset_uploads",
    "schedule": 900.0,
    "options": {"expires": 900.0},
}

# --- REST API -------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "marketplace.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # Every API's parsers answer absurdly nested bodies, and strings no column can hold
    # (U+0000, unpaired surrogates), with a 400 naming the field, not a 500.
    "DEFAULT_PARSER_CLASSES": [
        "config.api.parsers.JSONParser",
        "config.api.parsers.FormParser",
        "config.api.parsers.MultiPartParser",
    ],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 20,
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "config.filters.StrictOrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "config.api.schema.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"]
    + ([] if PRODUCTION else ["rest_framework.renderers.BrowsableAPIRenderer"]),
    "EXCEPTION_HANDLER": "config.api.errors.exception_handler",
    # NaN and Infinity are not JSON; the parser refuses them with a 400.
    "STRICT_JSON": True,
    "COERCE_DECIMAL_TO_STRING": True,
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Proofwork API",
    "DESCRIPTION": "Post verifiable GPU work, register workers, audit the ledger.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Tags and the common error responses of every operation come from one place
    # (config/api/schema.py), not from each view.
    "SCHEMA_PATH_PREFIX": r"/api/v[0-9]+",
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "config.api.schema.declare_tags"],
}

# --- Marketplace ----------------------------------------------------------------
# Price of one TFLOP of verified work, in base units (1 credit = 10**9 units).
PRICE_PER_TFLOP_UNITS = env_int("PROOFWORK_PRICE_PER_TFLOP_UNITS", 1_000_000, minimum=0)
# Development only: credits a new account receives so the embedded platform can be
# tried before payments exist. Refused in production.
SIGNUP_GRANT_UNITS = env_int("PROOFWORK_SIGNUP_GRANT_CREDITS", 0 if PRODUCTION else 100, minimum=0) * 10**9
if PRODUCTION and SIGNUP_GRANT_UNITS:
    raise ImproperlyConfigured("PROOFWORK_SIGNUP_GRANT_CREDITS must be 0 in production")
MIN_TASK_PRICE_UNITS = env_int("PROOFWORK_MIN_TASK_PRICE_UNITS", 100_000_000, minimum=0)

# --- Workers --------------------------------------------------------------------
# A worker that has not sent a heartbeat for this long is offline; its jobs expire.
WORKER_HEARTBEAT_TIMEOUT = env_int("PROOFWORK_WORKER_HEARTBEAT_TIMEOUT", 30, minimum=5)
WORKER_REGISTRATION_TTL = env_int("PROOFWORK_WORKER_REGISTRATION_TTL", 3600, minimum=60)
ASSIGNMENT_DEADLINE = env_int("PROOFWORK_ASSIGNMENT_DEADLINE", 3600, minimum=30)
# A submitted result still unsettled this long after its verification was asked for is
# sent to verification again (a lost message must not strand it; workers/assignments/jobs.py).
VERIFY_RESEND_AFTER = env_int("PROOFWORK_VERIFY_RESEND_AFTER", 900, minimum=60)
# A result the platform itself cannot judge (its held-out data or source model is missing)
# this long after submission ends without penalty and is reassigned.
VERIFY_GIVE_UP_AFTER = env_int("PROOFWORK_VERIFY_GIVE_UP_AFTER", 6 * 3600, minimum=60)
# A verification started this many times without finishing (its process was killed: out
# of memory, a hard time limit) is not started again: the result is rejected (workers/tasks.py).
VERIFY_MAX_ATTEMPTS = env_int("PROOFWORK_VERIFY_MAX_ATTEMPTS", 3, minimum=1)
# A cube model is paid only if its held-out loss is at least this many percent below the
# untrained model's: one optimiser step, honestly reported, is not a trained model.
CUBE_MIN_LOSS_REDUCTION_PCT = env_int("PROOFWORK_CUBE_MIN_LOSS_REDUCTION_PCT", 20, minimum=0, maximum=99)
# The platform's secret behind every held-out draw (workers/assignments/heldout.py): which
# rows or participants a dataset keeps back, and the synthetic held-out samples. Unset, it
# is derived from SECRET_KEY, so production needs nothing more; set it on its own to rotate
# SECRET_KEY without moving the draws (after a move, a dataset's new held-out rows may have
# been served to workers of its earlier tasks).


def _platform_secret(name: str, label: bytes) -> bytes:
    """The environment's ``name`` (at least 32 characters), else HMAC-SHA256 of SECRET_KEY
    under ``label``: one derived secret per use, none recoverable from another."""
    raw = env_str(name)
    if raw and len(raw) < 32:
        raise ImproperlyConfigured(f"{name} must be at least 32 characters")
    return raw.encode() if raw else hmac.new(SECRET_KEY.encode(), label, hashlib.sha256).digest()


HELDOUT_SECRET = _platform_secret("PROOFWORK_HELDOUT_SECRET", b"proofwork:heldout-secret")
# Proof of training (docs/proof-of-training.md): after a trained kind's signed result the
# platform picks segments of its committed checkpoint chain to re-execute, with HMAC under
# this secret over the chain's root, so no node can know them before it signs. Derived from
# SECRET_KEY unless set, like the held-out secret, under its own label.
TRACE_SECRET = _platform_secret("PROOFWORK_TRACE_SECRET", b"proofwork:trace-challenge")
# Enough segments are picked that a chain with at least TRACE_BAD_FRACTION of its segments
# wrong is caught with probability at least TRACE_DETECT (training.trace.segments_needed).
TRACE_DETECT = env_fraction("PROOFWORK_TRACE_DETECT", 0.99)
TRACE_BAD_FRACTION = env_fraction("PROOFWORK_TRACE_BAD_FRACTION", 0.10)
# Where the challenged segments are re-executed: "platform" (its verifier, the default) or
# "delegated" (offered as a verification job to a node of another provider, with canaries,
# the platform refereeing disagreements and falling back to itself: workers/assignments/delegation.py).
SEGMENT_REEXECUTION = env_choice("PROOFWORK_SEGMENT_REEXECUTION", "platform", ("platform", "delegated"))
# How long a verifier node has to answer before the platform re-executes the segments itself.
DELEGATE_WAIT = env_int("PROOFWORK_DELEGATE_WAIT", 600, minimum=30)
# Canary segments mixed into each verification job (each costs the platform one or two segments).
DELEGATE_CANARIES = env_int("PROOFWORK_DELEGATE_CANARIES", 1, minimum=1, maximum=8)
# Largest checkpoint a node may upload when challenged (a default cube checkpoint is a few MB).
CHECKPOINT_MAX_BYTES = env_int("PROOFWORK_CHECKPOINT_MAX_BYTES", 256 * 1024**2, minimum=1)
# A task whose result fell short of its quality bar (a true claim: see workers/assignments/settlement.py),
# with none of its replicas accepted, that no other provider has taken this many seconds
# later fails with a full refund: the spec may make the bar unreachable.
SHORTFALL_WAIT = env_int("PROOFWORK_SHORTFALL_WAIT", 3600, minimum=0)
# A task that no worker takes for this many seconds, counted from when it opened or its
# last job ended (none live meanwhile), fails with a full refund (docs/scheduling.md).
TASK_MAX_WAIT = env_int("PROOFWORK_TASK_MAX_WAIT", 24 * 3600, minimum=60)
ARTIFACT_MAX_BYTES = env_int("PROOFWORK_ARTIFACT_MAX_BYTES", 2 * 1024**3, minimum=1)
# How often waiting tasks are offered again and silent workers' jobs expired.
SCHEDULER_INTERVAL = env_int("PROOFWORK_SCHEDULER_INTERVAL", 5, minimum=1)
# How old (seconds) the list of online workers behind a post page's estimate or a quote may
# be: each would otherwise read the whole pool. Scheduling always reads it afresh.
SUPPLY_SNAPSHOT_SECONDS = env_int("PROOFWORK_SUPPLY_SNAPSHOT_SECONDS", 5, minimum=0)
CELERY_BEAT_SCHEDULE["workers-schedule-waiting"] = {
    "task": "workers.schedule_waiting",
    "schedule": float(SCHEDULER_INTERVAL),
    "options": {"expires": float(SCHEDULER_INTERVAL)},
}
# A rejected result's uploads are kept this long for an operator to look into the
# rejection, then deleted (accepted results stay: they are the requester's deliverable).
REJECTED_ARTIFACT_RETENTION_DAYS = env_int("PROOFWORK_REJECTED_ARTIFACT_RETENTION_DAYS", 7, minimum=0)
CELERY_BEAT_SCHEDULE["workers-purge-rejected-artifacts"] = {
    "task": "workers.purge_rejected_artifacts",
    "schedule": 3600.0,
    "options": {"expires": 3600.0},
}

# --- Production hardening -------------------------------------------------------
if PRODUCTION:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True
    SECURE_REFERRER_POLICY = "same-origin"
    X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("PROOFWORK_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- Ledger ---------------------------------------------------------------------
# Keys come from the environment; for development they are generated once and kept
# under var/ (like the secret key). Production refuses to start without them.


def _development_ledger_key(name: str, make: str) -> str:
    """A per-checkout ledger key under var/: ``make`` is "seed" (ed25519) or "fernet"."""
    import base64

    path = VAR_DIR / f"ledger-{name}.key"
    if not path.exists():
        raw = secrets.token_bytes(32)
        path.write_text(raw.hex() if make == "seed" else base64.urlsafe_b64encode(raw).decode())
        path.chmod(0o600)
    return path.read_text().strip()


def _ledger_key(var: str, name: str, make: str) -> str:
    value = env_str(var)
    if value:
        return value
    if PRODUCTION:
        raise ImproperlyConfigured(f"{var} is required when PROOFWORK_PRODUCTION is set")
    return _development_ledger_key(name, make)


# Fernet key (urlsafe base64 of 32 bytes) encrypting custodial private keys at rest.
LEDGER_ENCRYPTION_KEY = _ledger_key("LEDGER_ENCRYPTION_KEY", "encryption", "fernet")
# ed25519 private seeds, 64 hex characters: the treasury signs deposits, the validator blocks.
LEDGER_TREASURY_KEY = _ledger_key("LEDGER_TREASURY_KEY", "treasury", "seed")
LEDGER_VALIDATOR_KEY = _ledger_key("LEDGER_VALIDATOR_KEY", "validator", "seed")
LEDGER_CHAIN_ID = env_str("LEDGER_CHAIN_ID", "proofwork-dev-1")
LEDGER_GENESIS_TIME = env_str("LEDGER_GENESIS_TIME", "2026-01-01T00:00:00+00:00")
LEDGER_BLOCK_TIME = env_int("LEDGER_BLOCK_TIME", 5, minimum=1)
LEDGER_MAX_BLOCK_TXS = env_int("LEDGER_MAX_BLOCK_TXS", 10_000, minimum=1)
# A sealer run is queued at once when this many transactions are pending.
LEDGER_MEMPOOL_SEAL_TRIGGER = env_int("LEDGER_MEMPOOL_SEAL_TRIGGER", 1_000, minimum=1)
# Base units per gas. At 5 a worker's SUBMIT_RESULT (80,000 gas) costs 0.0004 credits and a
# sweep (TRANSFER, 21,000 gas) 0.000105: together under 1 % of the cheapest task
# (PROOFWORK_MIN_TASK_PRICE_UNITS), so a provider keeps at least 99 % of what a job pays.
LEDGER_GAS_PRICE = env_int("LEDGER_GAS_PRICE", 5, minimum=0)
# Platform's share of each reward, in basis points (100 = 1 %).
LEDGER_PLATFORM_FEE_BPS = env_int("LEDGER_PLATFORM_FEE_BPS", 500, minimum=0, maximum=10_000)
# Dotted path of a callable (task_id: UUID, worker_address: str) -> str | None that
# checks a SUBMIT_RESULT against the workers' assignments (None = fine, else a reason
# code). The workers app sets it; see ledger/hooks.py.
LEDGER_ASSIGNMENT_CHECKER = env_str("LEDGER_ASSIGNMENT_CHECKER", "")
# Processes that verify signatures of large batches (ledger/batchverify.py), started on
# the first batch of 512 or more; 1 = in-process. Default: one per CPU core, at most 8.
LEDGER_VERIFY_PROCESSES = env_int("LEDGER_VERIFY_PROCESSES", min(os.cpu_count() or 1, 8), minimum=1, maximum=64)
CELERY_BEAT_SCHEDULE["ledger-seal-block"] = {
    "task": "ledger.tasks.seal_pending",
    "schedule": float(LEDGER_BLOCK_TIME),
    "options": {"expires": float(LEDGER_BLOCK_TIME)},
}
# Ledger transactions have a "status" as tasks do: name both enums in the OpenAPI schema.
SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"] = {
    **SPECTACULAR_SETTINGS.get("ENUM_NAME_OVERRIDES", {}),  # type: ignore[dict-item]
    "TaskStatusEnum": "marketplace.models.TaskStatus",
    "TaskKindEnum": "marketplace.kinds.KIND_NAMES",
    "LedgerTxStatusEnum": "ledger.models.TxStatus",
    "LedgerTxTypeEnum": "ledger.models.TxType",
}
# --- end Ledger -----------------------------------------------------------------

# --- Payments (Stripe) ------------------------------------------------------------
# With no keys, payments are off: the wallet says so and development uses `mint`.
STRIPE_SECRET_KEY = env_str("STRIPE_SECRET_KEY")
STRIPE_PUBLISHABLE_KEY = env_str("STRIPE_PUBLISHABLE_KEY")
STRIPE_WEBHOOK_SECRET = env_str("STRIPE_WEBHOOK_SECRET")
_stripe_keys = {
    "STRIPE_SECRET_KEY": (STRIPE_SECRET_KEY, ("sk_", "rk_")),
    "STRIPE_PUBLISHABLE_KEY": (STRIPE_PUBLISHABLE_KEY, ("pk_",)),
    "STRIPE_WEBHOOK_SECRET": (STRIPE_WEBHOOK_SECRET, ("whsec_",)),
}
if any(value for value, _ in _stripe_keys.values()):
    for _name, (_value, _prefixes) in _stripe_keys.items():
        if not _value:
            raise ImproperlyConfigured(f"{_name} is required once any Stripe key is set (payments need all three)")
        if not _value.startswith(_prefixes):
            raise ImproperlyConfigured(f"{_name} must start with {' or '.join(_prefixes)}")
PAYMENTS_ENABLED = bool(STRIPE_SECRET_KEY)
# Where the stripe library sends API calls (tests point it at localstripe); None = Stripe's own.
STRIPE_API_BASE = env_url("STRIPE_API_BASE", ("http", "https"))
if PRODUCTION and STRIPE_API_BASE and not STRIPE_API_BASE.startswith("https://"):
    raise ImproperlyConfigured("STRIPE_API_BASE must be https:// in production")
# Stripe.js must be loaded from Stripe itself (it cannot be vendored); only when payments are on.
STRIPE_JS_URL = env_url("STRIPE_JS_URL", ("http", "https")) or "https://js.stripe.com/v3/"
STRIPE_CURRENCY = env_str("STRIPE_CURRENCY", "usd").lower()
if len(STRIPE_CURRENCY) != 3 or not STRIPE_CURRENCY.isalpha():
    raise ImproperlyConfigured(f"STRIPE_CURRENCY={STRIPE_CURRENCY!r} is not a three-letter ISO currency code")
# Also pay through a Stripe Checkout Session (hosted page) beside the in-page card form.
STRIPE_CHECKOUT = env_bool("STRIPE_CHECKOUT", False)
# Pay providers out through Stripe Connect (Express accounts and transfers).
STRIPE_CONNECT = env_bool("STRIPE_CONNECT", False)
# Price of one credit in the currency's smallest unit (cents for usd).
CREDIT_PRICE_MINOR = env_int("PROOFWORK_CREDIT_PRICE_MINOR", 100, minimum=1, maximum=10**9)
PURCHASE_MIN_CREDITS = env_int("PROOFWORK_PURCHASE_MIN_CREDITS", 5, minimum=1)
PURCHASE_MAX_CREDITS = env_int("PROOFWORK_PURCHASE_MAX_CREDITS", 10_000, minimum=1)
if PURCHASE_MAX_CREDITS < PURCHASE_MIN_CREDITS:
    raise ImproperlyConfigured("PROOFWORK_PURCHASE_MAX_CREDITS is below PROOFWORK_PURCHASE_MIN_CREDITS")
if PURCHASE_MAX_CREDITS * CREDIT_PRICE_MINOR > 99_999_999:
    raise ImproperlyConfigured(
        "PROOFWORK_PURCHASE_MAX_CREDITS × PROOFWORK_CREDIT_PRICE_MINOR exceeds Stripe's largest charge"
    )
PAYOUT_MIN_CREDITS = env_int("PROOFWORK_PAYOUT_MIN_CREDITS", 50, minimum=1)
# --- end Payments -----------------------------------------------------------------
