"""Zip archives damaged the ways an upload can be, built in memory: ``zipfile`` writes a
sound archive, then one header field or a few data bytes of one member are patched.

Each damage takes the archive's bytes and a member's name and returns the damaged bytes;
``DAMAGES`` names them, with the compression each needs and the words its refusal holds.
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Callable

LOCAL, CENTRAL = b"PK\x03\x04", b"PK\x01\x02"
INDEX_HEADER = b"path,participant_id,sequence_id,sign\n"


def archive(files: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A sound zip of ``files``, every member compressed with ``compression``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as out:
        for name, data in files.items():
            out.writestr(name, data)
    return buffer.getvalue()


def _headers(data: bytes, member: str) -> tuple[int, int]:
    """Offsets of ``member``'s local header and of its central directory entry."""
    found: list[int] = []
    for signature, name_length_at, name_at in ((LOCAL, 26, 30), (CENTRAL, 28, 46)):
        at = data.find(signature)
        while at >= 0:
            (length,) = struct.unpack_from("<H", data, at + name_length_at)
            if data[at + name_at : at + name_at + length] == member.encode():
                found.append(at)
                break
            at = data.find(signature, at + 4)
        else:
            raise AssertionError(f"no {signature!r} header for {member}")
    return found[0], found[1]


def _data_span(data: bytes, member: str) -> tuple[int, int]:
    """Where ``member``'s stored (compressed) bytes lie."""
    local, central = _headers(data, member)
    name_length, extra_length = struct.unpack_from("<HH", data, local + 26)
    (size,) = struct.unpack_from("<I", data, central + 20)
    start = local + 30 + name_length + extra_length
    return start, start + size


def bad_crc(data: bytes, member: str) -> bytes:
    """The recorded CRC-32 no longer matches the data (zipfile: BadZipFile)."""
    out = bytearray(data)
    local, central = _headers(data, member)
    out[local + 14] ^= 0xFF
    out[central + 16] ^= 0xFF
    return bytes(out)


def encrypted(data: bytes, member: str) -> bytes:
    """The encryption flag set in both headers (zipfile: RuntimeError, password required)."""
    out = bytearray(data)
    local, central = _headers(data, member)
    out[local + 6] |= 0x01
    out[central + 8] |= 0x01
    return bytes(out)


def method_99(data: bytes, member: str) -> bytes:
    """Compression method 99, WinZip's AES (zipfile: NotImplementedError)."""
    out = bytearray(data)
    local, central = _headers(data, member)
    struct.pack_into("<H", out, local + 8, 99)
    struct.pack_into("<H", out, central + 10, 99)
    return bytes(out)


def corrupt_deflate(data: bytes, member: str) -> bytes:
    """The deflate stream overwritten with bytes that are no stream (zipfile: zlib.error)."""
    out = bytearray(data)
    start, end = _data_span(data, member)
    out[start:end] = b"\xff" * (end - start)
    return bytes(out)


def past_the_end(data: bytes, member: str) -> bytes:
    """The central directory records more data than the file holds after the member's
    header, so reading runs off the end of the file (zipfile: EOFError)."""
    out = bytearray(data)
    _, central = _headers(data, member)
    struct.pack_into("<II", out, central + 20, len(data), len(data))
    return bytes(out)


Damage = Callable[[bytes, str], bytes]
STORED, DEFLATED = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED
# name: (damage, how the archive is compressed for it to bite, words of the refusal)
DAMAGES: dict[str, tuple[Damage, int, str]] = {
    "bad CRC": (bad_crc, DEFLATED, "is damaged in the archive (Bad CRC-32"),
    "encrypted": (encrypted, DEFLATED, "is encrypted; upload an archive without a password"),
    "compression method 99": (method_99, DEFLATED, "uses compression method 99, which cannot be read"),
    "corrupt deflate data": (corrupt_deflate, DEFLATED, "is damaged in the archive (Error -3 while decompressing"),
    "data past the end of the file": (past_the_end, STORED, "is damaged in the archive (its data ends early)"),
}


def damaged(files: dict[str, bytes], member: str, damage: str) -> bytes:
    """A zip of ``files`` whose ``member`` has the named damage."""
    patch, compression, _ = DAMAGES[damage]
    return patch(archive(files, compression), member)


def words(damage: str) -> str:
    """What the refusal of the named damage says after the member's name."""
    return DAMAGES[damage][2]
