"""Worker identity: registration tokens, proof of key possession, suspend/resume/retire.

Every function opens its own transaction and locks the rows it changes. Errors are DRF
exceptions whose detail names the field, so the API and the pages can show them.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from datetime import timedelta
from functools import partial
from typing import Any, NamedTuple
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.exceptions import APIException, NotFound, PermissionDenied, Throttled, ValidationError

from config.events import send_event
from ledger import gas
from ledger import services as ledger
from marketplace.models import User
from protocol import encoding, keys
from protocol.bech32 import address_from_public_key
from protocol.wire import registration_message
from training.poc import spec as poc_spec
from workers.assignments import nodebroker
from workers.assignments.lifecycle import end_worker_jobs
from workers.live.dashboard import worker_changed
from workers.live.events import CloseEvent, worker_group
from workers.models import RegistrationToken, Worker

REGISTRATION_PREFIX = "pwr_"
WORKER_TOKEN_PREFIX = "pww_"  # noqa: S105 (a public prefix, not a secret)
# What an agent that lists no features (agent < 0.2.0) runs: SHAKE128 matrices.
LEGACY_FEATURES = (poc_spec.feature(poc_spec.UNNAMED_GENERATOR),)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX128 = re.compile(r"^[0-9a-f]{128}$")
log = logging.getLogger(__name__)


def hash_secret(raw: str) -> str:
    """Stored form of a random 256-bit token (no stretching needed at that entropy)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def refuse_while_held(owner_id: Any) -> None:
    """PermissionDenied while an operator holds one of the owner's workers suspended: a new
    key would otherwise get round the hold (and start again at the default reputation)."""
    held = Worker.objects.filter(owner_id=owner_id, state=Worker.State.SUSPENDED, held_by_platform=True).first()
    if held is not None:
        raise PermissionDenied(
            f"An operator suspended your worker {held.name}; no new worker can be registered until they lift it."
        )


MAX_OPEN_REGISTRATION_TOKENS = 20


def create_registration_token(owner: User) -> tuple[RegistrationToken, str]:
    """A one-time registration token for a new node; the raw token is returned once.

    Refused (PermissionDenied) while an operator holds one of the owner's workers, and
    (Throttled, 429) while the owner has ``MAX_OPEN_REGISTRATION_TOKENS`` unused ones
    that have not expired. The owner's unused tokens expired over a day ago are deleted
    here (a day in which using one still says "expired", not "unknown")."""
    refuse_while_held(owner.pk)
    now = timezone.now()
    with transaction.atomic():
        User.objects.select_for_update().filter(pk=owner.pk).first()
        unused = RegistrationToken.objects.owned_by(owner).filter(used_at__isnull=True)
        unused.filter(expires_at__lte=now - timedelta(days=1)).delete()
        if unused.filter(expires_at__gt=now).count() >= MAX_OPEN_REGISTRATION_TOKENS:
            raise Throttled(
                detail=f"You have {MAX_OPEN_REGISTRATION_TOKENS} unused registration tokens: register a node"
                " with one, or wait for them to expire (an hour after each was made)."
            )
        raw = REGISTRATION_PREFIX + secrets.token_urlsafe(32)
        token = RegistrationToken.objects.create(
            owner=owner,
            token_hash=hash_secret(raw),
            expires_at=now + timedelta(seconds=settings.WORKER_REGISTRATION_TTL),
        )
    return token, raw


def _clean_public_key(public_key: Any) -> str:
    if not isinstance(public_key, str) or not _HEX64.match(public_key.lower()):
        raise ValidationError({"public_key": ["Expected a 32-byte ed25519 public key as 64 hex characters."]})
    return public_key.lower()


def _usable_token_locked(raw: Any) -> RegistrationToken:
    """Lock and return an unused, unexpired registration token. Expects a transaction."""
    if not isinstance(raw, str) or not raw.startswith(REGISTRATION_PREFIX):
        raise ValidationError({"registration_token": ["Not a registration token."]})
    token = RegistrationToken.objects.select_for_update().filter(token_hash=hash_secret(raw)).first()
    if token is None:
        raise ValidationError({"registration_token": ["Unknown registration token."]})
    if token.used_at is not None:
        raise ValidationError({"registration_token": ["This registration token was already used."]})
    if token.expires_at <= timezone.now():
        raise ValidationError({"registration_token": ["This registration token has expired; create a new one."]})
    return token


def register_tx_template(address: str) -> dict[str, Any]:
    """The REGISTER_WORKER transaction a new node signs with its own key (no gas)."""
    return {
        "chain_id": settings.LEDGER_CHAIN_ID,
        "type": encoding.REGISTER_WORKER,
        "from": address,
        "to": address,
        "amount": 0,
        "fee": 0,
        "nonce": ledger.next_nonce(address),
        "gas_price": settings.LEDGER_GAS_PRICE,
        "gas_limit": gas.gas_limit(encoding.REGISTER_WORKER),
        "payload": {},
    }


def issue_challenge(raw_token: Any, public_key: Any) -> dict[str, Any]:
    """Give a node a fresh nonce to sign, and the REGISTER_WORKER transaction to sign."""
    public_key = _clean_public_key(public_key)
    with transaction.atomic():
        token = _usable_token_locked(raw_token)
        token.challenge = secrets.token_hex(32)
        token.save(update_fields=["challenge"])
    address = address_from_public_key(bytes.fromhex(public_key))
    return {"challenge": token.challenge, "register_tx": register_tx_template(address)}


def clean_capabilities(raw: Any) -> dict[str, Any]:
    """Keep the capability fields the scheduler uses, typed and bounded."""
    if not isinstance(raw, dict):
        raise ValidationError({"capabilities": ["Expected a JSON object."]})

    def integer(name: str, hi: int) -> int:
        value = raw.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
            raise ValidationError({"capabilities": {name: [f"Expected an integer between 0 and {hi}."]}})
        return value

    def text(name: str) -> str:
        value = raw.get(name)
        if value is None:  # absent, or null: a node without a GPU has no name for it
            return ""
        # Not ``or ""``: false, 0, [] or {} would pass as "" and hide a buggy agent.
        if not isinstance(value, str) or len(value) > 100:
            raise ValidationError({"capabilities": {name: ["Expected a string of at most 100 characters."]}})
        return value

    kinds = raw.get("kinds", [])
    if not isinstance(kinds, list) or not all(isinstance(k, str) and len(k) <= 32 for k in kinds):
        raise ValidationError({"capabilities": {"kinds": ["Expected a list of kind names."]}})
    # An agent that sends no features (agent < 0.2.0) runs LEGACY_FEATURES.
    features = raw.get("features", list(LEGACY_FEATURES))
    if (
        not isinstance(features, list)
        or len(features) > 32
        or not all(isinstance(f, str) and 0 < len(f) <= 64 for f in features)
    ):
        raise ValidationError({"capabilities": {"features": ["Expected a list of at most 32 feature names."]}})
    return {
        "cpu_cores": integer("cpu_cores", 4096),
        "ram_bytes": integer("ram_bytes", 2**50),
        "gpu_name": text("gpu_name"),
        "gpu_memory_bytes": integer("gpu_memory_bytes", 2**46),
        "cuda_version": text("cuda_version"),
        "kinds": sorted(set(kinds)),
        "features": sorted(set(features)),
        "agent_version": text("agent_version"),
    }


def update_capabilities(worker: Worker, raw: Any) -> dict[str, Any]:
    """A running node reports what it offers now (an upgraded agent lists new features).

    Validated as at registration; a bad report is a ValidationError naming the field and
    changes nothing.
    """
    caps = clean_capabilities(raw)
    Worker.objects.filter(pk=worker.pk).update(capabilities=caps)
    worker.capabilities = caps
    return caps


class NodeBrokerUnavailable(APIException):
    status_code = 503
    default_detail = "The node broker cannot be reached; nothing was registered. Try again in a minute."
    default_code = "node_broker_unavailable"


class Registration(NamedTuple):
    """What registering a node gives it: the worker, its API token, whether it is new,
    and its own broker URL with a fresh password (None without a node broker)."""

    worker: Worker
    token: str
    created: bool
    broker_url: str | None


def register_worker(
    raw_token: Any, public_key: Any, signature: Any, capabilities: Any, name: Any = "", register_tx_signature: Any = ""
) -> Registration:
    """Register the node whose key signed the token's challenge.

    Registering a key that is already the same owner's worker is idempotent: the same
    worker comes back with a fresh API token (the old one stops working) and a fresh
    broker password (the old one too). A key another account registered is refused.
    The node's broker user is provisioned last, inside the transaction: when the broker
    cannot be told, nothing is registered and the token stays unused (503).
    """
    public_key = _clean_public_key(public_key)
    if not isinstance(signature, str) or not _HEX128.match(signature.lower()):
        raise ValidationError({"signature": ["Expected a 64-byte ed25519 signature as 128 hex characters."]})
    caps = clean_capabilities(capabilities)
    label = (name if isinstance(name, str) else "").strip()[:100]
    raw_api_token = WORKER_TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        token = _usable_token_locked(raw_token)
        if not token.challenge:
            raise ValidationError({"signature": ["Ask for a challenge first."]})
        message = registration_message(token.challenge, public_key)
        if not keys.verify(bytes.fromhex(public_key), message, bytes.fromhex(signature)):
            raise ValidationError({"signature": ["The signature does not match this key and challenge."]})
        existing = Worker.objects.select_for_update().filter(public_key=public_key).first()
        if existing is not None and existing.owner_id != token.owner_id:
            raise PermissionDenied("This key is registered to another account.")
        if existing is not None and existing.state == Worker.State.RETIRED:
            raise ValidationError({"public_key": ["This key belongs to a retired worker; generate a new key."]})
        created = existing is None
        if created:
            refuse_while_held(token.owner_id)
        address = address_from_public_key(bytes.fromhex(public_key))
        if existing is None:
            worker = Worker.objects.create(
                owner_id=token.owner_id,
                name=label or f"worker-{address[4:12]}",
                address=address,
                public_key=public_key,
                token_hash=hash_secret(raw_api_token),
                capabilities=caps,
            )
        else:
            worker = existing
            worker.token_hash = hash_secret(raw_api_token)
            worker.capabilities = caps
            if label:
                worker.name = label
            worker.save(update_fields=["token_hash", "capabilities", "name"])
        token.used_at = timezone.now()
        token.worker = worker
        token.save(update_fields=["used_at", "worker"])
        if created:
            _record_registration(worker, register_tx_signature)
        broker_url = None
        if nodebroker.configured():
            may_consume = worker.state == Worker.State.ACTIVE and worker.owner.is_active
            try:
                broker_url = nodebroker.provision_node(worker.address, may_consume=may_consume)
            except nodebroker.NodeBrokerError as exc:
                log.error("registration of %s not completed: %s", worker.address, exc)
                raise NodeBrokerUnavailable() from None
    return Registration(worker, raw_api_token, created, broker_url)


def _record_registration(worker: Worker, signature_hex: Any) -> None:
    """Admit the node's own signed REGISTER_WORKER transaction (in the caller's transaction)."""
    if not isinstance(signature_hex, str) or not _HEX128.match(signature_hex.lower()):
        raise ValidationError({"register_tx_signature": ["Expected the signed REGISTER_WORKER transaction (128 hex)."]})
    body = register_tx_template(worker.address)
    tx = encoding.Tx(
        chain_id=body["chain_id"],
        type=body["type"],
        sender=body["from"],
        recipient=body["to"],
        amount=body["amount"],
        fee=body["fee"],
        nonce=body["nonce"],
        gas_price=body["gas_price"],
        gas_limit=body["gas_limit"],
        payload=body["payload"],
        public_key=bytes.fromhex(worker.public_key),
    )
    row = ledger.submit_transaction(tx, bytes.fromhex(signature_hex), reference=f"register:{worker.pk}")
    if row.status == "refused":
        raise ValidationError({"register_tx_signature": [f"The ledger refused REGISTER_WORKER: {row.reason}."]})


def authenticate_worker(raw_token: str) -> Worker | None:
    """The active worker a token belongs to, or None (suspended and retired workers, and
    those of a deactivated account, are refused)."""
    if not raw_token.startswith(WORKER_TOKEN_PREFIX):
        return None
    return Worker.objects.usable().filter(token_hash=hash_secret(raw_token)).first()


HELD_BY_PLATFORM = "The platform's operators suspended this worker; only they can resume it. Contact support."


STATE_VERBS = {Worker.State.ACTIVE: "Resumed", Worker.State.SUSPENDED: "Suspended", Worker.State.RETIRED: "Retired"}


def state_reason(target: str, operator_reason: str) -> str:
    """What the owner reads of a state change: "Suspended by an operator: <reason>" when
    the platform's operators acted, "Suspended by you." when the owner did (nothing when
    the owner resumed: an active node needs no explanation)."""
    verb = STATE_VERBS[Worker.State(target)]
    if operator_reason:
        return f"{verb} by an operator: {operator_reason}"
    return "" if target == Worker.State.ACTIVE else f"{verb} by you."


def set_worker_state(
    owner: User, worker_id: UUID, target: str, *, by_platform: bool = False, reason: str = ""
) -> Worker:
    """Suspend, resume or retire one of the owner's workers. Retiring is final.

    ``by_platform``: the platform's operators act (the admin panel), and say why in
    ``reason`` (required then); the owner reads it on the node's page (``state_reason``).
    Their suspension holds: the owner cannot resume the worker until an operator does (the
    owner may still retire it). Suspending or retiring ends the worker's live jobs at once
    and stops them on its node (``workers.assignments.lifecycle.end_worker_jobs``: free
    when an operator acts, the reported give-up's penalty when the owner does).
    """
    if by_platform and not reason.strip():
        raise ValueError("an operator's state change needs a reason")
    allowed = {
        Worker.State.ACTIVE: {Worker.State.SUSPENDED, Worker.State.RETIRED},
        Worker.State.SUSPENDED: {Worker.State.ACTIVE, Worker.State.RETIRED},
        Worker.State.RETIRED: set(),
    }
    with transaction.atomic():
        worker = Worker.objects.owned_by(owner).select_for_update().filter(pk=worker_id).first()
        if worker is None:
            raise NotFound("No such worker.")
        if target not in allowed[Worker.State(worker.state)]:
            raise ValidationError({"state": [f"A {worker.state} worker cannot become {target}."]})
        if target == Worker.State.ACTIVE and worker.held_by_platform and not by_platform:
            raise ValidationError({"state": [HELD_BY_PLATFORM]})
        worker.state = target
        worker.state_reason = state_reason(target, reason.strip() if by_platform else "")
        fields = ["state", "state_reason"]
        if by_platform and target != Worker.State.RETIRED:
            worker.held_by_platform = target == Worker.State.SUSPENDED
            fields.append("held_by_platform")
        if target == Worker.State.RETIRED:
            worker.retired_at = timezone.now()
            fields.append("retired_at")
        worker.save(update_fields=fields)
        transaction.on_commit(partial(nodebroker.sync_node_soon, worker.pk))
        transaction.on_commit(partial(worker_changed, worker.pk))
    if target != Worker.State.ACTIVE:
        # The jobs end after the state commits (each locks its task row, which comes before
        # a worker row in the lock order), and their stops reach the node before its sockets close.
        end_worker_jobs(worker, target, by_platform=by_platform)
        transaction.on_commit(partial(close_worker_sockets, worker.pk))
    return worker


def on_user_saved(sender: Any, instance: User, **kwargs: Any) -> None:
    """A deactivated account's nodes lose their sockets at once (their tokens are
    refused from the commit on, ``authenticate_worker``); their jobs expire as a silent
    worker's do and go to other workers."""
    if instance.pk is None:
        return
    if instance.is_active:
        # Reactivated: its active nodes may read their queues again (a save that cannot
        # have changed is_active, such as a login's, asks nothing of the broker).
        fields = kwargs.get("update_fields")
        if nodebroker.configured() and (fields is None or "is_active" in fields):
            for worker_id in (
                Worker.objects.owned_by(instance).filter(state=Worker.State.ACTIVE).values_list("pk", flat=True)
            ):
                transaction.on_commit(partial(nodebroker.sync_node_soon, worker_id))
        return
    for worker_id in Worker.objects.owned_by(instance).exclude(state=Worker.State.RETIRED).values_list("pk", flat=True):
        transaction.on_commit(partial(nodebroker.sync_node_soon, worker_id))
        transaction.on_commit(partial(close_worker_sockets, worker_id))


def close_worker_sockets(worker_id: UUID) -> None:
    """Tell every open ``/ws/worker/`` socket of this worker to close (best effort).

    The REST token is refused from the moment the state is committed; this makes the
    live channel follow at once instead of at the node's next heartbeat.
    """
    send_event(worker_group(worker_id), CloseEvent(type="worker.close"))
