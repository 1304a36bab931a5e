"""One-time form nonces: a form that creates a secret creates it once per rendering.

The API token and worker registration pages show their secret once, in the response to
their POST, and store only its hash. A reload of that response re-sends the POST, as do a
double-click and back-then-resubmit; without a nonce each would create another secret
that nobody ever sees. So every rendering of such a form carries a nonce (``issue``), and
its POST goes ahead only if it is the first to spend it (``consume``). Anything else is
sent back to the page with a message (``refuse``).

A nonce is signed, not stored: it names its session (by a hash of the session key, never
the key), its user and its form, and the signature (with a timestamp, so it expires after
``MAX_AGE``) says the server issued it. Rendering a form
therefore writes nothing, and two tabs opened at once each get a nonce that works (a
nonce remembered in the session was lost when two renderings saved it together). Spending
is a ``cache.add`` claim, atomic across processes, so of a double-click's two requests only
the first goes ahead; the session also keeps the newest spent nonces, so a replay is told
"already submitted" even after the cache dropped the claim (a nonce of another session,
which that list does not cover, is refused outright). No raw secret is kept anywhere: a
nonce only ever lets its own session submit its own form once.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.core import signing
from django.core.cache import cache
from django.http import HttpRequest, HttpResponseRedirect
from django.shortcuts import resolve_url

FIELD = "form_nonce"
SESSION_KEY = "form_nonces_spent"
SALT = "proofwork.formnonce"
# A form left open longer than this says it expired; nothing is created from it.
MAX_AGE = timedelta(days=1)
# Per form kind, the spent nonces the session remembers (the cache claim is the guard).
MAX_SPENT = 20
STALE_FORM = "This form had expired, so nothing was created: please submit it again."


class Nonce(enum.Enum):
    """What a submitted nonce turned out to be."""

    FRESH = "fresh"  # issued to this session for this form and now spent by this request: go ahead
    USED = "used"  # spent by an earlier (or a simultaneous) submission
    UNKNOWN = "unknown"  # missing, expired, tampered with, or issued to another session or form


def issue(request: HttpRequest, kind: str) -> str:
    """A new nonce for one rendering of the ``kind`` form (its hidden ``FIELD`` input)."""
    fields = {"s": _session_tag(request), "u": _user_id(request), "k": kind, "r": secrets.token_urlsafe(12)}
    return signing.dumps(fields, salt=SALT)


def consume(request: HttpRequest, kind: str) -> Nonce:
    """Spend the POST's nonce for the ``kind`` form; only ``Nonce.FRESH`` may create anything.

    Call it after validating the form and before creating anything.
    """
    nonce = request.POST.get(FIELD, "")
    if not _issued_for(request, kind, nonce):
        return Nonce.UNKNOWN
    digest = _digest(nonce)
    spent = _spent(request, kind)
    if digest in spent:
        return Nonce.USED
    # A double-click's two requests both load the session with the nonce unspent: only the
    # first to claim it here goes ahead.
    if not cache.add(_claim_key(kind, digest), True, int(MAX_AGE.total_seconds())):
        return Nonce.USED
    _save(request, kind, [*spent, digest][-MAX_SPENT:])
    return Nonce.FRESH


def release(request: HttpRequest, kind: str) -> None:
    """Give back the POST's nonce, spent by ``consume``, when the service refused and created
    nothing: a reload then retries instead of claiming that something was created."""
    digest = _digest(request.POST.get(FIELD, ""))
    _save(request, kind, [spent for spent in _spent(request, kind) if spent != digest])
    cache.delete(_claim_key(kind, digest))


def refuse(request: HttpRequest, outcome: Nonce, to: str, already_submitted: str) -> HttpResponseRedirect:
    """Send a submission that may not create anything back to its page (``to``, a URL name)
    with a 303, and a message: ``already_submitted`` for a replay, else that the form expired."""
    messages.warning(request, already_submitted if outcome is Nonce.USED else STALE_FORM)
    return HttpResponseRedirect(resolve_url(to), status=303)


def _issued_for(request: HttpRequest, kind: str, nonce: str) -> bool:
    try:
        fields: Any = signing.loads(nonce, salt=SALT, max_age=MAX_AGE)
    except signing.BadSignature:  # also SignatureExpired
        return False
    return (
        isinstance(fields, dict)
        and fields.get("s") == _session_tag(request)
        and fields.get("u") == _user_id(request)
        and fields.get("k") == kind
    )


def _session_tag(request: HttpRequest) -> str:
    """Names the session in a nonce (a nonce is readable page text: not the key itself)."""
    if request.session.session_key is None:
        request.session.save()
    return hashlib.sha256(f"formnonce:{request.session.session_key}".encode()).hexdigest()[:16]


def _user_id(request: HttpRequest) -> str:
    return str(request.user.pk)


def _spent(request: HttpRequest, kind: str) -> list[str]:
    stored: Any = request.session.get(SESSION_KEY, {})
    spent = stored.get(kind, []) if isinstance(stored, dict) else []
    return [digest for digest in spent if isinstance(digest, str)]


def _save(request: HttpRequest, kind: str, spent: list[str]) -> None:
    # Assigned, not changed in place, so the session knows to save itself.
    request.session[SESSION_KEY] = {**request.session.get(SESSION_KEY, {}), kind: spent}


def _digest(nonce: str) -> str:
    # Hashed: the nonce comes from the request and may hold anything.
    return hashlib.sha256(nonce.encode("utf-8", "surrogatepass")).hexdigest()


def _claim_key(kind: str, digest: str) -> str:
    return f"formnonce:{kind}:{digest}"
