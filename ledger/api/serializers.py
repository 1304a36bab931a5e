"""JSON shapes of the ledger API. Amounts are integers in base units (1 credit = 10^9)."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from config.serializers import StrictInput
from ledger.models import Account, Block, Transaction
from ledger.units import format_credits
from protocol import encoding
from protocol.bech32 import AddressError, decode_address


class BlockSerializer(serializers.ModelSerializer[Block]):
    class Meta:
        model = Block
        fields = [
            "height",
            "hash",
            "prev_hash",
            "timestamp",
            "chain_id",
            "proposer",
            "proposer_key",
            "tx_root",
            "compute_root",
            "state_root",
            "tx_count",
            "gas_used",
            "signature",
        ]
        read_only_fields = fields


class TransactionSerializer(serializers.ModelSerializer[Transaction]):
    block_height = serializers.IntegerField(source="block.height", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Transaction
        fields = [
            "hash",
            "chain_id",
            "type",
            "amount",
            "fee",
            "nonce",
            "gas_price",
            "gas_limit",
            "payload",
            "public_key",
            "signature",
            "status",
            "reason",
            "reason_detail",
            "block_height",
            "index_in_block",
            "created_at",
        ]
        read_only_fields = fields

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        # "from" is a Python keyword, so these two are added here rather than declared.
        fields["from"] = serializers.CharField(source="sender", read_only=True)
        fields["to"] = serializers.CharField(source="recipient", read_only=True)
        return fields


class BlockDetailSerializer(BlockSerializer):
    transactions = TransactionSerializer(
        many=True,
        read_only=True,
        source="listed_transactions",
        help_text="The first `transactions_shown`, in block order; `transactions_url` lists them all.",
    )
    transactions_shown = serializers.IntegerField(read_only=True)
    transactions_total = serializers.IntegerField(
        source="tx_count", read_only=True, help_text="Every transaction in the block."
    )
    transactions_url = serializers.HyperlinkedIdentityField(
        view_name="ledger-block-transactions",
        lookup_field="height",
        help_text="All of them, in block order, a cursor page at a time.",
    )

    class Meta(BlockSerializer.Meta):
        fields = [
            *BlockSerializer.Meta.fields,
            "transactions",
            "transactions_shown",
            "transactions_total",
            "transactions_url",
        ]
        read_only_fields = fields


class ProofSerializer(serializers.Serializer[dict[str, Any]]):
    proof = serializers.JSONField(help_text="Block header and audit paths; check it with ledger.proofs.verify_proof.")
    checks = serializers.DictField(child=serializers.BooleanField())
    verified = serializers.BooleanField()


class AccountSerializer(serializers.ModelSerializer[Account]):
    transactions = TransactionSerializer(
        many=True,
        read_only=True,
        source="recent_transactions",
        help_text="The latest ones, newest first; `transactions_url` lists them all.",
    )
    transactions_url = serializers.HyperlinkedIdentityField(
        view_name="ledger-account-transactions",
        lookup_field="address",
        help_text="The whole history, newest first, a cursor page at a time.",
    )

    class Meta:
        model = Account
        fields = [
            "address",
            "kind",
            "public_key",
            "balance",
            "nonce",
            "available",
            "next_nonce",
            "transactions",
            "transactions_url",
        ]
        read_only_fields = fields


@extend_schema_field(OpenApiTypes.STR)
class CreditsText(serializers.Field[int, int, str, Any]):
    """Base units out as a credit string ('12.5'), read-only."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(read_only=True, **kwargs)

    def to_representation(self, value: int) -> str:
        return format_credits(int(value))


class WalletSerializer(serializers.Serializer[dict[str, Any]]):
    """Amounts in base units, as the ledger signs them, and the same in credits (decimal
    strings, as the rest of the API gives them)."""

    address = serializers.CharField()
    balance = serializers.IntegerField(help_text="Spendable now (pending transactions included), in base units.")
    sealed_balance = serializers.IntegerField(help_text="As of the last sealed block, in base units.")
    escrowed = serializers.IntegerField(help_text="Locked in the escrow of your tasks, in base units.")
    balance_credits = CreditsText(source="balance", help_text="balance in credits.")
    sealed_balance_credits = CreditsText(source="sealed_balance", help_text="sealed_balance in credits.")
    owed = serializers.IntegerField(
        help_text="Debt, in base units: credits a refunded or disputed purchase could not burn because they were "
        "escrowed or spent. Credits arriving pay it first; while it is not zero you can neither open tasks nor "
        "request payouts."
    )
    escrowed_credits = CreditsText(source="escrowed", help_text="escrowed in credits.")
    owed_credits = CreditsText(source="owed", help_text="owed in credits.")
    escrow_accounts = serializers.ListField(child=serializers.CharField())
    transactions = TransactionSerializer(
        many=True, help_text="The latest ones, newest first; `transactions_url` lists them all."
    )
    transactions_url = serializers.SerializerMethodField(
        help_text="The whole history of this address, newest first, a cursor page at a time."
    )

    @extend_schema_field(OpenApiTypes.URI)
    def get_transactions_url(self, wallet: dict[str, Any]) -> str:
        return self.context["request"].build_absolute_uri(
            reverse("ledger-account-transactions", args=[wallet["address"]])
        )


def _hex(length: int) -> serializers.RegexField:
    return serializers.RegexField(
        rf"^[0-9a-f]{{{length}}}$", error_messages={"invalid": f"{length} lower-case hex characters."}
    )


class SignedIntegerField(serializers.IntegerField):
    """An integer field of a signed transaction: a JSON integer and nothing else.

    DRF's IntegerField also takes ``"1000"``, ``1000.0`` and ``1e3``; the signed bytes
    hold an integer, so the JSON a client sends must show exactly that (as
    ``protocol.encoding.tx_from_json`` reads it). A bool is not an integer here either.
    """

    default_error_messages = {
        "not_json_integer": "Expected a JSON integer (not a string, a decimal number, a boolean or null)."
    }

    def to_internal_value(self, data: Any) -> int:
        if type(data) is not int:
            self.fail("not_json_integer")
        return super().to_internal_value(data)


def _uint() -> SignedIntegerField:
    return SignedIntegerField(min_value=0, max_value=encoding.MAX_UINT)


class AddressField(serializers.CharField):
    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        try:
            decode_address(value)
        except AddressError as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value


# Users (and nodes, with their own keys) submit only transfers here. Every other type
# is sent by the platform on its own path, which checks what the ledger cannot: a paid
# invoice, an approved payout, a posted task, a verified result, a registration token.
SUBMITTABLE_TYPES = frozenset({encoding.TRANSFER})
PLATFORM_PATHS = {
    encoding.DEPOSIT: "credits enter only through a verified payment (or development minting)",
    encoding.ESCROW_LOCK: "escrow is locked by posting a task",
    encoding.ESCROW_RELEASE: "escrow is released by settlement when a result is verified or a task ends",
    encoding.FEE: "the platform fee is taken by settlement",
    encoding.REJECT_RESULT: "only the platform rejects results",
    encoding.REVERSAL: "the platform reverses refunded or disputed payments",
    encoding.PAYOUT: "payouts are requested on the wallet and approved by an admin",
    encoding.SUBMIT_RESULT: "a node submits results with /api/v1/assignments/<id>/result/",
    encoding.REGISTER_WORKER: "a node registers with /api/v1/workers/register/",
}


class SubmitTransactionSerializer(StrictInput, serializers.Serializer[dict[str, Any]]):
    """A TRANSFER its sender signed (a user's, or a node's with its own key)."""

    chain_id = serializers.CharField(max_length=64)
    type = serializers.ChoiceField(
        choices=list(encoding.TX_TYPES), help_text="Only TRANSFER; the platform sends every other type itself."
    )
    amount = _uint()
    fee = _uint()
    nonce = _uint()
    gas_price = _uint()
    gas_limit = _uint()
    payload = serializers.DictField(required=False, default=dict)
    public_key = _hex(64)
    signature = _hex(128)

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        fields = super().get_fields()
        fields["from"] = AddressField()
        fields["to"] = AddressField()
        return fields

    def validate_type(self, value: str) -> str:
        if value not in SUBMITTABLE_TYPES:
            why = PLATFORM_PATHS.get(value, "the platform sends it itself")
            raise serializers.ValidationError(f"A {value} cannot be submitted here: {why}. Only TRANSFER can.")
        return value

    def to_tx(self) -> tuple[encoding.Tx, bytes]:
        d = self.validated_data
        tx = encoding.Tx(
            chain_id=d["chain_id"],
            type=d["type"],
            sender=d["from"],
            recipient=d["to"],
            amount=d["amount"],
            fee=d["fee"],
            nonce=d["nonce"],
            gas_price=d["gas_price"],
            gas_limit=d["gas_limit"],
            payload=d["payload"],
            public_key=bytes.fromhex(d["public_key"]),
        )
        return tx, bytes.fromhex(d["signature"])
