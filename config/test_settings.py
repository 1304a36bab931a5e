"""The test suite's settings: ``config.settings`` with a var/ directory of its own.

``make run`` and ``make test`` may run at the same time on one checkout. With the embedded
defaults they would otherwise share ``var/``: the filesystem broker's folder (the running
platform worker would take the suite's verification messages, and the suite's workers the
platform's), the channel-layer spool and the media directory. Child processes that the
suite starts inherit the variable, so they share the suite's directory, not the
developer's. (With ``REDIS_URL`` set, give the suite its own Redis database for the same
reason.) ``PROOFWORK_VAR_DIR`` still wins when set.

Under pytest-xdist (``make test-fast``) each worker process gets a directory of its own,
``var/test/<worker id>``: its SQLite test database, broker folders, channel-layer spool and
media, and the processes it starts, are not the other workers'. An explicit
``PROOFWORK_VAR_DIR`` is one directory for the whole run: use it without ``-n``. So is the
Redis of ``REDIS_URL`` (the broker's queues, the cache a test clears): ``-n`` runs on the
embedded broker and cache, or, with ``REDIS_URL`` set, on a pair of Redis databases of each
worker's own: ``gw<n>`` takes database ``2n + 2`` of ``REDIS_URL``'s server for the broker and
the channel layer, and the one after for the cache (a serial run keeps 0 and 1). At most
seven workers fit in Redis's sixteen databases.

The xdist controller loads these settings too, and its workers inherit its environment:
``PROOFWORK_TEST_VAR_DIR`` records the directory this module chose, so a worker that finds
that choice in ``PROOFWORK_VAR_DIR`` chooses again for itself, while a directory the
person running the suite named stays.
"""

import os
from pathlib import Path

from django.conf import global_settings

if os.environ.get("PROOFWORK_VAR_DIR") in (None, os.environ.get("PROOFWORK_TEST_VAR_DIR")):
    os.environ["PROOFWORK_VAR_DIR"] = os.environ["PROOFWORK_TEST_VAR_DIR"] = str(
        Path(__file__).resolve().parent.parent / "var" / "test" / os.environ.get("PYTEST_XDIST_WORKER", "")
    )

# Under xdist, each worker's own Redis databases; ``PROOFWORK_TEST_REDIS_URL`` records the
# choice, so the processes a worker starts (which inherit both variables) keep it.
_xdist_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
_redis_url = os.environ.get("REDIS_URL", "")
if _xdist_worker.startswith("gw") and _redis_url and os.environ.get("PROOFWORK_TEST_REDIS_URL") != _redis_url:
    from urllib.parse import urlsplit, urlunsplit

    _database = 2 * int(_xdist_worker.removeprefix("gw")) + 2
    if _database > 14:
        raise RuntimeError(
            f"pytest-xdist worker {_xdist_worker} has no pair of Redis databases left: use -n 7 or fewer"
        )
    os.environ["REDIS_URL"] = os.environ["PROOFWORK_TEST_REDIS_URL"] = urlunsplit(
        urlsplit(_redis_url)._replace(path=f"/{_database}")
    )

# One held-out secret for every run and the processes it starts: which rows or participants
# a test's dataset holds out must not depend on the checkout's generated secret key.
os.environ.setdefault("PROOFWORK_HELDOUT_SECRET", "the test suite's held-out secret, not a secret")

from config.settings import *  # noqa: E402, F403 (after the environment it reads is set)

# Tests change the pool of workers and read the estimate at once: no reuse of an older list.
SUPPLY_SNAPSHOT_SECONDS = 0

# PostgreSQL: the suite's process runs consumers and services from many threads (the
# channels test communicators' executors, threaded tests), and a thread that ends without
# closing its connection keeps it checked out of the pool. The default ten run out late
# in the suite ("couldn't get a connection after 10.00 sec"); the server allows 100.
if DATABASES["default"]["ENGINE"].endswith("postgresql"):  # noqa: F405
    DATABASES["default"]["OPTIONS"]["pool"]["max_size"] = 40  # noqa: F405

# Test users' passwords: the same PBKDF2 format at 1,000 iterations (tests/hashers.py);
# Django's default hashers still verify every hash a live server or a test makes.
PASSWORD_HASHERS = ["tests.hashers.FastPBKDF2PasswordHasher", *global_settings.PASSWORD_HASHERS]

# The test client's Client.login() authenticates without a request, which django-axes
# refuses: the first backend lets such a call through uncounted (tests/backends.py).
AUTHENTICATION_BACKENDS = ["tests.backends.RequestOptionalAxesBackend", *AUTHENTICATION_BACKENDS[1:]]  # noqa: F405
