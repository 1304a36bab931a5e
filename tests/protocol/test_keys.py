"""RFC 8032 ed25519 vectors, custodial encryption and signature malleability."""

from __future__ import annotations

from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from ledger import custody

# RFC 8032 §7.1, TEST 1–3: (secret seed, public key, message, signature).
from protocol import keys

RFC8032 = [
    (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
    (
        "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
        "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
        "af82",
        "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
    ),
]
L = 2**252 + 27742317777372353535851937790883648493  # the ed25519 group order


@pytest.mark.parametrize(("seed", "public", "message", "signature"), RFC8032)
def test_rfc8032_vectors(seed: str, public: str, message: str, signature: str) -> None:
    pair = keys.from_seed(bytes.fromhex(seed))
    msg, sig = bytes.fromhex(message), bytes.fromhex(signature)
    assert pair.public_key.hex() == public
    assert pair.sign(msg).hex() == signature
    assert keys.verify(pair.public_key, msg, sig)
    assert not keys.verify(pair.public_key, msg + b"\x00", sig)
    assert not keys.verify(pair.public_key, msg, sig[:-1] + bytes([sig[-1] ^ 1]))
    assert not keys.verify(pair.public_key, msg, sig[:63])


@pytest.mark.parametrize(("seed", "public", "message", "signature"), RFC8032)
def test_signature_with_s_plus_l_is_refused(seed: str, public: str, message: str, signature: str) -> None:
    # Adding the group order to S gives a second signature that a lax verifier accepts.
    sig = bytes.fromhex(signature)
    s = int.from_bytes(sig[32:], "little") + L
    if s >= 2**256:
        pytest.skip("S + L does not fit in 32 bytes for this vector")
    malleated = sig[:32] + s.to_bytes(32, "little")
    assert not keys.verify(bytes.fromhex(public), bytes.fromhex(message), malleated)


def test_custodial_seed_is_encrypted_at_rest_and_round_trips(settings: Any) -> None:
    settings.LEDGER_ENCRYPTION_KEY = Fernet.generate_key().decode()
    pair = keys.generate()
    token = custody.encrypt_seed(pair.seed)
    assert pair.seed not in token
    assert custody.decrypt_seed(token) == pair.seed
    settings.LEDGER_ENCRYPTION_KEY = Fernet.generate_key().decode()
    with pytest.raises(ImproperlyConfigured, match="could not be decrypted"):
        custody.decrypt_seed(token)


def test_a_malformed_encryption_key_fails_loudly(settings: Any) -> None:
    settings.LEDGER_ENCRYPTION_KEY = "not-a-key"
    with pytest.raises(ImproperlyConfigured, match="LEDGER_ENCRYPTION_KEY"):
        custody.encrypt_seed(b"\x00" * 32)
