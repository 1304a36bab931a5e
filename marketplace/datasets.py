"""Dataset file checks: size limits, format sniffing by content, hashing.

Files are only ever read as bytes here; nothing is executed or unpickled.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ValidationError

SNIFF_BYTES = 64 * 1024


def sniff_format(head: bytes, size: int) -> str:
    """The dataset format implied by a file's first bytes, or ValidationError."""
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith(b"PAR1"):
        return "parquet"
    if len(head) >= 10:
        (header_len,) = struct.unpack("<Q", head[:8])
        if 2 <= header_len <= size - 8 and head[8:9] == b"{":
            return "safetensors"
    if b"\x00" not in head:
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError as exc:
            # A multi-byte character cut at the sniff boundary is still text.
            text = "" if exc.start < len(head) - 4 else head[: exc.start].decode("utf-8")
        stripped = text.lstrip()
        if stripped:
            if stripped[0] in "{[":
                if size <= SNIFF_BYTES:
                    try:
                        json.loads(text)
                    except ValueError:
                        raise ValidationError({"file": ["The file looks like JSON but does not parse."]}) from None
                    except RecursionError:  # ``[[[[…``: json raises this, not ValueError
                        raise ValidationError(
                            {"file": ["The file looks like JSON but is nested too deeply."]}
                        ) from None
                return "json"
            first_line = stripped.split("\n", 1)[0]
            return "csv" if "," in first_line else "text"
    raise ValidationError(
        {"file": ["Unsupported file type: upload .npy, .safetensors, .zip, .parquet, .csv, .json or text."]}
    )


def check_size(size: int, field: str = "file") -> None:
    """ValidationError naming ``field`` unless a dataset of ``size`` bytes is allowed.

    A single upload checks the file it got; an upload in parts checks the size it declares
    before any byte arrives, with the same words."""
    limit = settings.DATASET_MAX_BYTES
    if size <= 0:
        raise ValidationError({field: ["The file is empty."]})
    if size > limit:
        raise ValidationError({field: [f"The file is {size} bytes; the limit is {limit} bytes."]})


def inspect_upload(fileobj: IO[bytes], size: int) -> tuple[str, str]:
    """Check an upload's size, sniff its format and hash it. Returns (format, sha256)."""
    check_size(size)
    fileobj.seek(0)
    head = fileobj.read(SNIFF_BYTES)
    fmt = sniff_format(head, size)
    digest = hashlib.sha256(head)
    for chunk in iter(lambda: fileobj.read(1024 * 1024), b""):
        digest.update(chunk)
    fileobj.seek(0)
    return fmt, digest.hexdigest()


def clean_name(filename: str | None) -> str:
    """A display name from a client filename: no directories, bounded length."""
    base = os.path.basename((filename or "").replace("\\", "/")).strip()
    return (base or "dataset")[:200]


_FLOAT_TENSOR_TYPES = {"F16": 2, "F32": 4, "F64": 8}  # bytes per value


def embeddings_shape(fileobj: IO[bytes], fmt: str) -> tuple[list[int], str]:
    """(shape, dtype) of the embeddings in an .npy or .safetensors file, from its header only.

    The tensor is ``embeddings``, or a file's only tensor. Nothing is unpickled: the npy
    header is a literal, the safetensors header JSON. ValueError names what is wrong.
    """
    fileobj.seek(0)
    if fmt == "npy":
        import numpy as np

        try:
            version = np.lib.format.read_magic(fileobj)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fileobj)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(fileobj)
        except (ValueError, OSError, SyntaxError) as exc:
            raise ValueError(f"the .npy header cannot be read ({exc})") from None
        _check_length(fileobj, fileobj.tell(), math.prod(shape) * dtype.itemsize)
        kind = "float" if dtype.kind == "f" and not dtype.hasobject else str(dtype)
        return list(shape), kind
    entry, length = _safetensors_entry(fileobj)
    name = str(entry.get("dtype"))
    offsets = entry.get("data_offsets")
    if name in _FLOAT_TENSOR_TYPES:
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ValueError("the tensor's data_offsets are not a pair of integers")
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in offsets):
            raise ValueError("the tensor's data_offsets are not integers")
        need = math.prod(entry["shape"]) * _FLOAT_TENSOR_TYPES[name]
        if offsets[1] - offsets[0] != need:
            raise ValueError(f"the tensor's data_offsets span {offsets[1] - offsets[0]} bytes, its shape {need}")
        _check_length(fileobj, 8 + length + offsets[0], need)
    return list(entry["shape"]), "float" if name in _FLOAT_TENSOR_TYPES else name


def _safetensors_entry(fileobj: IO[bytes]) -> tuple[dict[str, Any], int]:
    """The embeddings tensor's header entry of a safetensors file (at its start) and the
    header's length. ValueError names what is wrong."""
    head = fileobj.read(8)
    (length,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
    if not 2 <= length <= 100 * 1024 * 1024:
        raise ValueError("the safetensors header has an impossible length")
    try:
        header = json.loads(fileobj.read(length))
    except ValueError:
        raise ValueError("the safetensors header is not JSON") from None
    except RecursionError:  # ``[[[[…``: json raises this, not ValueError
        raise ValueError("the safetensors header is nested too deeply") from None
    tensors = {k: v for k, v in header.items() if k != "__metadata__"} if isinstance(header, dict) else {}
    entry = tensors.get("embeddings") or (next(iter(tensors.values())) if len(tensors) == 1 else None)
    if not isinstance(entry, dict) or not isinstance(entry.get("shape"), list):
        raise ValueError("expected an 'embeddings' tensor (or a single tensor)")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in entry["shape"]):
        raise ValueError("the tensor's shape is not a list of integers")
    return entry, length


def embeddings_map(path: str, fmt: str) -> Any:
    """The embeddings of a file ``embeddings_shape`` accepted as floats, memory-mapped
    read-only (nothing read until used): a numpy array."""
    import numpy as np

    if fmt == "npy":
        return np.load(path, mmap_mode="r", allow_pickle=False)
    with open(path, "rb") as handle:
        entry, length = _safetensors_entry(handle)
    dtype = np.dtype({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[str(entry["dtype"])])
    start = 8 + length + int(entry["data_offsets"][0])
    return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=tuple(entry["shape"]))


def _check_length(fileobj: IO[bytes], start: int, need: int) -> None:
    """ValueError unless the file holds ``need`` bytes of tensor data from ``start``: a header
    can promise rows its file does not hold, which no worker could then load."""
    size = fileobj.seek(0, os.SEEK_END)
    if size < start + need:
        raise ValueError(f"the file is {size} bytes, too short for the {need}-byte tensor its header describes")
