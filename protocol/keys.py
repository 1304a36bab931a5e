"""ed25519 keys, signatures and addresses through ``cryptography``.

Pure: no Django import, so the provider-side agent can sign with the same code the
platform verifies with. Keys travel as raw bytes (32-byte seed, 32-byte public key).
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.bech32 import address_from_public_key

_RAW = serialization.Encoding.Raw
_RAW_PRIV = serialization.PrivateFormat.Raw
_RAW_PUB = serialization.PublicFormat.Raw


@dataclass(frozen=True)
class KeyPair:
    """An ed25519 key pair with its address. ``seed`` is the 32-byte private key."""

    seed: bytes
    public_key: bytes
    address: str

    def sign(self, message: bytes) -> bytes:
        return sign(self.seed, message)


def generate() -> KeyPair:
    """A fresh random key pair."""
    return from_seed(Ed25519PrivateKey.generate().private_bytes(_RAW, _RAW_PRIV, serialization.NoEncryption()))


def from_seed(seed: bytes) -> KeyPair:
    """Rebuild a key pair from its 32-byte private seed."""
    if len(seed) != 32:
        raise ValueError("an ed25519 private key is 32 bytes")
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(_RAW, _RAW_PUB)
    return KeyPair(seed=seed, public_key=public, address=address_from_public_key(public))


def sign(seed: bytes, message: bytes) -> bytes:
    """Sign ``message`` with the private seed; 64-byte RFC 8032 signature."""
    return Ed25519PrivateKey.from_private_bytes(seed).sign(message)


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True only for a valid signature by ``public_key`` over exactly ``message``.

    OpenSSL rejects non-canonical S (S ≥ L), so a signature cannot be malleated into a
    second valid one.
    """
    if len(public_key) != 32 or len(signature) != 64:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
