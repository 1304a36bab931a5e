"""Admin: the ledger is read-only here. Money moves only through ledger.services, and a
hand-edited row would be exactly what verify_chain reports as tampering."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from ledger.models import Account, Block, Transaction


class ReadOnlyAdmin(admin.ModelAdmin[Any]):
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
    list_display = ["height", "hash", "timestamp", "tx_count", "gas_used"]
    search_fields = ["hash"]
    ordering = ["-height"]


@admin.register(Transaction)
class TransactionAdmin(ReadOnlyAdmin):
    list_display = ["hash", "type", "sender", "recipient", "amount", "fee", "status", "reason", "block"]
    list_filter = ["status", "type"]
    search_fields = ["hash", "sender", "recipient", "reference"]
    list_select_related = ["block"]


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ["address", "kind", "user", "available", "balance", "next_nonce"]
    list_filter = ["kind"]
    search_fields = ["address", "user__username"]
    exclude = ["encrypted_key"]
