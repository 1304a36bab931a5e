"""Forms of the browser pages.

The task form is built from the kind's spec serializer, so a field added to a kind
shows up on the page with its type, bounds, default and help text. Forms only parse
input; the services decide, and their field-named errors are mapped back onto the form.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib.auth import forms as auth_forms
from rest_framework import serializers

from ledger.units import UNITS_PER_CREDIT, credits_to_units, format_credits
from marketplace.kinds import Kind
from marketplace.models import Dataset, Task, TaskStatus, User
from marketplace.services import TaskRequest

SPEC_PREFIX = "spec_"


def describe_fields(form: forms.BaseForm) -> None:
    """Point every input at its help text and its error slot, so screen readers read both.

    The error slot always exists (empty when valid) because htmx fills it in place.
    """
    for name, field in form.fields.items():
        auto_id = form[name].auto_id
        ids = [f"{auto_id}_error"]
        if field.help_text:
            ids.insert(0, f"{auto_id}_helptext")
        field.widget.attrs.setdefault("aria-describedby", " ".join(ids))


def error_messages(detail: Any) -> list[str]:
    """Flatten a DRF error detail (list, dict or string) into plain messages."""
    if isinstance(detail, dict):
        out: list[str] = []
        for key, value in detail.items():
            prefix = "" if key == "non_field_errors" else f"{key}: "
            out.extend(prefix + message for message in error_messages(value))
        return out
    if isinstance(detail, list | tuple):
        return [message for item in detail for message in error_messages(item)]
    return [str(detail)]


def error_summary(form: forms.BaseForm, order: Iterable[forms.BoundField] | None = None) -> list[dict[str, str]]:
    """A refused form's errors for the summary at the top of the page (GOV.UK's error
    summary), in the order the page shows its fields (``order``; the form's own without):
    each with the id of the input it links to ("" for an error of the whole form), the
    field's label and the message."""
    if not form.is_bound or not form.errors:
        return []
    rows = [{"id": "", "label": "", "message": str(message)} for message in form.non_field_errors()]
    for bound in order if order is not None else form:
        rows.extend(
            {"id": bound.id_for_label, "label": str(bound.label), "message": str(message)} for message in bound.errors
        )
    return rows


class ServiceErrorsMixin:
    """Map a service's ValidationError detail onto the form's fields."""

    #: service error key → form field name, where they differ
    error_field_map: dict[str, str] = {}

    def add_service_errors(self, detail: Any) -> None:
        form: forms.BaseForm = self  # type: ignore[assignment]
        if not isinstance(detail, dict):
            form.add_error(None, error_messages(detail))
            return
        for key, value in detail.items():
            if key == "spec" and isinstance(value, dict):
                for sub, messages in value.items():
                    name = SPEC_PREFIX + str(sub)
                    if name in form.fields:
                        form.add_error(name, error_messages(messages))
                    else:
                        form.add_error(
                            None, error_messages({f"spec.{sub}" if sub != "non_field_errors" else sub: messages})
                        )
                continue
            field_name = self.error_field_map.get(str(key), str(key))
            if field_name in form.fields:
                form.add_error(field_name, error_messages(value))
            else:
                form.add_error(None, error_messages(value))


# --- Accounts -----------------------------------------------------------------------


class SignupForm(auth_forms.UserCreationForm):
    """Sign up for marketplace.User with an optional e-mail address."""

    email = forms.EmailField(required=False, help_text="Optional; used only for account notices.")

    class Meta(auth_forms.UserCreationForm.Meta):
        model = User
        fields = ("username", "email")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        describe_fields(self)


class LoginForm(auth_forms.AuthenticationForm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        describe_fields(self)


class PasswordChangeForm(auth_forms.PasswordChangeForm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        describe_fields(self)


class PasswordResetForm(auth_forms.PasswordResetForm):
    """Asks for the account's e-mail; the page says the same whether one matches or not."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["email"].help_text = "The address your account was made with."
        describe_fields(self)


class SetPasswordForm(auth_forms.SetPasswordForm):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        describe_fields(self)


class TokenForm(ServiceErrorsMixin, forms.Form):
    name = forms.CharField(
        label="Token name",
        max_length=64,
        help_text="What the token is for, e.g. “laptop CLI”. Up to 64 characters.",
        widget=forms.TextInput(attrs={"autocomplete": "off"}),
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        describe_fields(self)


# --- Datasets -----------------------------------------------------------------------


class DatasetUploadForm(ServiceErrorsMixin, forms.Form):
    file = forms.FileField(allow_empty_file=True)  # the service names the empty-file error
    name = forms.CharField(max_length=200, required=False, help_text="Optional; the file's name otherwise.")

    def __init__(self, *args: Any, max_bytes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from django.template.defaultfilters import filesizeformat

        self.fields["file"].help_text = (
            f"Up to {filesizeformat(max_bytes)}. NumPy .npy, safetensors, ZIP, Parquet, CSV, JSON or plain text; "
            "files are stored as bytes, never executed."
        )
        describe_fields(self)


# --- Tasks --------------------------------------------------------------------------


def _label(name: str) -> str:
    return name.replace("_", " ").capitalize()


def spec_form_field(field: serializers.Field, owner: User, kind: Kind) -> forms.Field:
    """The form field that edits one spec serializer field: same type, bounds and default."""
    common: dict[str, Any] = {"label": _label(field.field_name or ""), "help_text": str(field.help_text or "")}
    default = None if field.default is serializers.empty else field.default
    if isinstance(field, serializers.BooleanField):
        return forms.BooleanField(required=False, initial=bool(default), **common)
    if isinstance(field, serializers.ChoiceField):
        values = list(field.choices)
        coerce: Any = int if all(isinstance(v, int) for v in values) else str
        return forms.TypedChoiceField(
            choices=[(v, str(field.choices[v])) for v in values], coerce=coerce, initial=default, **common
        )
    if isinstance(field, serializers.IntegerField):
        return forms.IntegerField(min_value=field.min_value, max_value=field.max_value, initial=default, **common)
    if isinstance(field, serializers.FloatField):
        return forms.FloatField(min_value=field.min_value, max_value=field.max_value, initial=default, **common)
    if isinstance(field, serializers.UUIDField):
        # The only UUIDs in specs are source tasks: offer the owner's finished training runs.
        source_kind = kind.source_kind or ""
        sources = (
            Task.objects.owned_by(owner)
            .filter(kind=source_kind, status=TaskStatus.COMPLETED)
            .only("pk", "title", "finished_at")
            .order_by("-finished_at", "-pk")
        )
        # Untitled tasks share their kind's label: the finish time and the id tell them apart.
        choices = [("", "— choose a completed training task —")] + [
            (str(t.pk), f"{t.title} · finished {t.finished_at:%Y-%m-%d %H:%M} UTC · {str(t.pk)[:8]}")
            if t.finished_at
            else (str(t.pk), f"{t.title} · {t.pk}")
            for t in sources
        ]
        if len(choices) == 1:
            common["help_text"] += f" You have no completed {source_kind} task yet."
        return forms.ChoiceField(choices=choices, **common)
    return forms.CharField(initial=default, **common)


def _credits_field(**kwargs: Any) -> forms.DecimalField:
    """An amount of credits, bounded as the API bounds it (``CreditsField``)."""
    return forms.DecimalField(
        max_digits=19,
        decimal_places=9,
        min_value=Decimal(1) / UNITS_PER_CREDIT,
        max_value=Decimal(9_000_000_000),
        # Django's own say "greater than or equal to 1E-9": the bounds in credits, as the API words them.
        error_messages={
            "min_value": f"Must be at least {format_credits(1)} credits.",
            "max_value": f"Must be at most {format_credits(9_000_000_000 * UNITS_PER_CREDIT)} credits.",
        },
        **kwargs,
    )


# The settings every requester sets; the others sit under the post page's "Advanced".
COMMON_SETTINGS = ("budget", "bid", "replication", "draft")
ADVANCED_SETTINGS = ("min_reputation", "max_attempts")


class TaskForm(ServiceErrorsMixin, forms.Form):
    """Post a task of one kind: the kind's spec fields plus budget and worker settings."""

    title = forms.CharField(max_length=200, required=False, help_text="Optional; the kind's name otherwise.")
    dataset = forms.ModelChoiceField(queryset=Dataset.objects.none(), required=False, empty_label="— no dataset —")
    budget = _credits_field(
        label="Budget (credits)",
        help_text="The most you pay, in credits (up to 9 decimal places): every replica may be paid the bid.",
    )
    bid = _credits_field(
        label="Bid per replica (credits)",
        required=False,
        help_text="The most you pay per replica, the platform's fee included; the job pays its node's ask and the"
        " rest comes back. Empty: the budget's share per replica.",
    )
    min_reputation = forms.IntegerField(
        label="Minimum worker reputation", min_value=0, max_value=100, initial=0, help_text="0–100."
    )
    replication = forms.IntegerField(
        min_value=1,
        max_value=5,
        initial=1,
        help_text="Workers of different providers that each compute the same result (1–5).",
    )
    max_attempts = forms.IntegerField(
        min_value=1, max_value=10, initial=3, help_text="Assignments tried before the task fails (1–10)."
    )
    draft = forms.BooleanField(
        label="Save as a draft", required=False, help_text="Keep it private; publish it from the task page later."
    )

    def __init__(self, *args: Any, kind: Kind, owner: User, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kind = kind
        self.owner = owner
        # A spec field styled {"form": False} is a protocol detail, settable over the API: the
        # form leaves it out, so the serializer's default applies.
        shown = {name: f for name, f in kind.spec_serializer().fields.items() if f.style.get("form", True)}
        self.spec_names = list(shown)
        self.common_names = {name for name, field in shown.items() if field.style.get("common")}
        for name, field in shown.items():
            self.fields[SPEC_PREFIX + name] = spec_form_field(field, owner, kind)
        if kind.dataset_formats:
            dataset_field: forms.ModelChoiceField = self.fields["dataset"]  # type: ignore[assignment]
            dataset_field.queryset = Dataset.objects.owned_by(owner).filter(format__in=kind.dataset_formats)
            dataset_field.help_text = f"One of your datasets of format {', '.join(kind.dataset_formats)}."
        else:
            del self.fields["dataset"]
        self.fields["budget"].initial = format_credits(kind.estimate_price(self.default_spec()))
        describe_fields(self)

    def default_spec(self) -> dict[str, Any]:
        fields = self.kind.spec_serializer().fields
        return {name: f.default for name, f in fields.items() if f.default is not serializers.empty}

    def spec_fields(self) -> list[forms.BoundField]:
        return [self[SPEC_PREFIX + name] for name in self.spec_names]

    def setting_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in (*COMMON_SETTINGS, *ADVANCED_SETTINGS)]

    def common_spec_fields(self) -> list[forms.BoundField]:
        """The spec fields the post page shows first: the kind's ``common=True`` fields."""
        return [self[SPEC_PREFIX + name] for name in self.spec_names if name in self.common_names]

    def common_setting_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in COMMON_SETTINGS]

    def advanced_fields(self) -> list[forms.BoundField]:
        """Everything else, under the page's "Advanced" disclosure: the kind's other spec
        fields, then the worker settings a requester seldom changes."""
        rare = [self[SPEC_PREFIX + name] for name in self.spec_names if name not in self.common_names]
        return rare + [self[name] for name in ADVANCED_SETTINGS]

    def page_order(self) -> list[forms.BoundField]:
        """Every field in the order the post page shows them."""
        head = [self[name] for name in ("title", "dataset") if name in self.fields]
        return head + self.common_spec_fields() + self.common_setting_fields() + self.advanced_fields()

    @property
    def advanced_has_errors(self) -> bool:
        """Whether a field under "Advanced" is refused: the page then opens the section."""
        return self.is_bound and any(field.errors for field in self.advanced_fields())

    def parsed_spec(self) -> dict[str, Any] | None:
        """The spec from the fields that parsed, or None while any spec field does not."""
        data = getattr(self, "cleaned_data", {})
        names = [SPEC_PREFIX + name for name in self.spec_names]
        if any(name not in data for name in names):
            return None
        return {name: data[SPEC_PREFIX + name] for name in self.spec_names}

    def task_request(self) -> TaskRequest:
        """The service request; call after is_valid()."""
        data = self.cleaned_data
        dataset = data.get("dataset")
        return TaskRequest(
            kind=self.kind.name,
            spec=self.parsed_spec() or {},
            budget=credits_to_units(data["budget"]),
            bid=credits_to_units(data["bid"]) if data.get("bid") is not None else None,
            title=data.get("title", ""),
            dataset=dataset.pk if dataset is not None else None,
            min_reputation=data["min_reputation"],
            replication=data["replication"],
            max_attempts=data["max_attempts"],
            draft=data.get("draft", False),
        )


class StatusFilterForm(forms.Form):
    status = forms.ChoiceField(choices=[("", "All statuses"), *TaskStatus.choices], required=False)
