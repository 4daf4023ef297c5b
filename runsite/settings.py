"""Runsite settings: one file, driven by the environment.

Every value can be set with an environment variable of the same name. A value that cannot be
parsed stops start-up with ImproperlyConfigured naming the variable, so a typo in a deployment
never turns into a silently different behaviour.
"""

from __future__ import annotations

import json
import os
import socket
import typing
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from runsite.dbpool import check_pooled_connection

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, on/off)")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    return value


def keepalive_timings(idle: int) -> tuple[int, int, int]:
    """TCP keepalive timings for a peer to be declared dead about twice `idle` seconds after
    it fell silent: (idle, probe interval, user timeout in ms). Three probes, a third of
    `idle` apart; data unacknowledged for as long is given up on too."""
    interval = max(1, idle // 3)
    return idle, interval, (idle + 3 * interval) * 1000


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    return value


def env_graphs(name: str) -> dict[str, typing.Any]:
    """A langgraph.json-style mapping, from a file's path or inline JSON; {} when unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return {}
    base_dir, text = BASE_DIR, raw
    if not raw.startswith("{"):
        path = Path(raw).expanduser()
        try:
            text = path.read_text()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}={raw!r}: cannot read it ({exc.strerror})") from None
        base_dir = path.resolve().parent
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("graphs"), dict):
        raise ImproperlyConfigured(f'{name}: expected {{"graphs": {{"<id>": "<file.py>:<attr>"}}}}')
    return {**data, "base_dir": str(base_dir)}


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and not env_bool("RUNS_ALLOW_INSECURE_KEY", True):
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    # Development fallback; production deployments set SECRET_KEY (docs/deploy.md).
    SECRET_KEY = "runsite-insecure-development-key-change-me"  # noqa: S105

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",  # first: its runserver replaces Django's so websockets work in development
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "corsheaders",
    "django_htmx",
    # The API's docs page (/api/docs) then serves the Swagger UI bundled with django-ninja,
    # from this server's static files; without it ninja's page loads it from a CDN.
    "ninja",
    "runs",
]

MIDDLEWARE = [
    # First, so that error answers and preflights carry the CORS headers too.
    "corsheaders.middleware.CorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "runsite.middleware.RejectNulMiddleware",
    "runsite.middleware.StaticFilesMiddleware",  # WhiteNoise, async-capable
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "runsite.middleware.DatabaseUnavailableMiddleware",
]

# The JSON API (/api/) is served through only these (runsite/asgi.py): it authenticates with API
# keys, sets no cookies and renders no pages, so sessions, CSRF, user auth, messages, frame
# options and htmx would cost every call (a third of a bare request's time here) for nothing.
API_MIDDLEWARE = [
    "corsheaders.middleware.CorsMiddleware",
    # Django's, without its two thread hops per async request (MIDDLEWARE keeps Django's own
    # path, which `check --deploy` looks for).
    "runsite.middleware.SecurityMiddleware",
    "runsite.middleware.RejectNulMiddleware",
    "runsite.middleware.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "runsite.urls"


def env_origins(name: str) -> list[str]:
    origins = env_list(name, [])
    for origin in origins:
        scheme, _, rest = origin.partition("://")
        if scheme not in ("http", "https") or not rest or "/" in rest:
            raise ImproperlyConfigured(
                f"{name}: {origin!r} is not an origin (scheme://host[:port], no path)"
            )
    return origins


# Browser clients of the JSON API (the Agent Inbox app, a LangGraph JS client): their origins,
# comma-separated. None by default; `make run` allows a local Agent Inbox. Only /api/ answers
# cross-origin requests; the dashboard never does.
RUNS_CORS_ALLOWED_ORIGINS = env_origins("RUNS_CORS_ALLOWED_ORIGINS")
CORS_ALLOWED_ORIGINS = RUNS_CORS_ALLOWED_ORIGINS
CORS_URLS_REGEX = r"^/api/.*$"
CORS_ALLOW_HEADERS = (
    "accept",
    "authorization",
    "content-type",
    "x-api-key",
    "last-event-id",
    "x-requested-with",
)
CORS_EXPOSE_HEADERS = ("content-location", "location")
ASGI_APPLICATION = "runsite.asgi.application"

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

# --- Database -------------------------------------------------------------------------------
# Default: a SQLite file next to manage.py in WAL mode, so `make run` needs no server.
_default_db = f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
try:
    _db = dj_database_url.parse(env_str("DATABASE_URL", _default_db))
except Exception as exc:  # dj_database_url raises several types for a bad URL
    raise ImproperlyConfigured(f"DATABASE_URL could not be parsed: {exc}") from None
if _db.get("ENGINE") not in ("django.db.backends.postgresql", "django.db.backends.sqlite3"):
    raise ImproperlyConfigured("DATABASE_URL must be a postgres:// or sqlite:// URL")


if _db["ENGINE"] == "django.db.backends.sqlite3":
    _db["OPTIONS"] = {
        # WAL lets the dashboard read while the embedded worker writes; IMMEDIATE makes writers
        # queue on the busy timeout instead of failing with "database is locked" on upgrade.
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }
    _db["TEST"] = {"NAME": str(BASE_DIR / f"test-db-{os.getpid()}.sqlite3")}
else:
    # Django's PostgreSQL backend with a pool that lends its warmest connection, whose caches
    # (prepared statements, plans, catalog) are warm (runsite/dbpool.py).
    _db["ENGINE"] = "runsite.postgres"
    # Under ASGI each request may run on a different thread, so persistent connections leak;
    # psycopg's pool gives reuse without that. Workers (a plain process) use the same setting.
    if env_bool("DATABASE_POOL", True):
        _db["CONN_MAX_AGE"] = 0
        _db.setdefault("OPTIONS", {})["pool"] = {
            "min_size": env_int("DATABASE_POOL_MIN", 1),
            "max_size": env_int("DATABASE_POOL_MAX", 10, minimum=1),
            "timeout": env_float("DATABASE_POOL_TIMEOUT", 10.0, minimum=0.1),
            # Test a connection before handing it out: after a database restart or
            # pg_terminate_backend, requests get a fresh connection instead of an error. The
            # test asks the server only when the socket shows it said something (runsite/dbpool).
            "check": check_pooled_connection,
        }
    _db.setdefault("OPTIONS", {})["connect_timeout"] = env_int("DATABASE_CONNECT_TIMEOUT", 5)
    # Prepared statements: parameters sent apart from the statement (server-side binding), and
    # a statement a connection has run DATABASE_PREPARE_THRESHOLD times kept prepared on it, so
    # PostgreSQL stops parsing and planning the same hot statements on every call: about half
    # its CPU per run (docs/benchmarks.md). Off (0) behind a pooler that cannot keep prepared
    # statements (PgBouncer in transaction mode before 1.21).
    _prepare_threshold = env_int("DATABASE_PREPARE_THRESHOLD", 2)
    if _prepare_threshold:
        _db["OPTIONS"]["server_side_binding"] = True
        _db["OPTIONS"]["prepare_threshold"] = _prepare_threshold
    # Session settings for the server, after any the URL gives (`?options=-c …`), never instead.
    _server_options = [_db["OPTIONS"].get("options", "")]
    # A process frozen inside a transaction (SIGSTOP, a debugger, a stuck host) would hold its
    # row locks forever and block the reaper; the server ends such sessions after this long.
    _idle_tx_ms = env_int("DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_MS", 10_000)
    if _idle_tx_ms:
        _server_options.append(f"-c idle_in_transaction_session_timeout={_idle_tx_ms}")
    # A peer that vanished without a word (a host that died, a NAT or load balancer that dropped
    # an idle connection) is found by TCP keepalives within about twice this long, on both ends:
    # the client's socket errors (a LISTEN connection reconnects instead of waiting for notices
    # that cannot come) and the server ends the session, releasing its locks (the first
    # responder's advisory lock). The operating system's defaults take two hours. Both ends also
    # give up on data unacknowledged for as long. 0 leaves the defaults; parameters the URL
    # gives (`?keepalives_idle=…`) win.
    _keepalive = env_int("DATABASE_KEEPALIVE_SECONDS", 30)
    if _keepalive:
        _keepalive, _interval, _dead_after_ms = keepalive_timings(_keepalive)
        for _key, _value in {
            "keepalives": 1,
            "keepalives_idle": _keepalive,
            "keepalives_interval": _interval,
            "keepalives_count": 3,
            "tcp_user_timeout": _dead_after_ms,
        }.items():
            _db["OPTIONS"].setdefault(_key, _value)
        _server_options += [
            f"-c tcp_keepalives_idle={_keepalive}",
            f"-c tcp_keepalives_interval={_interval}",
            "-c tcp_keepalives_count=3",
            f"-c tcp_user_timeout={_dead_after_ms}",
        ]
    if " ".join(_server_options).strip():
        _db["OPTIONS"]["options"] = " ".join(o for o in _server_options if o)
    # One test database per test process, so concurrent suites on one server never collide.
    _db["TEST"] = {"NAME": env_str("DATABASE_TEST_NAME", "") or f"test_runsite_{os.getpid()}"}
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


# --- Channels -------------------------------------------------------------------------------
def _channel_prefix(url: str) -> str:
    """RUNS_CHANNEL_PREFIX, else one per Redis database number ("runsite:0", "runsite:3")."""
    explicit = os.environ.get("RUNS_CHANNEL_PREFIX", "").strip()
    if explicit:
        return explicit
    path = url.split("?", 1)[0].rsplit("/", 1)
    db = path[1] if len(path) == 2 and path[1].isdigit() and "//" in path[0] else "0"
    return f"runsite:{db}"


REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    if not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured("REDIS_URL must start with redis://, rediss:// or unix://")
    # A Redis that vanished without a word (a dead host, a NAT that dropped an idle connection)
    # would leave a process's subscription silent for the OS's two hours, its pages and waiters
    # without pushes (its hub's beats unheard): TCP keepalives find it within about twice
    # REDIS_KEEPALIVE_SECONDS, the connection is dropped and the subscription made again (then
    # the hub resyncs). 0 leaves the OS's defaults. Not for unix:// (no TCP).
    _redis_keepalive = env_int("REDIS_KEEPALIVE_SECONDS", 30)
    _redis_host: dict[str, typing.Any] = {"address": REDIS_URL}
    if _redis_keepalive and not REDIS_URL.startswith("unix://"):
        _redis_keepalive, _interval, _dead_after_ms = keepalive_timings(_redis_keepalive)
        _tcp = {
            "TCP_KEEPIDLE": _redis_keepalive,
            "TCP_KEEPINTVL": _interval,
            "TCP_KEEPCNT": 3,
            "TCP_USER_TIMEOUT": _dead_after_ms,
        }
        _redis_host["socket_keepalive"] = True
        # The options this platform has (TCP_USER_TIMEOUT is Linux's).
        _redis_host["socket_keepalive_options"] = {
            getattr(socket, name): value for name, value in _tcp.items() if hasattr(socket, name)
        }
    CHANNEL_LAYERS = {
        "default": {
            # The pub/sub layer: lower fan-out latency than the core layer and no capacity
            # drops; it can lose messages on reconnect, which is why every push carries a
            # per-run sequence number, a hub that misses its own beat has its waiters and
            # sockets resync from the database (runs/hub.py), and a refused publish is sent
            # again (runs/live.py).
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # Redis pub/sub channels ignore the database number: without a prefix of their own,
            # two deployments (or test runs) on one Redis would hear each other's run changes.
            "CONFIG": {"hosts": [_redis_host], "prefix": _channel_prefix(REDIS_URL)},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Auth, i18n, static ---------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "runs:overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = env_bool("WHITENOISE_USE_FINDERS", DEBUG)

# Request bodies: the API answers 413 above this size (runs/api/errors.py).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("RUNS_MAX_BODY_BYTES", 1_048_576, minimum=1024)

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
if env_bool("SECURE_COOKIES", False):
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# --- Runsite engine -------------------------------------------------------------------------
RUNS_AGENTS = env_list("RUNS_AGENTS", ["runs.agents.BUILTIN_AGENTS"])
# LangGraph graphs run as agents (docs/graphs.md): a langgraph.json path, or the JSON inline.
RUNS_GRAPHS = env_graphs("RUNS_GRAPHS")
RUNS_LEASE_SECONDS = env_float("RUNS_LEASE_SECONDS", 30.0, minimum=1.0)
RUNS_HEARTBEAT_SECONDS = env_float("RUNS_HEARTBEAT_SECONDS", 10.0, minimum=0.05)
RUNS_REAPER_SECONDS = env_float("RUNS_REAPER_SECONDS", 5.0, minimum=0.1)
# How long a stateless run's temporary thread outlives its run (a stream or join reading the
# end still finds it); then the reaper deletes it.
RUNS_STATELESS_KEEP_SECONDS = env_float("RUNS_STATELESS_KEEP_SECONDS", 5.0)
RUNS_POLL_SECONDS = env_float("RUNS_POLL_SECONDS", 1.0, minimum=0.01)
RUNS_MAX_ATTEMPTS = env_int("RUNS_MAX_ATTEMPTS", 3, minimum=1)
RUNS_DEFAULT_TIME_LIMIT = env_float("RUNS_DEFAULT_TIME_LIMIT", 600.0, minimum=0.1)
RUNS_WORKER_CONCURRENCY = env_int("RUNS_WORKER_CONCURRENCY", 4, minimum=1)
RUNS_SHUTDOWN_GRACE_SECONDS = env_float("RUNS_SHUTDOWN_GRACE_SECONDS", 10.0)
RUNS_NOTIFY = env_bool("RUNS_NOTIFY", True)  # pg_notify wake-ups; off = poll only (tests)
RUNS_EMBEDDED_WORKER = env_bool("RUNS_EMBEDDED_WORKER", False)
RUNS_API_AUTH = env_bool("RUNS_API_AUTH", True)
# Seconds a web process answers for an API key it found active without reading it again (0:
# read on every request). A key revoked or deleted in that process is refused at once; one
# revoked by another process, at most this much later (docs/api.md).
RUNS_API_KEY_CACHE_SECONDS = env_float("RUNS_API_KEY_CACHE_SECONDS", 1.0)
# Threads per web process serving the API's synchronous views (each holds one pooled database
# connection while it serves a request).
RUNS_API_THREADS = env_int("RUNS_API_THREADS", 8, minimum=1)
RUNS_METRICS_TOKEN = env_str("RUNS_METRICS_TOKEN", "")
RUNS_STUCK_MINUTES = env_int("RUNS_STUCK_MINUTES", 10, minimum=1)
# Retention (docs/deploy.md): unset = keep forever. Workers prune ended runs older than this
# every RUNS_PRUNE_INTERVAL_SECONDS (or `manage.py pruneruns`); the audit log has its own.
RUNS_RETENTION_DAYS = (
    env_float("RUNS_RETENTION_DAYS", 0.0, minimum=0.0)
    if os.environ.get("RUNS_RETENTION_DAYS", "").strip()
    else None
)
RUNS_AUDIT_RETENTION_DAYS = (
    env_float("RUNS_AUDIT_RETENTION_DAYS", 0.0, minimum=0.0)
    if os.environ.get("RUNS_AUDIT_RETENTION_DAYS", "").strip()
    else None
)
RUNS_PRUNE_INTERVAL_SECONDS = env_float("RUNS_PRUNE_INTERVAL_SECONDS", 300.0, minimum=1.0)
# One worker tick prunes at most this long, so claims are never starved.
RUNS_PRUNE_BUDGET_SECONDS = env_float("RUNS_PRUNE_BUDGET_SECONDS", 2.0, minimum=0.1)
RUNS_OPENAI_BASE_URL = env_str("RUNS_OPENAI_BASE_URL", "https://api.openai.com/v1")
RUNS_OPENAI_API_KEY = env_str("RUNS_OPENAI_API_KEY", "")
RUNS_OPENAI_MODEL = env_str("RUNS_OPENAI_MODEL", "gpt-4o-mini")
RUNS_OPENAI_TIMEOUT = env_float("RUNS_OPENAI_TIMEOUT", 60.0, minimum=0.1)

# Webhooks and notifications (docs/notifications.md). The secret signs every POST; without one
# the signature header is left out. Private targets are refused unless allowed (SSRF).
RUNS_WEBHOOK_SECRET = env_str("RUNS_WEBHOOK_SECRET", "")
RUNS_WEBHOOK_ALLOW_PRIVATE = env_bool("RUNS_WEBHOOK_ALLOW_PRIVATE", False)
RUNS_WEBHOOK_MAX_ATTEMPTS = env_int("RUNS_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
RUNS_WEBHOOK_TIMEOUT_SECONDS = env_float("RUNS_WEBHOOK_TIMEOUT_SECONDS", 5.0, minimum=0.1)
RUNS_WEBHOOK_BACKOFF_SECONDS = env_float("RUNS_WEBHOOK_BACKOFF_SECONDS", 10.0, minimum=0.01)
RUNS_WEBHOOK_BACKOFF_MAX_SECONDS = env_float(
    "RUNS_WEBHOOK_BACKOFF_MAX_SECONDS", 3600.0, minimum=0.01
)
RUNS_WEBHOOK_CONCURRENCY = env_int("RUNS_WEBHOOK_CONCURRENCY", 4, minimum=1)
# Links in notifications point here ("" : relative links, e.g. /runs/<id>/).
RUNS_PUBLIC_URL = env_str("RUNS_PUBLIC_URL", "").rstrip("/")

# E-mail for notification rules (Django's mailers): SMTP when EMAIL_HOST is set, else the
# console backend (the demo). Tests get locmem from Django's test set-up.
_EMAIL_HOST = env_str("EMAIL_HOST", "")
MAILERS = {
    "default": (
        {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {
                "host": _EMAIL_HOST,
                "port": env_int("EMAIL_PORT", 587, minimum=1),
                "username": env_str("EMAIL_HOST_USER", ""),
                "password": env_str("EMAIL_HOST_PASSWORD", ""),
                "use_tls": env_bool("EMAIL_USE_TLS", True),
                "timeout": env_float("EMAIL_TIMEOUT", 10.0, minimum=0.1),
            },
        }
        if _EMAIL_HOST
        else {"BACKEND": "django.core.mail.backends.console.EmailBackend"}
    )
}
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "runsite@localhost")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
    },
}
