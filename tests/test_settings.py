"""Settings: the typed env helpers fail loudly, and the environment picks the stack.

Settings are read once per process, so each environment is tried in a fresh Python
with exactly the variables the test gives it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_choice, env_int, env_list, env_str, env_url, next_redis_database

ROOT = Path(settings.BASE_DIR)

# --- config/env.py ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("TRUE", True), (" yes ", True), ("on", True), ("0", False), ("false", False), ("", False)],
)
def test_env_bool_reads_the_usual_spellings(raw: str, expected: bool) -> None:
    assert env_bool("FLAG", not expected, environ={"FLAG": raw}) is expected


def test_env_bool_default_and_bad_value() -> None:
    assert env_bool("FLAG", True, environ={}) is True
    with pytest.raises(ImproperlyConfigured, match="FLAG='maybe' is not a boolean"):
        env_bool("FLAG", environ={"FLAG": "maybe"})


def test_env_int_parses_bounds_and_fails_naming_the_variable() -> None:
    assert env_int("N", 5, environ={}) == 5
    assert env_int("N", 5, environ={"N": " "}) == 5
    assert env_int("N", 5, environ={"N": "1_000"}) == 1000
    assert env_int("N", 5, minimum=1, maximum=10, environ={"N": "10"}) == 10
    with pytest.raises(ImproperlyConfigured, match="N='ten' is not an integer"):
        env_int("N", 5, environ={"N": "ten"})
    with pytest.raises(ImproperlyConfigured, match=r"N='2\.5' is not an integer"):
        env_int("N", 5, environ={"N": "2.5"})
    with pytest.raises(ImproperlyConfigured, match="N=0 is below the minimum 1"):
        env_int("N", 5, minimum=1, environ={"N": "0"})
    with pytest.raises(ImproperlyConfigured, match="N=11 is above the maximum 10"):
        env_int("N", 5, maximum=10, environ={"N": "11"})


def test_env_str_and_list() -> None:
    assert env_str("S", "d", environ={}) == "d"
    assert env_str("S", "d", environ={"S": "x"}) == "x"
    assert env_list("L", ["a"], environ={}) == ["a"]
    assert env_list("L", ["a"], environ={"L": " b, ,c "}) == ["b", "c"]
    assert env_list("L", ["a"], environ={"L": ""}) == []


def test_env_choice_takes_only_its_choices() -> None:
    assert env_choice("C", "a", ("a", "b"), environ={}) == "a"
    assert env_choice("C", "a", ("a", "b"), environ={"C": " b "}) == "b"
    with pytest.raises(ImproperlyConfigured, match="C='B' is not one of a, b"):
        env_choice("C", "a", ("a", "b"), environ={"C": "B"})


def test_env_url_checks_the_scheme() -> None:
    assert env_url("U", ("redis",), environ={}) is None
    assert env_url("U", ("redis",), environ={"U": "  "}) is None
    assert env_url("U", ("redis",), environ={"U": "REDIS://h:6379/0"}) == "REDIS://h:6379/0"
    with pytest.raises(ImproperlyConfigured, match="U must start with one of redis://, rediss://"):
        env_url("U", ("redis", "rediss"), environ={"U": "http://h"})
    with pytest.raises(ImproperlyConfigured, match="U must start with"):
        env_url("U", ("redis",), environ={"U": "localhost:6379"})


def test_the_cache_takes_the_redis_database_after_the_brokers() -> None:
    assert next_redis_database("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/1"
    assert next_redis_database("rediss://u:p@cache:6380") == "rediss://u:p@cache:6380/1"
    assert next_redis_database("redis://h:6379/4?timeout=5") == "redis://h:6379/5?timeout=5"
    with pytest.raises(ImproperlyConfigured, match="PROOFWORK_CACHE_URL"):
        next_redis_database("redis://h:6379/15")
    with pytest.raises(ImproperlyConfigured, match="database number"):
        next_redis_database("redis://h:6379/cache")
    with pytest.raises(ImproperlyConfigured, match="not \\?db="):
        next_redis_database("redis://h:6379?db=4")


def test_a_cache_sharing_the_brokers_redis_database_stops_start_up(tmp_path: Path) -> None:
    # Clearing the cache (FLUSHDB) would drop the broker's queued messages.
    base = {"PROOFWORK_VAR_DIR": str(tmp_path), "REDIS_URL": "redis://cache.internal:6379/0"}
    result = run_python({**base, "CELERY_BROKER_URL": "redis://cache.internal/1"}, "-c", PROBE)
    assert result.returncode != 0
    assert "same Redis database as CELERY_BROKER_URL" in result.stderr
    result = run_python({**base, "PROOFWORK_CACHE_URL": "redis://cache.internal:6379/0"}, "-c", PROBE)
    assert "same Redis database as CELERY_BROKER_URL" in result.stderr
    assert probe({**base, "CELERY_BROKER_URL": "redis://other:6379/1"})["cache"][1] == "redis://cache.internal:6379/1"


# --- settings selection, each in a fresh process ------------------------------------------

PROBE = """
import json
from django.conf import settings
layer = settings.CHANNEL_LAYERS["default"]["BACKEND"]
print(json.dumps({
    "engine": settings.DATABASES["default"]["ENGINE"],
    "db_name": str(settings.DATABASES["default"]["NAME"]),
    "broker": settings.CELERY_BROKER_URL,
    "layer": layer,
    "transport_options": settings.CELERY_BROKER_TRANSPORT_OPTIONS,
    "cache": [settings.CACHES["default"]["BACKEND"], settings.CACHES["default"].get("LOCATION", "")],
    "debug": settings.DEBUG,
    "secret_len": len(settings.SECRET_KEY),
    "session_secure": settings.SESSION_COOKIE_SECURE,
    "csrf_secure": settings.CSRF_COOKIE_SECURE,
    "hsts": settings.SECURE_HSTS_SECONDS,
    "ssl_redirect": settings.SECURE_SSL_REDIRECT,
    "allowed_hosts": settings.ALLOWED_HOSTS,
    "var_dir": str(settings.VAR_DIR),
    "max_bytes": settings.DATASET_MAX_BYTES,
    "heldout_secret": settings.HELDOUT_SECRET.hex(),
    "renderers": settings.REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"],
    "celery": [settings.CELERY_TASK_SERIALIZER, settings.CELERY_RESULT_SERIALIZER, settings.CELERY_ACCEPT_CONTENT,
               settings.CELERY_TASK_ACKS_LATE, settings.CELERY_WORKER_PREFETCH_MULTIPLIER],
}))
"""


def run_python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def probe(env: dict[str, str]) -> dict[str, Any]:
    result = run_python(env, "-c", PROBE)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return loaded


def production_env(tmp_path: Path) -> dict[str, str]:
    return {
        "PROOFWORK_PRODUCTION": "1",
        "PROOFWORK_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(60),
        "DJANGO_ALLOWED_HOSTS": "proofwork.example, www.proofwork.example",
        "LEDGER_ENCRYPTION_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        "LEDGER_TREASURY_KEY": secrets.token_hex(32),
        "LEDGER_VALIDATOR_KEY": secrets.token_hex(32),
        **NODE_BROKER_ENV,
        "PROOFWORK_NODE_BROKER_URL": "amqps://platform:pl4tform@rabbitmq.internal:5671/proofwork-nodes",
        "PROOFWORK_NODE_BROKER_PUBLIC_URL": "amqps://broker.proofwork.example:5671/proofwork-nodes",
    }


NODE_BROKER_ENV = {
    "PROOFWORK_NODE_BROKER_URL": "amqp://platform:pl4tform@127.0.0.1:5672/proofwork-nodes",
    "PROOFWORK_NODE_BROKER_API_URL": "http://127.0.0.1:15672",
    "PROOFWORK_NODE_BROKER_API_USER": "admin",
    "PROOFWORK_NODE_BROKER_API_PASSWORD": "4dmin",
}
NODE_PROBE = """
from django.conf import settings
print(settings.NODE_BROKER_URL, settings.NODE_BROKER_PUBLIC_URL, settings.NODE_QUEUE_DIR.is_dir())
"""


def test_without_a_node_broker_node_queues_stay_on_the_filesystem_even_beside_redis(tmp_path: Path) -> None:
    # Development with Redis but no RabbitMQ: the local agent gets the filesystem broker,
    # never the platform's Redis.
    result = run_python({"PROOFWORK_VAR_DIR": str(tmp_path), "REDIS_URL": "redis://127.0.0.1:6379/0"}, "-c", NODE_PROBE)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["None", "None", "True"]


def test_nodes_are_told_the_node_brokers_address_without_the_platforms_login(tmp_path: Path) -> None:
    result = run_python({"PROOFWORK_VAR_DIR": str(tmp_path), **NODE_BROKER_ENV}, "-c", NODE_PROBE)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[:2] == [
        NODE_BROKER_ENV["PROOFWORK_NODE_BROKER_URL"],
        "amqp://127.0.0.1:5672/proofwork-nodes",
    ]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"PROOFWORK_NODE_BROKER_URL": "redis://127.0.0.1:6379/0"}, "must start with one of amqp://, amqps://"),
        ({"PROOFWORK_NODE_BROKER_URL": "amqp://127.0.0.1:5672/nodes"}, "the platform's own broker user and password"),
        ({"PROOFWORK_NODE_BROKER_URL": "amqp://p:w@127.0.0.1:5672/"}, "must name the vhost"),
        ({"PROOFWORK_NODE_BROKER_API_PASSWORD": ""}, "PROOFWORK_NODE_BROKER_API_URL"),
        ({"PROOFWORK_NODE_BROKER_API_USER": "platform"}, "must not be the publishing user"),
        ({"PROOFWORK_NODE_BROKER_PUBLIC_URL": "amqps://u:p@broker.example/proofwork-nodes"}, "must not carry"),
        ({"PROOFWORK_NODE_BROKER_PUBLIC_URL": "amqps://broker.example/other"}, "the same vhost"),
        ({"PROOFWORK_NODE_BROKER_CA": "/nonexistent/ca.pem"}, "is not a file"),
        # httpx logs each management call's URL at INFO, user and password included.
        (
            {"PROOFWORK_NODE_BROKER_API_URL": "http://admin:4dmin@127.0.0.1:15672"},
            "PROOFWORK_NODE_BROKER_API_URL must not carry credentials",
        ),
    ],
)
def test_a_node_broker_that_cannot_work_stops_start_up(tmp_path: Path, change: dict[str, str], words: str) -> None:
    env = {"PROOFWORK_VAR_DIR": str(tmp_path), **NODE_BROKER_ENV, **change}
    result = run_python({k: v for k, v in env.items() if v}, "-c", NODE_PROBE)
    assert result.returncode != 0
    assert words in result.stderr


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"PROOFWORK_NODE_BROKER_URL": ""}, "PROOFWORK_NODE_BROKER_URL (amqps://...) is required"),
        (
            {"PROOFWORK_NODE_BROKER_URL": "amqp://platform:pl4tform@rabbitmq.internal:5672/proofwork-nodes"},
            "PROOFWORK_NODE_BROKER_URL must be amqps:// in production",
        ),
        (
            {"PROOFWORK_NODE_BROKER_PUBLIC_URL": "amqp://broker.proofwork.example:5672/proofwork-nodes"},
            "PROOFWORK_NODE_BROKER_PUBLIC_URL must be amqps:// in production",
        ),
    ],
)
def test_production_requires_a_tls_node_broker(tmp_path: Path, change: dict[str, str], words: str) -> None:
    env = {**production_env(tmp_path), **change}
    result = run_python({k: v for k, v in env.items() if v}, "-c", PROBE)
    assert result.returncode != 0
    assert words in result.stderr


def test_no_environment_runs_embedded() -> None:
    # Truly no variables: what `make run` on a laptop sees (var/ is git-ignored).
    got = probe({})
    assert got["engine"] == "django.db.backends.sqlite3"
    assert got["db_name"] == str(ROOT / "var" / "db.sqlite3")
    assert got["broker"] == "filesystem://"
    assert got["layer"] == "config.channel_layers.EmbeddedChannelLayer"
    assert got["cache"][0] == "django.core.cache.backends.locmem.LocMemCache"
    assert got["debug"] is True
    assert got["secret_len"] >= 50
    assert got["session_secure"] is False
    assert "testserver" in got["allowed_hosts"]
    assert got["max_bytes"] == 64 * 2**30
    assert "rest_framework.renderers.BrowsableAPIRenderer" in got["renderers"]


def test_celery_is_json_only_with_late_acks_and_one_prefetch(tmp_path: Path) -> None:
    got = probe({"PROOFWORK_VAR_DIR": str(tmp_path)})
    assert got["celery"] == ["json", "json", ["json"], True, 1]


def test_the_development_secret_is_kept_between_runs(tmp_path: Path) -> None:
    env = {"PROOFWORK_VAR_DIR": str(tmp_path)}
    probe(env)
    secret = (tmp_path / "dev-secret-key").read_text()
    assert len(secret) >= 50
    assert oct((tmp_path / "dev-secret-key").stat().st_mode & 0o777) == "0o600"
    probe(env)
    assert (tmp_path / "dev-secret-key").read_text() == secret


def test_database_and_redis_urls_switch_to_postgres_and_redis(tmp_path: Path) -> None:
    got = probe(
        {
            "PROOFWORK_VAR_DIR": str(tmp_path),
            "DATABASE_URL": "postgres://pw:secret@db.internal:5432/proofwork",
            "REDIS_URL": "redis://cache.internal:6379/2",
        }
    )
    assert got["engine"] == "django.db.backends.postgresql"
    assert got["db_name"] == "proofwork"
    assert got["broker"] == "redis://cache.internal:6379/2"
    assert got["layer"] == "channels_redis.core.RedisChannelLayer"
    # A verification longer than Redis's default hour is not delivered twice.
    assert got["transport_options"] == {"visibility_timeout": 86400}
    # Throttle counters are shared by every web process, beside the broker, not in its database.
    assert got["cache"] == ["django.core.cache.backends.redis.RedisCache", "redis://cache.internal:6379/3"]
    own = probe({"PROOFWORK_VAR_DIR": str(tmp_path), "PROOFWORK_CACHE_URL": "redis://other:6379/0"})
    assert own["cache"] == ["django.core.cache.backends.redis.RedisCache", "redis://other:6379/0"]
    # Nothing else changes without the production flag.
    assert got["debug"] is True


def test_production_hardens_everything(tmp_path: Path) -> None:
    got = probe(production_env(tmp_path))
    assert got["debug"] is False
    assert got["session_secure"] is True
    assert got["csrf_secure"] is True
    assert got["ssl_redirect"] is True
    assert got["hsts"] >= 31_536_000
    assert got["allowed_hosts"] == ["proofwork.example", "www.proofwork.example"]
    assert got["renderers"] == ["rest_framework.renderers.JSONRenderer"]


def test_production_passes_the_deploy_check(tmp_path: Path) -> None:
    result = run_python(production_env(tmp_path), "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "no issues" in result.stdout


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"DJANGO_SECRET_KEY": ""}, "DJANGO_SECRET_KEY is required"),
        ({"DJANGO_SECRET_KEY": "short"}, "DJANGO_SECRET_KEY must be at least 50 characters"),
        ({"DJANGO_DEBUG": "1"}, "DJANGO_DEBUG cannot be on"),
        ({"LEDGER_ENCRYPTION_KEY": ""}, "LEDGER_ENCRYPTION_KEY is required"),
    ],
)
def test_production_without_its_secrets_fails_loudly(tmp_path: Path, change: dict[str, str], words: str) -> None:
    env = {k: v for k, v in production_env(tmp_path).items() if change.get(k, "x") != ""}
    env.update({k: v for k, v in change.items() if v})
    result = run_python(env, "-c", PROBE)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert words in result.stderr


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"DJANGO_DEBUG": "perhaps"}, "DJANGO_DEBUG='perhaps' is not a boolean"),
        ({"PROOFWORK_PRODUCTION": "yes please"}, "PROOFWORK_PRODUCTION='yes please' is not a boolean"),
        ({"DATABASE_URL": "mysql://x/y"}, "DATABASE_URL must start with one of postgres://"),
        ({"REDIS_URL": "http://cache"}, "REDIS_URL must start with one of redis://"),
        ({"PROOFWORK_DATASET_MAX_BYTES": "lots"}, "PROOFWORK_DATASET_MAX_BYTES='lots' is not an integer"),
        ({"PROOFWORK_DATASET_MAX_BYTES": "0"}, "PROOFWORK_DATASET_MAX_BYTES=0 is below the minimum 1"),
        ({"PROOFWORK_HELDOUT_SECRET": "short"}, "PROOFWORK_HELDOUT_SECRET must be at least 32 characters"),
        (
            {"PROOFWORK_SEGMENT_REEXECUTION": "elsewhere"},
            "PROOFWORK_SEGMENT_REEXECUTION='elsewhere' is not one of platform, delegated",
        ),
        ({"PROOFWORK_DELEGATE_WAIT": "5"}, "PROOFWORK_DELEGATE_WAIT=5 is below the minimum 30"),
        ({"PROOFWORK_DELEGATE_CANARIES": "0"}, "PROOFWORK_DELEGATE_CANARIES=0 is below the minimum 1"),
    ],
)
def test_a_bad_variable_stops_start_up_naming_it(tmp_path: Path, env: dict[str, str], words: str) -> None:
    result = run_python({"PROOFWORK_VAR_DIR": str(tmp_path), **env}, "-c", PROBE)
    assert result.returncode != 0
    assert words in result.stderr


def test_dataset_limit_comes_from_the_environment(tmp_path: Path) -> None:
    got = probe({"PROOFWORK_VAR_DIR": str(tmp_path), "PROOFWORK_DATASET_MAX_BYTES": "1_048_576"})
    assert got["max_bytes"] == 1_048_576
    # Tens of GiB: the full-scale ISLR set fits the default, and a larger limit can be set.
    assert probe({"PROOFWORK_VAR_DIR": str(tmp_path)})["max_bytes"] == 64 * 2**30
    assert probe({"PROOFWORK_VAR_DIR": str(tmp_path), "PROOFWORK_DATASET_MAX_BYTES": str(200 * 2**30)})[
        "max_bytes"
    ] == (200 * 2**30)


def test_the_held_out_secret_is_derived_from_the_secret_key_unless_set(tmp_path: Path) -> None:
    base = {"PROOFWORK_VAR_DIR": str(tmp_path), "DJANGO_SECRET_KEY": "k" * 60}
    derived = hmac.new(b"k" * 60, b"proofwork:heldout-secret", hashlib.sha256).hexdigest()
    assert probe(base)["heldout_secret"] == derived
    assert probe({**base, "DJANGO_SECRET_KEY": "j" * 60})["heldout_secret"] != derived
    assert probe({**base, "PROOFWORK_HELDOUT_SECRET": "s" * 32})["heldout_secret"] == (b"s" * 32).hex()


# --- config/test_settings.py --------------------------------------------------------------


def test_each_xdist_worker_of_the_suite_gets_a_var_directory_and_database_of_its_own() -> None:
    """``make test-fast`` runs the suite in several processes at once: two of them sharing
    the SQLite test database or the broker folder would take each other's rows and messages."""
    test_settings = {"DJANGO_SETTINGS_MODULE": "config.test_settings"}
    workers = {name: probe({**test_settings, "PYTEST_XDIST_WORKER": name}) for name in ("gw0", "gw1")}
    for name, got in workers.items():
        assert got["var_dir"] == str(ROOT / "var" / "test" / name)
        assert got["transport_options"]["data_folder_in"] == str(ROOT / "var" / "test" / name / "celery" / "out")
    assert probe(test_settings)["var_dir"] == str(ROOT / "var" / "test")  # without xdist: var/test itself
