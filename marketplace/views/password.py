"""The password page."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpResponse

from marketplace.events import SIGN_IN_ID, changing_sign_in
from marketplace.forms import PasswordChangeForm


class PasswordChangeView(auth_views.PasswordChangeView):
    """Django's, naming the browser that changes its password: Django keeps its session
    signed in, and its live sockets stay open while every other one of the user's closes
    (see ``marketplace.events.on_user_post_save``)."""

    form_class = PasswordChangeForm

    def form_valid(self, form: Any) -> HttpResponse:
        token = changing_sign_in.set(str(self.request.session.get(SIGN_IN_ID, "")))
        try:
            return super().form_valid(form)
        finally:
            changing_sign_in.reset(token)
