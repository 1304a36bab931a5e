"""Typed readers for environment variables.

Every setting comes from the environment through one of these helpers. A value that
is present but malformed raises ImproperlyConfigured naming the variable, so a typo
fails at start-up instead of silently falling back to a default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit, urlunsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "", environ: Mapping[str, str] | None = None) -> str:
    """Return the variable as a string, or ``default`` when unset."""
    env = os.environ if environ is None else environ
    return env.get(name, default)


def env_bool(name: str, default: bool = False, environ: Mapping[str, str] | None = None) -> bool:
    """Return the variable as a boolean; accepts 1/0, true/false, yes/no, on/off."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """Return the variable as an integer within [minimum, maximum]."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below the minimum {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above the maximum {maximum}")
    return value


def env_fraction(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """Return the variable as a number strictly between 0 and 1."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if not 0 < value < 1:
        raise ImproperlyConfigured(f"{name}={value} must lie strictly between 0 and 1")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...], environ: Mapping[str, str] | None = None) -> str:
    """Return the variable, which must be one of ``choices`` (``default`` when unset or empty)."""
    env = os.environ if environ is None else environ
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if raw not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r} is not one of {', '.join(choices)}")
    return raw


def env_list(name: str, default: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """Return a comma-separated variable as a list of non-empty, stripped items."""
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_url(name: str, schemes: tuple[str, ...], environ: Mapping[str, str] | None = None) -> str | None:
    """Return a URL variable whose scheme is one of ``schemes``, or None when unset."""
    env = os.environ if environ is None else environ
    raw = env.get(name, "").strip()
    if not raw:
        return None
    scheme = raw.split("://", 1)[0].lower() if "://" in raw else ""
    if scheme not in schemes:
        raise ImproperlyConfigured(f"{name} must start with one of {', '.join(s + '://' for s in schemes)}")
    return raw


def next_redis_database(url: str) -> str:
    """``url`` with the Redis database after its own (``redis://h:6379/0`` → ``…/1``).

    The cache lives beside the broker in a database of its own: clearing it (``FLUSHDB``)
    must never drop queued Celery messages or the broker's bindings.
    """
    parts = urlsplit(url)
    if "db" in parse_qs(parts.query):
        raise ImproperlyConfigured("REDIS_URL must name its database in the path (redis://host:6379/0), not ?db=")
    raw = parts.path.strip("/") or "0"
    if not raw.isdigit():
        raise ImproperlyConfigured(f"REDIS_URL's path must be a database number, not {parts.path!r}")
    database = int(raw) + 1
    if database > 15:
        raise ImproperlyConfigured(
            "The cache takes the Redis database after REDIS_URL's, and there is none after 15: set PROOFWORK_CACHE_URL"
        )
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


def redis_database(url: str) -> tuple[str, int, int]:
    """The Redis server and database a ``redis://`` URL names: (host, port, database)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query).get("db")
    raw = query[0] if query else (parts.path.strip("/") or "0")
    return (parts.hostname or "localhost", parts.port or 6379, int(raw) if raw.isdigit() else -1)


def refuse_shared_cache(cache_url: str, **others: str | None) -> None:
    """Refuse a cache in the same Redis database as the broker or the channel layer:
    clearing the cache (FLUSHDB) would drop their queued messages."""
    cache = redis_database(cache_url)
    for name, url in others.items():
        if url and url.split("://", 1)[0].lower() in ("redis", "rediss") and redis_database(url) == cache:
            raise ImproperlyConfigured(
                f"The cache ({cache_url}) is in the same Redis database as {name}: give it one of its own"
                " (PROOFWORK_CACHE_URL)"
            )


def without_credentials(url: str) -> str:
    """``url`` less its user and password (what a node is told, before its own are added)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def check_node_broker(
    url: str,
    *,
    public_url: str | None,
    api_url: str | None,
    api_user: str,
    api_password: str,
    ca: str,
    production: bool,
) -> None:
    """Refuse a node broker configuration that cannot work or is not safe to run.

    The vhost (the URL's path) must be named: node users get permissions on it alone.
    Production requires TLS (amqps) both for the platform's connection and for the address
    nodes are told, since nodes reach the broker over the internet.
    """
    parts = urlsplit(url)
    if not parts.username or not parts.password:
        raise ImproperlyConfigured(
            "PROOFWORK_NODE_BROKER_URL must carry the platform's own broker user and password"
            " (amqp://platform:PASSWORD@host:5672/proofwork-nodes)"
        )
    if not parts.path.strip("/"):
        raise ImproperlyConfigured(
            "PROOFWORK_NODE_BROKER_URL must name the vhost of node queues in its path (…:5672/proofwork-nodes)"
        )
    if public_url:
        public = urlsplit(public_url)
        if public.username or public.password:
            raise ImproperlyConfigured(
                "PROOFWORK_NODE_BROKER_PUBLIC_URL must not carry credentials: each node gets its own"
            )
        if public.path != parts.path:
            raise ImproperlyConfigured(
                "PROOFWORK_NODE_BROKER_PUBLIC_URL must name the same vhost as PROOFWORK_NODE_BROKER_URL"
            )
    if not api_url or not api_user or not api_password:
        raise ImproperlyConfigured(
            "PROOFWORK_NODE_BROKER_URL needs RabbitMQ's management API: set PROOFWORK_NODE_BROKER_API_URL,"
            " PROOFWORK_NODE_BROKER_API_USER and PROOFWORK_NODE_BROKER_API_PASSWORD (an administrator)"
        )
    if api_url and (urlsplit(api_url).username or urlsplit(api_url).password):
        # Each management call's URL is logged (httpx, at INFO): the login goes in its own variables.
        raise ImproperlyConfigured(
            "PROOFWORK_NODE_BROKER_API_URL must not carry credentials: set PROOFWORK_NODE_BROKER_API_USER"
            " and PROOFWORK_NODE_BROKER_API_PASSWORD"
        )
    if api_user == parts.username:
        raise ImproperlyConfigured(
            "PROOFWORK_NODE_BROKER_API_USER must not be the publishing user of PROOFWORK_NODE_BROKER_URL:"
            " the platform limits that user to publishing"
        )
    if ca and not os.path.isfile(ca):
        raise ImproperlyConfigured(f"PROOFWORK_NODE_BROKER_CA={ca!r} is not a file")
    if production:
        for name, value in (
            ("PROOFWORK_NODE_BROKER_URL", url),
            ("PROOFWORK_NODE_BROKER_PUBLIC_URL", public_url or url),
        ):
            if not value.startswith("amqps://"):
                raise ImproperlyConfigured(
                    f"{name} must be amqps:// in production: nodes reach the broker over the internet"
                )
