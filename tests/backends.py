"""The login-throttling backend for the test process only (``config.test_settings``).

django-axes refuses an ``authenticate()`` without the request it counts against, and the
test client's ``Client.login()`` sends none. This backend lets such a call go on to the
next backend (ModelBackend) uncounted. A login through a page, the site's or the admin's,
passes its request and is counted and refused as in production
(tests/marketplace/test_login_throttle.py); the live servers the e2e tests start run on
``config.settings``, with axes' own backend.
"""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.http import HttpRequest


class RequestOptionalAxesBackend(AxesStandaloneBackend):
    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> None:
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)
