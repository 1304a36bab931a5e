"""Admin actions that change what a user owns ask first, and ask why.

``reasoned_action`` wraps an action as Django's ``delete_selected`` works: the first POST
(the changelist's action menu) changes nothing and answers with a page listing the chosen
rows and a required reason; only a second POST carrying ``confirm=yes`` and a valid reason
runs the action, which receives the reason to store where the affected user reads it. A
POST that skips the page, or sends an empty or too long reason, gets the page again (a 400
naming the field when a reason was sent) and changes nothing. Each row the action changes
is written to the admin's history (``LogEntry``) with the reason, so the operator who acted
is on record.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

# Long enough for a sentence, short enough to fit the messages it is stored in
# ("Cancelled by an operator: …" in a 300-character timeline line).
REASON_MAX_LENGTH = 200

Reasoned = Callable[[Any, HttpRequest, QuerySet[Any], str], None]


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=REASON_MAX_LENGTH,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "aria-describedby": "id_reason_helptext"}),
        help_text=f"Shown to the affected user with the change; at most {REASON_MAX_LENGTH} characters.",
        error_messages={"required": "Give a reason: the user is shown it."},
    )


def reasoned_action(
    description: str, *, permissions: list[str], consequence: str
) -> Callable[[Reasoned], Callable[[Any, HttpRequest, QuerySet[Any]], HttpResponse | None]]:
    """Make ``func(modeladmin, request, queryset, reason)`` an admin action that runs only
    after the confirmation page (the module's docstring). ``consequence`` tells the operator,
    on that page, what the action does to the owners of the rows."""

    def wrap(func: Reasoned) -> Callable[[Any, HttpRequest, QuerySet[Any]], HttpResponse | None]:
        @admin.action(description=description, permissions=permissions)
        @wraps(func)
        def action(modeladmin: Any, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
            confirming = request.POST.get("confirm") == "yes"
            form = ReasonForm(request.POST if confirming else None)
            if confirming and form.is_valid():
                func(modeladmin, request, queryset, form.cleaned_data["reason"])
                return None
            opts = modeladmin.model._meta
            context = {
                **modeladmin.admin_site.each_context(request),
                "title": description,
                "description": description,
                "consequence": consequence,
                "objects": list(queryset),
                "opts": opts,
                "app_label": opts.app_label,
                "action_name": func.__name__,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "form": form,
                "media": modeladmin.media,
            }
            request.current_app = modeladmin.admin_site.name
            return TemplateResponse(
                request, "admin/confirm_with_reason.html", context, status=400 if form.is_bound else 200
            )

        action.asks_reason = True  # type: ignore[attr-defined]
        return action

    return wrap


def log_reason(modeladmin: Any, request: HttpRequest, obj: Model, what: str, reason: str) -> None:
    """Record in the admin's history that this operator did ``what`` to ``obj``, and why."""
    modeladmin.log_change(request, obj, f"{what}: {reason}")
