"""A zip archive assembled on the fly from members of another zip: a virtual zip.

A ``Recipe`` names members of one stored zip, the *upload*: for each, its name, where its
raw data starts in the upload, its sizes, CRC and compression method. ``VirtualZip`` is the
archive a recipe describes as a read-only, seekable file: ``zipfile`` writes its local
headers and central directory (fixed times and attributes), and each member's data is read
from the upload as it is stored there (a deflated member is served deflated, never
recompressed). One recipe gives the same bytes every time, so the size and sha256 taken
once (``digest``) name what is served; the recipe records them.

A recipe holds no path: whoever reads it names the upload. A folder whose shards are
recipes (``shard-00000.zip`` + ``RECIPE_SUFFIX``) is read through ``attach``, a
temporary folder that links the upload in as ``UPLOAD_NAME``. Nothing outside the
recipe's members is ever read: a range outside the upload, or an upload of another size
than the recipe was written for, is refused when the file is opened.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import json
import os
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

RECIPE_SUFFIX = ".recipe"
UPLOAD_NAME = ".upload.zip"
FORMAT = "proofwork-virtual-zip/1"
# Every member's time and attributes, so that a recipe's bytes do not depend on the upload's.
STAMP = (2023, 1, 1, 0, 0, 0)
_UNIX = 3
_FILE_MODE = 0o100644 << 16
_SERVED_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
_CHUNK = 1 << 20
# zipfile's layout of a member's local header (module constants typeshed does not declare).
_LOCAL_HEADER = struct.Struct(zipfile.structFileHeader)  # type: ignore[attr-defined]
_LOCAL_SIGNATURE: bytes = zipfile.stringFileHeader  # type: ignore[attr-defined]


class VirtualZipError(ValueError):
    """A recipe that cannot be served from this upload (its message says why)."""


@dataclass(frozen=True)
class Member:
    """One member of a virtual zip: its name, and its raw data in the upload (``offset``,
    ``compress_size`` bytes, compressed by ``method``) with its size and CRC when read."""

    name: str
    offset: int
    compress_size: int
    file_size: int
    crc: int
    method: int


@dataclass(frozen=True)
class Recipe:
    """A virtual zip: its members, in order, read from an upload of ``upload_size`` bytes;
    ``size`` and ``sha256`` are the served bytes' (0 and "" until ``digest`` took them)."""

    members: tuple[Member, ...]
    upload_size: int
    size: int = 0
    sha256: str = ""

    def to_json(self) -> bytes:
        body = {"format": FORMAT, **asdict(self), "members": [list(asdict(m).values()) for m in self.members]}
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Recipe:
        """The recipe ``to_json`` wrote; VirtualZipError for anything else."""
        try:
            body = json.loads(data)
            if body.pop("format") != FORMAT:
                raise ValueError("unknown format")
            members = tuple(Member(*row) for row in body.pop("members"))
            recipe = cls(members=members, **body)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise VirtualZipError(f"not a virtual zip recipe ({exc})") from None
        numbers = [recipe.upload_size, recipe.size] + [
            n for m in members for n in (m.offset, m.compress_size, m.file_size, m.crc, m.method)
        ]
        names = [m.name for m in members] + [recipe.sha256]
        if not all(type(n) is int and n >= 0 for n in numbers) or not all(type(n) is str for n in names):
            raise VirtualZipError("not a virtual zip recipe (a field of the wrong type)")
        return recipe


def locate(upload: IO[bytes], info: zipfile.ZipInfo, upload_size: int, *, end: int | None = None) -> Member:
    """The member ``info`` of the zip open as ``upload`` (``upload_size`` bytes), with where its
    raw data starts: past its local header, whose name and extra field may differ in length
    from the central directory's. ``end``, where the next member's local header (or the
    central directory) starts, bounds its data: members whose bytes overlap would serve the
    same upload bytes many times over. VirtualZipError for a member that cannot be served raw."""
    if info.flag_bits & 0x1:
        raise VirtualZipError(f"member {info.filename!r} is encrypted")
    if info.compress_type not in _SERVED_METHODS:
        raise VirtualZipError(f"member {info.filename!r} uses compression method {info.compress_type}")
    upload.seek(info.header_offset)
    header = upload.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
        raise VirtualZipError(f"member {info.filename!r} has no local header at offset {info.header_offset}")
    fields = _LOCAL_HEADER.unpack(header)
    offset = info.header_offset + _LOCAL_HEADER.size + fields[10] + fields[11]  # name and extra lengths
    if offset + info.compress_size > upload_size:
        raise VirtualZipError(f"member {info.filename!r} runs past the end of the archive")
    if end is not None and offset + info.compress_size > end:
        raise VirtualZipError(f"member {info.filename!r}: its bytes in the archive overlap the next member's")
    return Member(info.filename, offset, info.compress_size, info.file_size, info.CRC, info.compress_type)


# A part of a virtual zip: bytes of its own (headers), or (offset, length) of the upload.
Segment = bytes | tuple[int, int]


def _info(member: Member, header_offset: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(member.name, STAMP)
    info.compress_type = member.method
    info.compress_size, info.file_size, info.CRC = member.compress_size, member.file_size, member.crc
    info.create_system, info.external_attr = _UNIX, _FILE_MODE
    info.header_offset = header_offset
    return info


class _Tail(io.RawIOBase):
    """Where ``zipfile`` writes a central directory that starts ``start`` bytes in."""

    def __init__(self, start: int) -> None:
        self.position, self.parts = start, bytearray()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if (offset, whence) not in ((self.position, os.SEEK_SET), (0, os.SEEK_CUR)):
            raise OSError("a central directory is written in order")
        return self.position

    def write(self, data: Any) -> int:
        self.parts += data
        self.position += len(data)
        return len(data)


def layout(members: Sequence[Member]) -> list[Segment]:
    """The parts of the virtual zip of ``members``, in order: each member's local header and
    its data in the upload, then the central directory and its end records."""
    segments: list[Segment] = []
    infos = []
    position = 0
    for member in members:
        info = _info(member, position)
        header = info.FileHeader()
        segments += [header, (member.offset, member.compress_size)]
        infos.append(info)
        position += len(header) + member.compress_size
    tail = _Tail(position)
    with zipfile.ZipFile(tail, "w") as archive:
        archive.filelist.extend(infos)
    segments.append(bytes(tail.parts))
    return segments


class VirtualZip(io.RawIOBase):
    """The virtual zip ``recipe`` describes, read from the zip open as ``upload`` (which it
    closes): read-only and seekable, as ``zipfile`` and a ranged download read a file.

    Raises VirtualZipError when ``upload`` is not the recipe's (another size), when a
    member's data lies outside it, or when the bytes would differ in size from those the
    recipe was digested as."""

    def __init__(self, recipe: Recipe, upload: IO[bytes], name: str = "") -> None:
        super().__init__()
        self.name = name
        self._upload = upload
        try:
            size = upload.seek(0, os.SEEK_END)
            if size != recipe.upload_size:
                raise VirtualZipError(
                    f"the upload is {size:,} bytes; the recipe was written for {recipe.upload_size:,}"
                )
            for member in recipe.members:
                if member.offset + member.compress_size > size:
                    raise VirtualZipError(f"member {member.name!r} lies outside the upload's {size:,} bytes")
            self._segments = layout(recipe.members)
            self._starts = [0]
            for segment in self._segments:
                self._starts.append(self._starts[-1] + (len(segment) if isinstance(segment, bytes) else segment[1]))
            if recipe.size and self._starts[-1] != recipe.size:
                raise VirtualZipError(f"the recipe serves {self._starts[-1]:,} bytes, not the {recipe.size:,} digested")
        except BaseException:
            upload.close()
            raise
        self.size = self._starts[-1]
        self._position = 0

    @classmethod
    def open(cls, recipe: Path, upload: Path, name: str = "") -> VirtualZip:
        """The virtual zip of the recipe file ``recipe`` over the upload at ``upload``."""
        return cls(Recipe.from_json(Path(recipe).read_bytes()), Path(upload).open("rb"), name)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._position = base + offset
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self._position < self.size:
            index = bisect.bisect_right(self._starts, self._position) - 1
            segment, inside = self._segments[index], self._position - self._starts[index]
            if isinstance(segment, bytes):
                part = segment[inside : inside + len(view) - done]
            else:
                offset, length = segment
                self._upload.seek(offset + inside)
                part = self._upload.read(min(length - inside, len(view) - done))
                if not part:
                    raise VirtualZipError(f"the upload ends early, at byte {offset + inside:,}")
            view[done : done + len(part)] = part
            done += len(part)
            self._position += len(part)
        return done

    def close(self) -> None:
        if not self.closed:
            self._upload.close()
        super().close()


def digest(recipe: Recipe, upload: Path) -> Recipe:
    """``recipe`` with the size and sha256 of the bytes it serves from ``upload``."""
    sha = hashlib.sha256()
    with VirtualZip(replace(recipe, size=0), Path(upload).open("rb")) as served:
        while chunk := served.read(_CHUNK):
            sha.update(chunk)
        return replace(recipe, size=served.size, sha256=sha.hexdigest())


def virtual_name(path: Path) -> str | None:
    """The name a recipe file serves (``shard-00000.zip`` for ``shard-00000.zip.recipe``), or None."""
    return path.name[: -len(RECIPE_SUFFIX)] if path.name.endswith(RECIPE_SUFFIX) else None


def has_recipes(folder: Path) -> bool:
    """Whether ``folder`` holds a recipe, so that it is read through ``attach``."""
    return Path(folder).is_dir() and any(Path(folder).glob(f"*{RECIPE_SUFFIX}"))


@contextmanager
def attach(folder: Path, upload: Path) -> Iterator[Path]:
    """A temporary folder that reads as ``folder`` with its recipes' upload at ``upload``:
    ``folder``'s files copied (small: indexes and recipes) and the upload linked in as
    ``UPLOAD_NAME``, so that the upload is named where it is read and never stored beside
    the recipes. A folder without recipes is given as it is."""
    folder = Path(folder)
    if not has_recipes(folder):
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="proofwork-attached-") as tmp:
        view = Path(tmp)
        for path in folder.iterdir():
            if path.is_file() and not path.name.startswith("."):
                shutil.copyfile(path, view / path.name)
        (view / UPLOAD_NAME).symlink_to(Path(upload).resolve())
        yield view


def materialise(folder: Path, upload: Path, out: Path) -> Path:
    """Write into the new folder ``out`` the files ``folder`` serves: its plain files as they
    are and each recipe's virtual zip under its served name, byte for byte what a node
    downloads. Returns ``out``."""
    out = Path(out)
    out.mkdir(parents=True)
    for path in sorted(Path(folder).iterdir()):
        if not path.is_file() or path.name.startswith("."):
            continue
        name = virtual_name(path)
        if name is None:
            shutil.copyfile(path, out / path.name)
            continue
        with VirtualZip.open(path, upload, name) as served, (out / name).open("wb") as target:
            shutil.copyfileobj(served, target, _CHUNK)
    return out
