"""Where an ISLR dataset lives: a folder, a zip archive, or a folder of zip shards, checked
before anything is read.

A sharded dataset is a folder holding ``train.csv`` (and the sign map) at its root and
``shard-00000.zip``, ``shard-00001.zip``, … beside them, each holding parquet files under
the paths train.csv names. A shard may be virtual (``training.virtualzip``): its recipe
``shard-00000.zip.recipe`` in its place, read from the upload the folder links in. A path is looked up as a plain file in the folder first, then
among the shards' members.

Paths are always resolved inside the dataset: absolute paths, ``..`` parts and archive
members that would escape the archive are refused. The archive's size is not limited here
(the platform limits uploads); what protects the node is a cap on each member's size and
its compression ratio, since a member is read whole into memory.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from training.asl.parquet import DatasetError
from training.virtualzip import RECIPE_SUFFIX, UPLOAD_NAME, VirtualZip, VirtualZipError

# A member is read whole: an ISLR sequence file is a few MB, train.csv at most 64 MiB.
DEFAULT_MAX_MEMBER_BYTES = 256 * 1024**2
# Deflate reaches ~1000:1 on constant data; parquet (already compressed) ~1–3:1, CSV ~10:1.
MAX_RATIO = 100
RATIO_FROM_BYTES = 1024**2  # smaller members are not ratio-checked: they cannot cost much
INDEX_FILE = "train.csv"
SIGN_MAP_FILE = "sign_to_prediction_index_map.json"
SHARD_NAME = re.compile(r"shard-(\d{5})\.zip")
SHARD_RECIPE = re.compile(r"shard-(\d{5})\.zip" + re.escape(RECIPE_SUFFIX))
_READABLE_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)


def safe_relative(path: str, name: str) -> str:
    """``path`` as a normalised relative POSIX path, or a DatasetError naming ``name``."""
    cleaned = path.replace("\\", "/")
    pure = PurePosixPath(cleaned)
    if not cleaned or pure.is_absolute() or (len(cleaned) > 1 and cleaned[1] == ":"):
        raise DatasetError(name, f"path {path!r} must be relative to the dataset")
    if any(part == ".." for part in pure.parts):
        raise DatasetError(name, f"path {path!r} escapes the dataset")
    return "/".join(p for p in pure.parts if p != ".")


def _open_archive(path: Path | VirtualZip, name: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    # A damaged directory raises more than BadZipFile: NotImplementedError for an unknown
    # zip version, UnicodeDecodeError (a ValueError) for a name flagged UTF-8 that is not.
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, ValueError) as exc:
        raise DatasetError(name, f"not a readable zip archive ({exc})") from None


def _open_virtual(recipe: Path, upload: Path, name: str) -> VirtualZip:
    """The virtual shard ``name`` (``training.virtualzip``) of the recipe file ``recipe``."""
    if not upload.is_file():
        raise DatasetError(name, f"is virtual and its upload ({UPLOAD_NAME}) is missing")
    try:
        return VirtualZip.open(recipe, upload, name)
    except (VirtualZipError, OSError) as exc:
        raise DatasetError(name, f"cannot be read from its upload ({exc})") from None


class Source:
    """Read access to the files of one dataset, folder, zip or sharded folder, by relative path.

    ``max_bytes`` (none by default) caps a single zip's size, for callers that hold an
    upload limit; every member is capped at ``max_member_bytes`` and ``MAX_RATIO``.
    """

    def __init__(
        self,
        location: Path,
        max_bytes: int | None = None,
        max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
        require_index: bool = True,
    ) -> None:
        self.require_index = require_index
        self.location = Path(location)
        self.max_bytes = max_bytes
        self.max_member_bytes = max_member_bytes
        self.prefix = ""
        self._zip: zipfile.ZipFile | None = None
        self._archives: list[zipfile.ZipFile] = []
        self._virtual: list[VirtualZip] = []  # zipfile leaves a file object it was given open
        # Member name (with the prefix, as looked up) → its archive and directory entry.
        self._members: dict[str, tuple[zipfile.ZipFile, zipfile.ZipInfo]] = {}
        try:
            if self.location.is_dir():
                self._find_root_in_folder()
                self._open_shards()
            elif self.location.is_file():
                self._open_zip()
            else:
                raise DatasetError(str(self.location), "no such dataset folder or zip file")
        except BaseException:
            self.close()
            raise

    @property
    def is_zip(self) -> bool:
        """Whether the dataset is a single zip archive."""
        return self._zip is not None

    @property
    def shards(self) -> list[str]:
        """The names of a sharded folder's shards, in order ([] for any other dataset)."""
        return [] if self._zip is not None else [Path(a.filename or "").name for a in self._archives]

    def _find_root_in_folder(self) -> None:
        if self.require_index and not (self.location / INDEX_FILE).is_file():
            subdirs = [p for p in self.location.iterdir() if p.is_dir() and (p / INDEX_FILE).is_file()]
            if len(subdirs) != 1:
                raise DatasetError(str(self.location / INDEX_FILE), "missing: the dataset needs a train.csv")
            self.prefix = subdirs[0].name + "/"

    def _open_shards(self) -> None:
        """Index the members of the folder's shards: each directory is read once, here."""
        root = self.location / self.prefix
        numbered = sorted(
            (int(m.group(1)), p)
            for p in root.iterdir()
            if (m := SHARD_NAME.fullmatch(p.name) or SHARD_RECIPE.fullmatch(p.name)) and p.is_file()
        )
        for expected, (number, path) in enumerate(numbered):
            if number != expected:
                raise DatasetError(
                    f"shard-{expected:05d}.zip",
                    f"missing: shards are numbered from shard-00000.zip without gaps (found {path.name})",
                )
        seen: dict[str, str] = {}
        inside = self.location.resolve()
        for number, path in numbered:
            name = f"shard-{number:05d}.zip"
            if not path.resolve().is_relative_to(inside):
                raise DatasetError(path.name, "path escapes the dataset folder")
            if path.name == name:
                archive = _open_archive(path, name)
            else:  # a recipe: the shard is assembled from the upload the folder links in
                virtual = _open_virtual(path, root / UPLOAD_NAME, name)
                self._virtual.append(virtual)
                archive = _open_archive(virtual, name)
            self._archives.append(archive)
            for member, info in self._checked_members(archive, name):
                if (first := seen.setdefault(member, name)) != name:
                    raise DatasetError(member, f"is in both {first} and {name}")
                self._members[self.prefix + member] = (archive, info)

    def _open_zip(self) -> None:
        name = self.location.name
        size = self.location.stat().st_size
        if self.max_bytes is not None and size > self.max_bytes:
            raise DatasetError(name, f"archive is {size} bytes, over the {self.max_bytes}-byte limit")
        self._zip = _open_archive(self.location, name)
        self._archives.append(self._zip)
        for member, info in self._checked_members(self._zip, name):
            self._members[member] = (self._zip, info)
        if self.require_index and INDEX_FILE not in self._members:
            roots = [m[: -len(INDEX_FILE)] for m in self._members if m.endswith("/" + INDEX_FILE) and m.count("/") == 1]
            if len(roots) != 1:
                raise DatasetError(f"{name}: {INDEX_FILE}", "missing: the archive needs a train.csv")
            self.prefix = roots[0]

    def _checked_members(self, archive: zipfile.ZipFile, name: str) -> list[tuple[str, zipfile.ZipInfo]]:
        """(normalised name, entry) of every file of ``archive``, or a DatasetError naming the
        archive and the member: a path escaping it, a member too large or expanding too much."""
        members = []
        for info in archive.infolist():
            where = f"{name}: member {info.filename!r}"
            member = safe_relative(info.filename, where)
            if info.is_dir():
                continue
            if info.file_size > self.max_member_bytes:
                raise DatasetError(
                    where, f"expands to {info.file_size} bytes, over the {self.max_member_bytes}-byte limit per file"
                )
            if info.file_size > RATIO_FROM_BYTES and info.file_size > MAX_RATIO * max(info.compress_size, 1):
                raise DatasetError(
                    where,
                    f"expands {info.file_size // max(info.compress_size, 1)}-fold, over the {MAX_RATIO}-fold"
                    " limit (a zip bomb?)",
                )
            members.append((member, info))
        return members

    def _plain(self, key: str) -> Path | None:
        """The plain file at ``key`` in a folder dataset, if there is one."""
        if self._zip is not None:
            return None
        path = self.location / key
        return path if path.is_file() else None

    def files(self, suffix: str) -> list[str]:
        """Relative paths of every file ending in ``suffix``, sorted (hidden folders skipped)."""
        names = {m[len(self.prefix) :] for m in self._members if m.startswith(self.prefix)}
        if self._zip is None:
            root = self.location / self.prefix
            names.update(p.relative_to(root).as_posix() for p in root.rglob(f"*{suffix}") if p.is_file())
        return sorted(n for n in names if n.endswith(suffix) and not any(p.startswith(".") for p in n.split("/")))

    def exists(self, relative: str) -> bool:
        """Whether the dataset holds the file at ``relative``."""
        key = self.prefix + relative
        return self._plain(key) is not None or key in self._members

    def size(self, relative: str) -> int:
        """Uncompressed size in bytes of one file."""
        key = self.prefix + relative
        plain = self._plain(key)
        if plain is not None:
            return plain.stat().st_size
        return self._members[key][1].file_size

    def read(self, relative: str) -> bytes:
        """The bytes of one file, or a DatasetError naming it: absent, or unreadable (a
        damaged, encrypted or oddly compressed archive member)."""
        key = self.prefix + relative
        plain = self._plain(key)
        if plain is None:
            found = self._members.get(key)
            if found is None:
                raise DatasetError(relative, "missing from the dataset")
            return self._read_member(*found)
        target = plain.resolve()
        if not target.is_relative_to(self.location.resolve()):
            raise DatasetError(relative, "path escapes the dataset folder")
        try:
            return target.read_bytes()
        except FileNotFoundError:
            raise DatasetError(relative, "missing from the dataset") from None
        except OSError as exc:
            raise DatasetError(relative, f"cannot be read ({exc.strerror or exc})") from None

    @staticmethod
    def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
        """One member's bytes. The directory was read when the archive was opened; the
        member's own header and data are first read here, so damage shows up here."""
        try:
            return archive.read(info)
        except NotImplementedError as exc:  # a RuntimeError, so first
            if info.compress_type in _READABLE_METHODS:  # strong encryption, patch data
                problem = f"cannot be read ({exc})"
            else:
                problem = f"uses compression method {info.compress_type}, which cannot be read (use deflate or none)"
        except RuntimeError as exc:
            # zipfile's error for an encrypted member (and for a codec this Python lacks).
            encrypted = info.flag_bits & 0x1
            problem = "is encrypted; upload an archive without a password" if encrypted else f"cannot be read ({exc})"
        except EOFError:
            problem = "is damaged in the archive (its data ends early)"
        # BadZipFile (bad CRC, bad header), zlib.error and lzma.LZMAError (corrupt data),
        # OSError (bzip2's corrupt data), ValueError (offsets pointing outside the file).
        except (zipfile.BadZipFile, zlib.error, lzma.LZMAError, OSError, ValueError) as exc:
            problem = f"is damaged in the archive ({exc})"
        raise DatasetError(info.filename, problem)

    def stamp(self, relative: str) -> str:
        """What changes when a file changes: CRC in a zip, size and mtime in a folder."""
        key = self.prefix + relative
        plain = self._plain(key)
        if plain is None:
            info = self._members[key][1]
            return f"{info.CRC:08x}:{info.file_size}"
        st = plain.stat()
        return f"{st.st_size}:{st.st_mtime_ns}"

    def fingerprint(self, files: list[str], version: str) -> str:
        """A digest of the index files and every listed file's stamp: the cache key."""
        digest = hashlib.sha256(version.encode())
        for special in (INDEX_FILE, SIGN_MAP_FILE):
            if self.exists(special):
                digest.update(self.read(special))
        for rel in files:
            digest.update(f"{rel}\0{self.stamp(rel)}\n".encode())
        return digest.hexdigest()

    def close(self) -> None:
        """Release the archive handles."""
        for archive in self._archives:
            archive.close()
        for virtual in self._virtual:
            virtual.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def default_cache_dir(location: Path) -> Path:
    """Beside the dataset, so every run on it shares one cache (overridable by the caller)."""
    base = os.environ.get("PROOFWORK_ASL_CACHE")
    if base:
        return Path(base)
    location = Path(location)
    return (location if location.is_dir() else location.parent) / ".islr_cache"
