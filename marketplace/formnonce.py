"""One-time form nonces: a form that creates a secret creates it once per rendering.

The API token and worker registration pages show their secret once, in the response to
their POST, and store only its hash. A reload of that response re-sends the POST, as do a
double-click and back-then-resubmit; without a nonce each would create another secret
that nobody ever sees. So every rendering of such a form carries a random nonce
(``issue``), remembered in the user's session, and its POST goes ahead only if it is the
first to spend that nonce (``consume``). Anything else is sent back to the page with a
message (``refuse``).

The session says which nonces this browser was given and which it has spent (so the
message can tell a replay from a stale form); a ``cache.add`` claim makes spending atomic,
since two requests sent at once load the same session and would both find the nonce
unspent. No raw secret is kept anywhere: a nonce only ever lets its own session submit its
own form once.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.cache import cache
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import resolve_url

FIELD = "form_nonce"
SESSION_KEY = "form_nonces"
# Per form kind: enough for a user's open tabs; the oldest are dropped first.
MAX_OUTSTANDING = 20
STALE_FORM = "This form had expired, so nothing was created: please submit it again."


class Nonce(enum.Enum):
    """What a submitted nonce turned out to be."""

    FRESH = "fresh"  # issued to this session and now spent by this request: go ahead
    USED = "used"  # spent by an earlier (or a simultaneous) submission
    UNKNOWN = "unknown"  # missing, dropped as the oldest, or never issued to this session


def issue(request: HttpRequest, kind: str) -> str:
    """A new nonce for one rendering of the ``kind`` form (its hidden ``FIELD`` input)."""
    nonce = secrets.token_urlsafe(16)
    state = _state(request, kind)
    state["issued"] = [*state["issued"], nonce][-MAX_OUTSTANDING:]
    _save(request, kind, state)
    return nonce


def consume(request: HttpRequest, kind: str) -> Nonce:
    """Spend the POST's nonce for the ``kind`` form; only ``Nonce.FRESH`` may create anything.

    Call it after validating the form and before creating anything.
    """
    nonce = request.POST.get(FIELD, "")
    state = _state(request, kind)
    if nonce not in state["issued"]:
        return Nonce.USED if nonce in state["used"] else Nonce.UNKNOWN
    state["issued"].remove(nonce)
    state["used"] = [*state["used"], nonce][-MAX_OUTSTANDING:]
    _save(request, kind, state)
    # The session alone is not atomic: a double-click's two requests both load it with the
    # nonce unspent. Only the first to claim it here goes ahead.
    if not cache.add(_claim_key(kind, nonce), True, settings.SESSION_COOKIE_AGE):
        return Nonce.USED
    return Nonce.FRESH


def release(request: HttpRequest, kind: str) -> None:
    """Give back the POST's nonce, spent by ``consume``, when the service refused and created
    nothing: a reload then retries instead of claiming that something was created."""
    nonce = request.POST.get(FIELD, "")
    state = _state(request, kind)
    state["used"] = [used for used in state["used"] if used != nonce]
    state["issued"] = [*state["issued"], nonce][-MAX_OUTSTANDING:]
    _save(request, kind, state)
    cache.delete(_claim_key(kind, nonce))


def refuse(request: HttpRequest, outcome: Nonce, to: str, already_submitted: str) -> HttpResponseRedirect:
    """Send a submission that may not create anything back to its page (``to``, a URL name)
    with a 303, and a message: ``already_submitted`` for a replay, else that the form expired."""
    messages.warning(request, already_submitted if outcome is Nonce.USED else STALE_FORM)
    return HttpResponseRedirect(resolve_url(to), status=303)


def _state(request: HttpRequest, kind: str) -> dict[str, list[str]]:
    stored: Any = request.session.get(SESSION_KEY, {}).get(kind, {})
    return {"issued": list(stored.get("issued", [])), "used": list(stored.get("used", []))}


def _save(request: HttpRequest, kind: str, state: dict[str, list[str]]) -> None:
    # Assigned, not changed in place, so the session knows to save itself.
    request.session[SESSION_KEY] = {**request.session.get(SESSION_KEY, {}), kind: state}


def _claim_key(kind: str, nonce: str) -> str:
    # Hashed: the nonce comes from the request and may hold anything.
    return f"formnonce:{kind}:{hashlib.sha256(nonce.encode()).hexdigest()}"
