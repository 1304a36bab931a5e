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


# The safetensors dtypes the workers' loader (``safetensors.numpy.load_file``) can read, and
# their sizes in bytes. The format has more (BF16, the 8-bit floats), but numpy has no such
# types, and one such tensor anywhere in a file makes the loader refuse the whole file.
_TENSOR_TYPES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
_FLOAT_TENSOR_TYPES = ("F16", "F32", "F64")
_TENSOR_FIELDS = ("dtype", "shape", "data_offsets")
# The safetensors library's own bounds: a header of at most 10^8 bytes, sizes in a u64.
_MAX_SAFETENSORS_HEADER = 100_000_000
_USIZE_LIMIT = 2**64


def embeddings_shape(fileobj: IO[bytes], fmt: str, tensor: str = "embeddings") -> tuple[list[int], str]:
    """(shape, dtype) of the embeddings in an .npy or .safetensors file, from its header only.

    The tensor is ``embeddings``, or a file's only tensor (or a safetensors file's
    ``tensor``, which must be there by name: dialogue ``targets``). Nothing is unpickled: the npy
    header is a literal, the safetensors header JSON, checked whole as the workers' loader
    checks it. ValueError names what is wrong.
    """
    fileobj.seek(0)
    if fmt == "npy":
        import numpy as np

        try:
            version = np.lib.format.read_magic(fileobj)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fileobj)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(fileobj)
            else:  # the workers' np.load refuses any other version, so posting refuses it too
                raise ValueError(f"format version {version} is not supported (1.0 or 2.0)")
        except (ValueError, OSError, SyntaxError) as exc:
            raise ValueError(f"the .npy header cannot be read ({exc})") from None
        if any(type(size) is not int for size in shape):  # (True, 768) passed as one row
            raise ValueError(f"the .npy shape {shape} is not made of integers")
        _check_length(fileobj, fileobj.tell(), math.prod(shape) * dtype.itemsize)
        # The loaders take little-endian float16/32/64 only (training/cube/data.py).
        kind = "float" if dtype.str in ("<f2", "<f4", "<f8") else (dtype.str if dtype.byteorder == ">" else str(dtype))
        return list(shape), kind
    entry, _ = _safetensors_entry(fileobj, tensor)
    name = entry["dtype"]
    return list(entry["shape"]), "float" if name in _FLOAT_TENSOR_TYPES else name


def _safetensors_entry(fileobj: IO[bytes], tensor: str = "embeddings") -> tuple[dict[str, Any], int]:
    """The header entry of a safetensors file's ``tensor`` (the embeddings may be its only
    tensor, under any name) and the header's length, read from the file's start.
    ValueError names what is wrong."""
    tensors, length = _safetensors_header(fileobj)
    entry = tensors.get(tensor)
    if entry is None and tensor == "embeddings" and len(tensors) == 1:
        entry = next(iter(tensors.values()))
    if entry is None:
        alone = " (or a single tensor)" if tensor == "embeddings" else ""
        article = "an" if tensor[:1] in "aeiou" else "a"
        raise ValueError(f"expected {article} {tensor!r} tensor{alone}")
    return entry, length


def _safetensors_header(fileobj: IO[bytes]) -> tuple[dict[str, dict[str, Any]], int]:
    """Every tensor's header entry of a safetensors file (read from its start) and the
    header's length, reading nothing past the header.

    The rules are the safetensors library's own, which ``safetensors.numpy.load_file`` (the
    workers' loader) applies before it loads anything, refusing the whole file if one
    fails: a UTF-8 JSON header; ``__metadata__`` a map of strings to strings; every tensor a
    known dtype, a shape and a pair of data_offsets, all non-negative integers, whose span
    is the shape's size; the tensors back to back from byte 0 in offset order, without gap
    or overlap, ending where the file ends. A few things the library lets by and no writer
    produces are refused too: repeated keys, fields it ignores, dtypes numpy lacks.
    ValueError names what is wrong.
    """
    head = fileobj.read(8)
    (length,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
    if not 2 <= length <= _MAX_SAFETENSORS_HEADER:
        raise ValueError("the safetensors header has an impossible length")
    raw = fileobj.read(length)
    if len(raw) < length:
        raise ValueError(f"the safetensors header is {length} bytes long, longer than the file")
    try:
        header = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=_json_object,
            parse_int=_json_int,
            parse_constant=_json_constant,
        )
    except UnicodeDecodeError:
        raise ValueError("the safetensors header is not UTF-8 text") from None
    except json.JSONDecodeError:
        raise ValueError("the safetensors header is not JSON") from None
    except RecursionError:  # ``[[[[…``: json raises this, not ValueError
        raise ValueError("the safetensors header is nested too deeply") from None
    if not isinstance(header, dict):
        raise ValueError("the safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) and _is_unicode(v) for v in metadata.values())
    ):
        raise ValueError("the safetensors __metadata__ must map strings to strings")
    for name, entry in header.items():
        _check_tensor_entry(name, entry)
    end = 0
    for name, entry in sorted(header.items(), key=lambda item: tuple(item[1]["data_offsets"])):
        start, stop = entry["data_offsets"]
        if start != end:
            raise ValueError(
                f"the data of tensor {name!r} starts at byte {start}, not {end}:"
                " tensors must lie back to back from byte 0, without gaps or overlaps"
            )
        end = stop
    size = fileobj.seek(0, os.SEEK_END)
    if size < 8 + length + end:
        described = f"{end}-byte tensor" if len(header) == 1 else f"{end} bytes of tensors"
        raise ValueError(f"the file is {size} bytes, too short for the {described} its header describes")
    if size > 8 + length + end:
        extra = size - 8 - length - end
        raise ValueError(f"the file is {size} bytes, {extra} more than its header and tensors (the last must end it)")
    return header, length


def _check_tensor_entry(name: str, entry: Any) -> None:
    """ValueError unless ``entry`` is a well-formed header entry of one tensor."""
    if not isinstance(entry, dict):
        raise ValueError(f"the header entry of tensor {name!r} is not a JSON object")
    missing = [field for field in _TENSOR_FIELDS if field not in entry]
    if missing:
        raise ValueError(f"the header entry of tensor {name!r} lacks {', '.join(missing)}")
    if len(entry) > len(_TENSOR_FIELDS):
        unexpected = ", ".join(sorted(set(entry) - set(_TENSOR_FIELDS)))
        raise ValueError(f"the header entry of tensor {name!r} has unexpected fields: {unexpected}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not (isinstance(dtype, str) and dtype in _TENSOR_TYPES):
        readable = ", ".join(_TENSOR_TYPES)
        raise ValueError(f"tensor {name!r} has dtype {dtype!r}, which workers cannot load ({readable} only)")
    if not (isinstance(shape, list) and all(_is_usize(n) for n in shape)):
        raise ValueError(f"the shape of tensor {name!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_usize(n) for n in offsets)):
        raise ValueError(f"the data_offsets of tensor {name!r} are not a pair of non-negative integers")
    # As the library counts: the running product of the dimensions, then bytes, each in a u64.
    count = 1
    for n in [*shape, _TENSOR_TYPES[dtype]]:
        count *= n
        if count >= _USIZE_LIMIT:
            raise ValueError(f"the shape of tensor {name!r} is too large")
    if offsets[1] - offsets[0] != count:
        raise ValueError(
            f"the data_offsets of tensor {name!r} span {offsets[1] - offsets[0]} bytes, its shape and dtype {count}"
        )


def _is_usize(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _USIZE_LIMIT


def _is_unicode(text: str) -> bool:
    """Whether ``text`` has no lone surrogate (``"\\ud800"``): JSON text that Python reads and
    the library's parser does not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object of the header, refusing a repeated key (which Python and the library
    do not resolve alike) and a key that is not valid Unicode."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the safetensors header repeats the key {key!r}")
        if not _is_unicode(key):
            raise ValueError("the safetensors header holds a key that is not valid Unicode")
        result[key] = value
    return result


def _json_int(text: str) -> int | float:
    """A JSON integer; ``-0`` stays a float, as the library reads it (no valid size)."""
    if text == "-0":
        return -0.0
    try:
        return int(text)
    except ValueError:  # over Python's digit limit
        raise ValueError("the safetensors header holds an impossibly large integer") from None


def _json_constant(text: str) -> Any:
    """``NaN`` and ``Infinity``, which Python reads and JSON (and the library) does not."""
    raise ValueError("the safetensors header is not JSON")


def embeddings_map(path: str, fmt: str, tensor: str = "embeddings") -> Any:
    """The embeddings (or a safetensors file's ``tensor``) of a file ``embeddings_shape``
    accepted as floats, memory-mapped read-only (nothing read until used): a numpy array."""
    import numpy as np

    if fmt == "npy":
        return np.load(path, mmap_mode="r", allow_pickle=False)
    with open(path, "rb") as handle:
        entry, length = _safetensors_entry(handle, tensor)
    dtype = np.dtype({"F16": "<f2", "F32": "<f4", "F64": "<f8"}[str(entry["dtype"])])
    start = 8 + length + int(entry["data_offsets"][0])
    return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=tuple(entry["shape"]))


def _check_length(fileobj: IO[bytes], start: int, need: int) -> None:
    """ValueError unless the file holds ``need`` bytes of tensor data from ``start``: a header
    can promise rows its file does not hold, which no worker could then load."""
    size = fileobj.seek(0, os.SEEK_END)
    if size < start + need:
        raise ValueError(f"the file is {size} bytes, too short for the {need}-byte tensor its header describes")
