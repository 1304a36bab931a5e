"""Sign up, log in (and the page of a login locked out), password reset, the account
page and API tokens."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from axes.utils import reset as forget_login_failures
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Max, Q
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.template.defaultfilters import pluralize
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST
from rest_framework.exceptions import NotFound, ValidationError

from ledger import services as ledger
from ledger.units import format_credits
from marketplace import formnonce, services
from marketplace.forms import PasswordResetForm, SetPasswordForm, SignupForm, TokenForm
from marketplace.models import ApiToken
from marketplace.views.common import current_user

CREATE_FORM = "api-token"
ALREADY_CREATED = (
    "This form was already submitted: the token was shown once and is not shown again. "
    "Its name is listed below; revoke it if you did not copy it, or create another."
)


def _next_url(request: HttpRequest) -> str:
    """Where the login page was sending the user (``next``), if it is a page of this site:
    a path from the root. A bare word passes Django's host check as a relative URL, and
    ``redirect()`` would try it as a URL name (NoReverseMatch, after the account is
    created)."""
    url = request.POST.get("next") or request.GET.get("next") or ""
    safe = url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()}, require_https=request.is_secure())
    return url if safe and url.startswith("/") else ""


class LoginView(auth_views.LoginView):
    """Django's login page, for a signed-in user too: it goes on to ``next``, except when
    ``next`` is the login page itself (Django raises on that loop)."""

    redirect_authenticated_user = True

    def get_redirect_url(self, *args: Any, **kwargs: Any) -> str:  # the stubs' signature is Django's plus one
        url = super().get_redirect_url(*args, **kwargs)
        return "" if url and urlsplit(url).path == self.request.path else url


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: dict[str, Any] | None = None
) -> HttpResponse:
    """What a login refused for too many failed ones gets, on the site and the admin
    (django-axes calls it: AXES_LOCKOUT_CALLABLE): a 429 page saying when to try again,
    and the way out through a password reset.

    Tries while locked out are not counted (AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT),
    so the lock is over a cool-off after the last counted failure of the account or the
    address, at the latest (sooner where older failures expire first)."""
    cool_off = get_cool_off(request) or timedelta(0)
    now = timezone.now()
    username = get_client_username(request, credentials)
    last = (
        AccessAttempt.objects.filter(Q(username=username) | Q(ip_address=getattr(request, "axes_ip_address", None)))
        .filter(attempt_time__gt=now - cool_off)
        .aggregate(last=Max("attempt_time"))["last"]
    )
    until = (last or now) + cool_off
    wait = max(until - now, timedelta(0))
    context = {"until": until, "minutes": max(1, math.ceil(wait.total_seconds() / 60))}
    response = render(request, "registration/locked_out.html", context, status=429)
    response["Retry-After"] = str(math.ceil(wait.total_seconds()))
    return response


def reset_link_lifetime() -> str:
    """How long a password reset link works (PASSWORD_RESET_TIMEOUT), in words."""
    seconds = settings.PASSWORD_RESET_TIMEOUT
    if seconds % 3600 == 0:
        hours = seconds // 3600
        return f"{hours} hour{pluralize(hours)}"
    minutes = max(1, seconds // 60)
    return f"{minutes} minute{pluralize(minutes)}"


class PasswordResetView(auth_views.PasswordResetView):
    """Django's: e-mails a one-time link to set a new password. The next page says the same
    whether the address has an account or not, and no mail goes to an address without one."""

    form_class = PasswordResetForm
    email_template_name = "registration/password_reset_email.txt"
    subject_template_name = "registration/password_reset_subject.txt"

    def form_valid(self, form: Any) -> HttpResponse:
        self.extra_email_context = {"valid_for": reset_link_lifetime()}
        return super().form_valid(form)


class PasswordResetDoneView(auth_views.PasswordResetDoneView):
    extra_context = {"valid_for": reset_link_lifetime}


class PasswordResetConfirmView(auth_views.PasswordResetConfirmView):
    """Django's: a new password through the e-mailed link. It also clears the account's
    failed logins, so someone else's guesses do not keep its owner out after the reset."""

    form_class = SetPasswordForm

    def form_valid(self, form: Any) -> HttpResponse:
        response = super().form_valid(form)
        forget_login_failures(username=form.user.get_username())
        return response


def signup(request: HttpRequest) -> HttpResponse:
    """Create an account and sign straight in, then go on to the page that asked for it."""
    next_url = _next_url(request)
    if request.user.is_authenticated:
        return HttpResponseRedirect(next_url) if next_url else redirect("my-tasks")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        # The user and their ledger account (with any signup grant) exist together or not at all.
        with transaction.atomic():
            user = form.save()
            services.welcome_user(user)
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"Welcome, {user.username}! Your account is ready.")
        return HttpResponseRedirect(next_url) if next_url else redirect("my-tasks")
    context = {"form": form, "next": next_url}
    return render(request, "registration/signup.html", context, status=400 if form.errors else 200)


def _account_page(
    request: HttpRequest, form: TokenForm, new_token: str = "", new_token_name: str = "", status: int = 200
) -> HttpResponse:
    user = current_user(request)
    context = {
        "profile": user,
        "balance": format_credits(ledger.balance(user)),
        "escrowed": format_credits(ledger.escrowed(user)),
        "token_form": form,
        "token_form_nonce": formnonce.issue(request, CREATE_FORM),
        "tokens": ApiToken.objects.owned_by(user).active(),
        # The owner did not revoke these: say so, and why (the newest few).
        "operator_revoked": ApiToken.objects.owned_by(user).exclude(revoked_reason="").order_by("-revoked_at")[:5],
        "new_token": new_token,
        "new_token_name": new_token_name,
        "max_tokens": services.MAX_TOKENS_PER_USER,
    }
    return render(request, "marketplace/account.html", context, status=status)


@login_required
def account(request: HttpRequest) -> HttpResponse:
    """Profile and API tokens."""
    return _account_page(request, TokenForm())


@never_cache
@login_required
@require_POST
def token_create(request: HttpRequest) -> HttpResponse:
    """Create a token and show it, once, in this response: it is never stored or shown again.

    Once per rendering of the form (its nonce): a reload of this response, a double-click
    or a resubmitted old form creates nothing and goes back to the account page.
    """
    form = TokenForm(request.POST)
    if form.is_valid():
        submitted = formnonce.consume(request, CREATE_FORM)
        if submitted is not formnonce.Nonce.FRESH:
            return formnonce.refuse(request, submitted, "account", ALREADY_CREATED)
        try:
            token, raw = services.create_api_token(current_user(request), form.cleaned_data["name"])
        except ValidationError as exc:
            formnonce.release(request, CREATE_FORM)
            form.add_service_errors(exc.detail)
        else:
            # Rendered, not redirected: a redirect would need the raw token stored somewhere.
            return _account_page(request, TokenForm(), new_token=raw, new_token_name=token.name)
    return _account_page(request, form, status=400)


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        token = services.revoke_api_token(current_user(request), pk)
    except NotFound:
        raise Http404("No such token.") from None
    messages.success(request, f"Token “{token.name}” revoked; it no longer works.")
    return redirect("account")
