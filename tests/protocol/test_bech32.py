"""BIP-173 test vectors and Proofwork address rules."""

from __future__ import annotations

import hashlib

import pytest

from protocol import bech32
from protocol.bech32 import AddressError

# BIP-173 "Test vectors": valid bech32 strings (checksum only, any human-readable part).
VALID = [
    "A12UEL5L",
    "a12uel5l",
    "an83characterlonghumanreadablepartthatcontainsthenumber1andtheexcludedcharactersbio1tt5tgs",
    "abcdef1qpzry9x8gf2tvdw0s3jn54khce6mua7lmqqqxw",
    "11qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqc8247j",
    "split1checkupstagehandshakeupstreamerranterredcaperred2y9e3w",
    "?1ezyfcl",
]

# BIP-173 invalid strings, with the rule each breaks.
INVALID = [
    ("\x201nwldj5", "character"),  # HRP character out of range
    ("\x7f1axkwrx", "character"),
    ("\x801eym55h", "character"),
    (
        "an84characterslonghumanreadablepartthatcontainsthenumber1andtheexcludedcharactersbio1569pvx",
        "length",
    ),
    ("pzry9x0s0muk", "separator"),
    ("1pzry9x0s0muk", "prefix"),  # empty HRP
    ("x1b4n0q5v", "character"),  # invalid data character
    ("li1dgmt3", "checksum"),  # too short checksum
    ("de1lg7wt\xff", "character"),
    ("A1G7SGD8", "checksum"),  # checksum computed with the upper-case HRP
    ("10a06t8", "prefix"),
    ("1qzzfhee", "prefix"),
]


@pytest.mark.parametrize("text", VALID)
def test_bip173_valid_strings_decode_and_reencode(text: str) -> None:
    hrp, data = bech32.bech32_decode(text)
    assert bech32.bech32_encode(hrp, data) == text.lower()


@pytest.mark.parametrize(("text", "code"), INVALID)
def test_bip173_invalid_strings_are_refused_with_a_reason(text: str, code: str) -> None:
    with pytest.raises(AddressError) as err:
        bech32.bech32_decode(text)
    assert err.value.code == code


def test_a_valid_string_with_one_flipped_character_fails_its_checksum() -> None:
    text = VALID[3]
    flipped = text[:-3] + ("q" if text[-3] != "q" else "p") + text[-2:]
    with pytest.raises(AddressError) as err:
        bech32.bech32_decode(flipped)
    assert err.value.code == "checksum"


PUBLIC_KEY = bytes.fromhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")


def test_address_is_bech32_of_the_first_20_bytes_of_sha256_of_the_key() -> None:
    address = bech32.address_from_public_key(PUBLIC_KEY)
    assert address.startswith("cpc1")
    assert bech32.decode_address(address) == hashlib.sha256(PUBLIC_KEY).digest()[:20]
    # Upper case is the same address (BIP-173 allows either case, not a mix).
    assert bech32.decode_address(address.upper()) == bech32.decode_address(address)


def test_address_errors_name_the_problem() -> None:
    address = bech32.address_from_public_key(PUBLIC_KEY)
    mixed = address[:5].upper() + address[5:]
    wrong_prefix = bech32.bech32_encode("bc", bech32.convertbits(bytes(20), 8, 5, pad=True))
    too_short = bech32.bech32_encode("cpc", bech32.convertbits(bytes(19), 8, 5, pad=True))
    bad_checksum = address[:-1] + ("q" if address[-1] != "q" else "p")
    cases = {mixed: "mixed_case", wrong_prefix: "prefix", too_short: "length", bad_checksum: "checksum"}
    for text, code in cases.items():
        with pytest.raises(AddressError) as err:
            bech32.decode_address(text)
        assert err.value.code == code, text
        assert str(err.value)
    assert not bech32.is_valid_address(bad_checksum)
    assert bech32.is_valid_address(address)
