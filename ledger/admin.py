"""Admin: the ledger is read-only here. Money moves only through ledger.services, and a
hand-edited row would be exactly what verify_chain reports as tampering.

Also the admin's way of showing amounts and long strings, for every app's admin:
``AmountsAdminMixin`` shows the base-unit fields named in ``in_credits`` as credits (the
unit the site shows), in the list and on the detail page, and the hashes and addresses
named in ``shortened`` as their first digits in the list (the whole value in the cell's
title; the detail page shows it whole), so the list's columns fit a 1,280 px screen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ledger.models import Account, Block, Transaction
from ledger.units import format_credits

# Digits a list column keeps of a hash or address: enough to tell rows apart and to search.
SHORT_LENGTH = 12


def _in_credits(name: str) -> Callable[[Any, Any], str]:
    @admin.display(description=f"{name.replace('_', ' ')} (cr.)", ordering=name)
    def show(self: Any, obj: Any) -> str:
        value = getattr(obj, name)
        return "—" if value is None else format_credits(value)

    show.__name__ = f"{name}_credits"
    return show


def _shortened(name: str) -> Callable[[Any, Any], str | SafeString]:
    @admin.display(description=name.replace("_", " "), ordering=name)
    def show(self: Any, obj: Any) -> str | SafeString:
        value = str(getattr(obj, name) or "")
        if len(value) <= SHORT_LENGTH + 1:
            return value
        return format_html('<code class="short-hash" title="{}">{}…</code>', value, value[:SHORT_LENGTH])

    show.__name__ = f"{name}_short"
    return show


class AmountsAdminMixin:
    """``in_credits``: base-unit fields shown as ``<name>_credits`` in credits (use that
    name in ``list_display``; the detail page swaps them itself). ``shortened``: fields
    shown as ``<name>_short`` in a list column, the whole value in its title."""

    in_credits: ClassVar[tuple[str, ...]] = ()
    shortened: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in cls.in_credits:
            setattr(cls, f"{name}_credits", _in_credits(name))
        for name in cls.shortened:
            setattr(cls, f"{name}_short", _shortened(name))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        return fields + [f"{name}_credits" for name in self.in_credits if f"{name}_credits" not in fields]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        swapped = {f"{name}_credits" for name in self.in_credits}
        fields = [f for f in super().get_fields(request, obj) if f not in swapped]  # type: ignore[misc]
        return [f"{f}_credits" if f in self.in_credits else f for f in fields]


class ReadOnlyAdmin(AmountsAdminMixin, admin.ModelAdmin[Any]):
    """No add, change or delete through forms. Actions that call a service declare
    ``allowed_permissions = ("manage",)``: Django checks an action's permissions only when
    it names them, and without that any staff account that may view the list could run
    it. "manage" is the model's change permission, which no form here uses."""

    def has_manage_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        return bool(request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}"))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Block)
class BlockAdmin(ReadOnlyAdmin):
    shortened = ("hash", "proposer")
    list_display = ["height", "hash_short", "timestamp", "tx_count", "gas_used"]
    search_fields = ["hash"]
    ordering = ["-height"]


@admin.register(Transaction)
class TransactionAdmin(ReadOnlyAdmin):
    in_credits = ("amount", "fee")
    shortened = ("hash", "sender", "recipient")
    list_display = [
        "hash_short",
        "type",
        "sender_short",
        "recipient_short",
        "amount_credits",
        "fee_credits",
        "status",
        "reason",
        "block",
    ]
    list_filter = ["status", "type"]
    search_fields = ["hash", "sender", "recipient", "reference"]
    list_select_related = ["block"]


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    in_credits = ("balance", "available", "owed")
    shortened = ("address",)
    list_display = [
        "address_short",
        "kind",
        "user",
        "available_credits",
        "balance_credits",
        "owed_credits",
        "next_nonce",
    ]
    list_filter = ["kind"]
    search_fields = ["address", "user__username"]
    exclude = ["encrypted_key"]
