"""Custodial private keys, encrypted at rest with Fernet (AES-128-CBC + HMAC-SHA256).

The key is settings.LEDGER_ENCRYPTION_KEY, from the environment; a database dump alone
never reveals a user's signing key.
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from protocol import keys


@lru_cache(maxsize=4)
def _fernet(key: str) -> Fernet:
    try:
        return Fernet(key.encode())
    except ValueError:
        raise ImproperlyConfigured("LEDGER_ENCRYPTION_KEY must be 32 url-safe base64-encoded bytes") from None


def encrypt_seed(seed: bytes) -> bytes:
    """Encrypt a 32-byte private seed for storage."""
    return _fernet(settings.LEDGER_ENCRYPTION_KEY).encrypt(seed)


def decrypt_seed(token: bytes) -> bytes:
    """Decrypt a stored private seed; fails loudly if the key changed or the row was altered."""
    try:
        return _fernet(settings.LEDGER_ENCRYPTION_KEY).decrypt(bytes(token))
    except InvalidToken:
        raise ImproperlyConfigured(
            "A custodial key could not be decrypted: LEDGER_ENCRYPTION_KEY changed or the row was altered"
        ) from None


def _seed_setting(name: str) -> bytes:
    raw = getattr(settings, name)
    try:
        seed = bytes.fromhex(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be 64 hex characters") from None
    if len(seed) != 32:
        raise ImproperlyConfigured(f"{name} must be 64 hex characters")
    return seed


@lru_cache(maxsize=8)
def _pair(seed: bytes) -> keys.KeyPair:
    return keys.from_seed(seed)


def treasury_keys() -> keys.KeyPair:
    """The treasury's key pair: it signs deposits (money entering the ledger)."""
    return _pair(_seed_setting("LEDGER_TREASURY_KEY"))


def validator_keys() -> keys.KeyPair:
    """The platform validator's key pair: it signs blocks and collects fees."""
    return _pair(_seed_setting("LEDGER_VALIDATOR_KEY"))
