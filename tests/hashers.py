"""A fast password hasher for the test process only (``config.test_settings``).

Django's PBKDF2 runs 1,000,000 iterations, about 0.35 s a password on a CI core, and
nearly every test creates users: that was half of the suite's fixture time. This hasher
writes the same ``pbkdf2_sha256$<iterations>$…`` format with 1,000 iterations, and a
stored hash names its own iteration count, so the live servers the suite starts (on
``config.settings``, with Django's default hashers) verify these passwords as they are
and upgrade them on first login like any older hash.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000
