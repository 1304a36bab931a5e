"""C's commitment: the RFC 6962 Merkle root over its rows, the artifact, and row proofs.

Leaf encoding (version 1): one leaf per row of every product, in order pair 0 row 0,
pair 0 row 1, …, pair count−1 row n−1 (leaf index = pair·n + row), with leaf data

    u32le(pair) ‖ u32le(row) ‖ the row's n entries as little-endian int32

so a leaf names its own place and an audit path proves one row of one product. The tree
over all count·n leaves is the ledger's RFC 6962 tree (``protocol.merkle``); its root, as
64 lowercase hex digits, is the task's result_hash. With count = 1 it is simply the tree
over C's n rows.

The artifact is a safetensors file holding int32 tensors ``c0`` … ``c{count−1}``. It is
written tensor by tensor so a many-pair product never has to sit in memory whole, and it
is only ever read back with safetensors (never unpickled).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import tempfile
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
from safetensors import safe_open

from protocol import merkle
from training.poc import kernels, pool

ARTIFACT_NAME = "product.safetensors"
FORMAT = "proofwork-poc-v1"


class ArtifactProblem(ValueError):
    """The artifact cannot be read or has the wrong layout; ``code`` says which check failed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def tensor_name(pair: int) -> str:
    """Name of product ``pair`` inside the artifact."""
    return f"c{pair}"


def leaf_data(pair: int, row: int, values: npt.NDArray[np.integer[Any]]) -> bytes:
    """The leaf bytes of one row (encoding in the module docstring)."""
    return struct.pack("<II", pair, row) + np.ascontiguousarray(values, dtype="<i4").tobytes()


def row_leaf_hashes(pair: int, c: npt.NDArray[np.int32]) -> list[bytes]:
    """Leaf hashes of every row of product ``pair``, in row order (``kernels.leaf_hashes``)."""
    return [row.tobytes() for row in leaf_hash_array(pair, c)]


def leaf_hash_array(pair: int, c: npt.NDArray[np.int32]) -> kernels.Leaves:
    """Leaf hashes of every row of product ``pair`` as an n × 32 array, blocks of rows on the pool."""
    pieces = pool.workers() if kernels.ENABLED else 1  # hashlib's per-row digests hold the GIL
    parts = pool.parallel_map(
        lambda span: kernels.leaf_hashes(pair, c[span[0] : span[1]], span[0]), pool.chunks(c.shape[0], pieces)
    )
    return np.concatenate(parts) if parts else np.empty((0, 32), dtype=np.uint8)


def result_hash(leaf_hashes: Sequence[bytes] | kernels.Leaves) -> str:
    """The result_hash: hex Merkle root over all rows' leaf hashes (a list, or an m × 32 array)."""
    if isinstance(leaf_hashes, np.ndarray):
        return kernels.merkle_root(leaf_hashes).hex()
    return merkle.root_from_leaf_hashes(leaf_hashes).hex()


class ArtifactWriter:
    """Streams ``count`` n×n int32 products into one safetensors file, atomically.

    The header is fixed up front (every tensor has the same shape), so each product can
    be written as soon as it exists and dropped. The file appears under its final name
    only when all ``count`` products were written.
    """

    def __init__(self, path: Path, n: int, count: int, metadata: Mapping[str, str]) -> None:
        self.path = Path(path)
        self.n, self.count = n, count
        self._written = 0
        size = n * n * 4
        header: dict[str, Any] = {
            tensor_name(p): {"dtype": "I32", "shape": [n, n], "data_offsets": [p * size, (p + 1) * size]}
            for p in range(count)
        }
        header["__metadata__"] = {"format": FORMAT, **metadata}
        encoded = json.dumps(header, separators=(",", ":")).encode()
        # safetensors aligns the data section to 8 bytes by padding the header with spaces.
        encoded += b" " * (-len(encoded) % 8)
        self._header = struct.pack("<Q", len(encoded)) + encoded
        self._tmp: Path | None = None
        self._fh: Any = None

    def __enter__(self) -> ArtifactWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        self._tmp = Path(tmp)
        self._fh = os.fdopen(fd, "wb")
        self._fh.write(self._header)
        return self

    def write(self, c: npt.NDArray[np.int32]) -> None:
        """Append the next product (pair order)."""
        if c.shape != (self.n, self.n):
            raise ValueError(f"product {self._written} has shape {c.shape}, expected {(self.n, self.n)}")
        if self._written >= self.count:
            raise ValueError(f"all {self.count} products were already written")
        self._fh.write(np.ascontiguousarray(c, dtype="<i4").data)
        self._written += 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._tmp is not None
        self._fh.close()
        if exc_type is None and self._written != self.count:
            self._tmp.unlink(missing_ok=True)
            raise ValueError(f"only {self._written} of {self.count} products were written")
        if exc_type is not None:
            self._tmp.unlink(missing_ok=True)
            return
        os.replace(self._tmp, self.path)


def iter_products(path: Path, n: int, count: int) -> Generator[npt.NDArray[np.int32], None, None]:
    """Yield product 0 … count−1 from an artifact after checking its whole layout.

    Raises ArtifactProblem (``unreadable``, ``tensors``, ``dtype`` or ``shape``) before
    yielding anything when the file does not hold exactly ``count`` n×n int32 tensors.
    Only the header is trusted to describe the file; safetensors itself rejects headers
    whose offsets do not match the file's size. Each product is a read-only view of the
    file mapped into memory (the platform never changes an artifact once it is closed),
    so reading one costs no copy.
    """
    expected = {tensor_name(p) for p in range(count)}
    try:
        handle = safe_open(str(path), framework="numpy")
    except FileNotFoundError:
        raise ArtifactProblem("unreadable", f"the artifact {Path(path).name} is missing.") from None
    except Exception as exc:  # safetensors raises several types on a malformed header
        raise ArtifactProblem("unreadable", f"the artifact is not a valid safetensors file ({exc}).") from None
    with handle as f:
        names = set(f.keys())
        if names != expected:
            missing = sorted(expected - names)
            extra = sorted(names - expected)
            raise ArtifactProblem(
                "tensors", f"the artifact must hold exactly {sorted(expected)}; missing {missing}, unexpected {extra}."
            )
        for name in sorted(expected, key=lambda s: int(s[1:])):
            piece = f.get_slice(name)
            if piece.get_dtype() != "I32":
                raise ArtifactProblem("dtype", f"{name} has dtype {piece.get_dtype()}, expected I32 (int32).")
            if list(piece.get_shape()) != [n, n]:
                raise ArtifactProblem("shape", f"{name} has shape {list(piece.get_shape())}, expected [{n}, {n}].")
    with open(path, "rb") as fh:
        starts = _data_offsets(fh, count, n * n * 4)
        for p in range(count):
            yield _map_product(fh, starts[p], n)


def _data_offsets(fh: Any, count: int, size: int) -> list[int]:
    """Where each product's bytes start in the file, from the header safetensors has checked."""
    try:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
        offsets = [header[tensor_name(p)]["data_offsets"] for p in range(count)]
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise ArtifactProblem("unreadable", f"the artifact's header cannot be read ({exc}).") from None
    if any(type(b) is not int or type(e) is not int or e - b != size for b, e in offsets):
        raise ArtifactProblem("unreadable", "the artifact's header gives a tensor the wrong length.")
    return [8 + length + b for b, _ in offsets]


def _map_product(fh: Any, start: int, n: int) -> npt.NDArray[np.int32]:
    aligned = start - start % mmap.ALLOCATIONGRANULARITY
    try:
        mapped = mmap.mmap(
            fh.fileno(),
            start - aligned + n * n * 4,
            flags=mmap.MAP_SHARED,  # faulted in as the pool's threads read it (MAP_POPULATE measured slower)
            prot=mmap.PROT_READ,
            offset=aligned,
        )
    except (OSError, ValueError) as exc:
        raise ArtifactProblem("unreadable", f"the artifact cannot be read ({exc}).") from None
    return np.frombuffer(mapped, dtype="<i4", count=n * n, offset=start - aligned).reshape(n, n)


def artifact_shape(path: Path) -> tuple[int, int]:
    """(n, count) as the artifact's header declares them; ArtifactProblem when it is not ours."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            names = list(f.keys())
            shapes = {name: list(f.get_slice(name).get_shape()) for name in names}
    except FileNotFoundError:
        raise ArtifactProblem("unreadable", f"the artifact {Path(path).name} is missing.") from None
    except Exception as exc:
        raise ArtifactProblem("unreadable", f"the artifact is not a valid safetensors file ({exc}).") from None
    count = len(names)
    if count == 0 or set(names) != {tensor_name(p) for p in range(count)}:
        raise ArtifactProblem("tensors", f"the artifact's tensors {sorted(names)} are not c0 … c{count - 1}.")
    n = shapes["c0"][0] if len(shapes["c0"]) == 2 else -1
    if n <= 0 or any(s != [n, n] for s in shapes.values()):
        raise ArtifactProblem("shape", "the artifact's tensors are not all n×n.")
    return n, count


@dataclass(frozen=True)
class RowProof:
    """One row of one product with its RFC 6962 audit path to the result_hash."""

    pair: int
    row: int
    n: int
    count: int
    values: list[int]
    path: list[str]

    @property
    def leaf_index(self) -> int:
        """The row's position among all count·n leaves."""
        return self.pair * self.n + self.row

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (hex path)."""
        return {
            "pair": self.pair,
            "row": self.row,
            "n": self.n,
            "count": self.count,
            "values": list(self.values),
            "path": list(self.path),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RowProof:
        """Parse ``to_json``'s form; ValueError naming the field when it is malformed."""
        ints = {}
        for name in ("pair", "row", "n", "count"):
            value = data.get(name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name}: must be a non-negative integer.")
            ints[name] = value
        values = data.get("values")
        if not isinstance(values, list) or any(type(v) is not int or not -(2**31) <= v < 2**31 for v in values):
            raise ValueError("values: must be a list of int32 integers.")
        path = data.get("path")
        if not isinstance(path, list) or any(not isinstance(h, str) or len(h) != 64 for h in path):
            raise ValueError("path: must be a list of 64-hex-digit hashes.")
        return cls(values=values, path=path, **ints)


def prove_row(artifact_path: Path, pair: int, row: int) -> RowProof:
    """Open row ``row`` of product ``pair``: its values and audit path.

    Hashes every row of the artifact (the path needs all sibling subtrees). Raises
    ArtifactProblem when the artifact is unusable and IndexError for a row outside it.
    """
    n, count = artifact_shape(artifact_path)
    if not (0 <= pair < count and 0 <= row < n):
        raise IndexError(f"row {row} of product {pair} is outside {count} product(s) of {n}×{n}")
    hashes: list[bytes] = []
    values: list[int] = []
    for p, c in enumerate(iter_products(artifact_path, n, count)):
        hashes.extend(row_leaf_hashes(p, c))
        if p == pair:
            values = [int(v) for v in c[row]]
    path = merkle.audit_path(hashes, pair * n + row)
    return RowProof(pair=pair, row=row, n=n, count=count, values=values, path=[h.hex() for h in path])


def check_row(proof: RowProof, result_hash_hex: str, n: int | None = None, count: int | None = None) -> bool:
    """True when ``proof``'s row is the committed row at its place under ``result_hash_hex``.

    Pass the task's ``n`` and ``count`` so that a proof cannot pick its own tree size.
    """
    if (n is not None and proof.n != n) or (count is not None and proof.count != count):
        return False
    try:
        expected = bytes.fromhex(result_hash_hex)
        path = [bytes.fromhex(h) for h in proof.path]
    except (ValueError, TypeError):
        return False
    if len(expected) != 32 or len(proof.values) != proof.n or not (0 <= proof.row < proof.n):
        return False
    if not 0 <= proof.pair < proof.count:
        return False
    # Leaves hold int32 entries: anything else would wrap (2^32 + v hashes as v) or overflow.
    if not all(type(v) is int and -(2**31) <= v < 2**31 for v in proof.values):
        return False
    leaf = merkle.leaf_hash(leaf_data(proof.pair, proof.row, np.asarray(proof.values, dtype=np.int64)))
    return merkle.verify_inclusion(leaf, proof.leaf_index, proof.n * proof.count, path, expected)
