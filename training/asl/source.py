"""Where an ISLR dataset lives: a folder or a zip archive, checked before anything is read.

Paths are always resolved inside the dataset: absolute paths, ``..`` parts and archive
members that would escape the archive are refused, as are archives over the size limits.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from training.asl.parquet import DatasetError

DEFAULT_MAX_BYTES = 512 * 1024**2
DEFAULT_MAX_UNCOMPRESSED_BYTES = 8 * 1024**3
INDEX_FILE = "train.csv"
SIGN_MAP_FILE = "sign_to_prediction_index_map.json"
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


class Source:
    """Read access to the files of one dataset, folder or zip, by relative path."""

    def __init__(
        self,
        location: Path,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
        require_index: bool = True,
    ) -> None:
        self.require_index = require_index
        self.location = Path(location)
        self.max_bytes = max_bytes
        self.max_uncompressed_bytes = max_uncompressed_bytes
        self.prefix = ""
        self._zip: zipfile.ZipFile | None = None
        self._members: dict[str, zipfile.ZipInfo] = {}
        if self.location.is_dir():
            self._find_root_in_folder()
        elif self.location.is_file():
            self._open_zip()
        else:
            raise DatasetError(str(self.location), "no such dataset folder or zip file")

    @property
    def is_zip(self) -> bool:
        """Whether the dataset is a zip archive."""
        return self._zip is not None

    def _find_root_in_folder(self) -> None:
        if self.require_index and not (self.location / INDEX_FILE).is_file():
            subdirs = [p for p in self.location.iterdir() if p.is_dir() and (p / INDEX_FILE).is_file()]
            if len(subdirs) != 1:
                raise DatasetError(str(self.location / INDEX_FILE), "missing: the dataset needs a train.csv")
            self.prefix = subdirs[0].name + "/"

    def _open_zip(self) -> None:
        name = self.location.name
        size = self.location.stat().st_size
        if size > self.max_bytes:
            raise DatasetError(name, f"archive is {size} bytes, over the {self.max_bytes}-byte limit")
        try:
            self._zip = zipfile.ZipFile(self.location)
        # A damaged directory raises more than BadZipFile: NotImplementedError for an unknown
        # zip version, UnicodeDecodeError (a ValueError) for a name flagged UTF-8 that is not.
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, ValueError) as exc:
            raise DatasetError(name, f"not a readable zip archive ({exc})") from None
        total = 0
        for info in self._zip.infolist():
            member = safe_relative(info.filename, f"{name}: member {info.filename!r}")
            if info.is_dir():
                continue
            total += info.file_size
            self._members[member] = info
        if total > self.max_uncompressed_bytes:
            raise DatasetError(
                name, f"archive expands to {total} bytes, over the {self.max_uncompressed_bytes}-byte limit"
            )
        if self.require_index and INDEX_FILE not in self._members:
            roots = [m[: -len(INDEX_FILE)] for m in self._members if m.endswith("/" + INDEX_FILE) and m.count("/") == 1]
            if len(roots) != 1:
                raise DatasetError(f"{name}: {INDEX_FILE}", "missing: the archive needs a train.csv")
            self.prefix = roots[0]

    def files(self, suffix: str) -> list[str]:
        """Relative paths of every file ending in ``suffix``, sorted (hidden folders skipped)."""
        if self._zip is not None:
            names = [m[len(self.prefix) :] for m in self._members if m.startswith(self.prefix)]
        else:
            root = self.location / self.prefix
            names = [p.relative_to(root).as_posix() for p in root.rglob(f"*{suffix}") if p.is_file()]
        return sorted(n for n in names if n.endswith(suffix) and not any(p.startswith(".") for p in n.split("/")))

    def exists(self, relative: str) -> bool:
        """Whether the dataset holds the file at ``relative``."""
        key = self.prefix + relative
        if self._zip is not None:
            return key in self._members
        return (self.location / key).is_file()

    def size(self, relative: str) -> int:
        """Uncompressed size in bytes of one file."""
        key = self.prefix + relative
        if self._zip is not None:
            return self._members[key].file_size
        return (self.location / key).stat().st_size

    def read(self, relative: str) -> bytes:
        """The bytes of one file, or a DatasetError naming it: absent, or unreadable (a
        damaged, encrypted or oddly compressed archive member)."""
        key = self.prefix + relative
        if self._zip is not None:
            info = self._members.get(key)
            if info is None:
                raise DatasetError(relative, "missing from the dataset")
            return self._read_member(self._zip, info)
        target = (self.location / key).resolve()
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
        if self._zip is not None:
            info = self._members[key]
            return f"{info.CRC:08x}:{info.file_size}"
        st = (self.location / key).stat()
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
        """Release the archive handle."""
        if self._zip is not None:
            self._zip.close()

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
