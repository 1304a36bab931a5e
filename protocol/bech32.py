"""BIP-173 bech32 and Proofwork addresses.

An address is the bech32 encoding, with human-readable part ``cpc``, of the first 20
bytes of sha256(ed25519 public key). Pure Python with no Django import, so a provider
node can compute its own address.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

HRP = "cpc"
ADDRESS_BYTES = 20
CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_CHARSET_INDEX = {c: i for i, c in enumerate(CHARSET)}
_GENERATOR = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)
MAX_LENGTH = 90


class AddressError(ValueError):
    """An address or bech32 string is malformed; ``code`` names the reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _polymod(values: list[int]) -> int:
    chk = 1
    for value in values:
        top = chk >> 25
        chk = (chk & 0x1FFFFFF) << 5 ^ value
        for i in range(5):
            chk ^= _GENERATOR[i] if ((top >> i) & 1) else 0
    return chk


def _hrp_expand(hrp: str) -> list[int]:
    return [ord(c) >> 5 for c in hrp] + [0] + [ord(c) & 31 for c in hrp]


def _create_checksum(hrp: str, data: list[int]) -> list[int]:
    polymod = _polymod(_hrp_expand(hrp) + data + [0] * 6) ^ 1
    return [(polymod >> 5 * (5 - i)) & 31 for i in range(6)]


def bech32_encode(hrp: str, data: list[int]) -> str:
    """Encode 5-bit groups under ``hrp`` (lower case)."""
    combined = data + _create_checksum(hrp, data)
    return hrp + "1" + "".join(CHARSET[d] for d in combined)


def bech32_decode(text: str) -> tuple[str, list[int]]:
    """Decode and check a bech32 string; return (hrp, 5-bit data without checksum).

    Raises AddressError with a specific code for each BIP-173 rule broken.
    """
    if not isinstance(text, str):
        raise AddressError("type", "An address must be a string.")
    if any(ord(c) < 33 or ord(c) > 126 for c in text):
        raise AddressError("character", "The address contains a character outside printable ASCII.")
    if text.lower() != text and text.upper() != text:
        raise AddressError(
            "mixed_case", "The address mixes upper and lower case; write it all in lower case (or all in upper)."
        )
    if len(text) > MAX_LENGTH:
        raise AddressError("length", f"A bech32 string is at most {MAX_LENGTH} characters.")
    text = text.lower()
    pos = text.rfind("1")
    if pos < 0:
        raise AddressError("separator", "The address has no '1' separator.")
    if pos == 0:
        raise AddressError("prefix", "The address has an empty human-readable prefix.")
    if pos + 7 > len(text):
        raise AddressError("checksum", "The checksum is too short.")
    hrp, rest = text[:pos], text[pos + 1 :]
    try:
        data = [_CHARSET_INDEX[c] for c in rest]
    except KeyError as exc:
        raise AddressError("character", f"{exc.args[0]!r} is not a bech32 data character.") from None
    if _polymod(_hrp_expand(hrp) + data) != 1:
        raise AddressError("checksum", "The address checksum is wrong (a typo?).")
    return hrp, data[:-6]


def convertbits(data: bytes | list[int], frombits: int, tobits: int, *, pad: bool) -> list[int]:
    """Regroup bits (BIP-173 reference), refusing non-zero or overlong padding."""
    acc = bits = 0
    out: list[int] = []
    maxv = (1 << tobits) - 1
    for value in data:
        if value < 0 or value >> frombits:
            raise AddressError("character", "Value out of range.")
        acc = (acc << frombits) | value
        bits += frombits
        while bits >= tobits:
            bits -= tobits
            out.append((acc >> bits) & maxv)
    if pad:
        if bits:
            out.append((acc << (tobits - bits)) & maxv)
    elif bits >= frombits or ((acc << (tobits - bits)) & maxv):
        raise AddressError("padding", "The address has invalid padding.")
    return out


@lru_cache(maxsize=65_536)
def address_from_public_key(public_key: bytes) -> str:
    """The ``cpc1…`` address of a 32-byte ed25519 public key."""
    if len(public_key) != 32:
        raise AddressError("public_key", "An ed25519 public key is 32 bytes.")
    digest = hashlib.sha256(public_key).digest()[:ADDRESS_BYTES]
    return bech32_encode(HRP, convertbits(digest, 8, 5, pad=True))


@lru_cache(maxsize=65_536)
def decode_address(address: str) -> bytes:
    """Validate a ``cpc1…`` address and return its 20-byte payload (results are cached:
    the same few thousand addresses recur in every block)."""
    hrp, data = bech32_decode(address)
    if hrp != HRP:
        raise AddressError("prefix", f"The address must start with '{HRP}1', not '{hrp}1'.")
    payload = bytes(convertbits(data, 5, 8, pad=False))
    if len(payload) != ADDRESS_BYTES:
        raise AddressError("length", f"An address carries {ADDRESS_BYTES} bytes, this one {len(payload)}.")
    return payload


def normalize_address(address: str) -> str:
    """Validate and return the canonical lower-case form."""
    decode_address(address)
    return address.lower()


def is_valid_address(address: str) -> bool:
    try:
        decode_address(address)
    except AddressError:
        return False
    return True
