"""File downloads that stream under ASGI instead of being read whole first.

Django hands a FileResponse (a synchronous iterator over the file) to an ASGI server by
first reading the whole iterator into a list, so a 1.6 GB product, a model or a large
dataset sat in the web process's memory, all of it, before its first byte went out. Under
ASGI, ``download`` gives the response an asynchronous body instead: one chunk at a time,
read in a thread, sent before the next is read. Under WSGI and the test client the plain
FileResponse streams already.

Daphne applies no backpressure to a response body: what a slow client has not taken yet
waits in its send buffer. A deployment serving large files to slow clients puts a
buffering proxy (nginx's default) in front of the web processes.

``ranged_download`` also answers one ``Range: bytes=…`` request with that part of the file
(206 Partial Content), which Django's FileResponse does not do: a client whose download
broke off asks for the rest instead of starting again.
"""

from __future__ import annotations

import asyncio
import io
import mimetypes
import re
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import IO, Any

from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase

CHUNK_BYTES = 1 << 20


def download(request: Any, handle: IO[bytes], filename: str) -> FileResponse:
    """An attachment response for ``handle`` (closed with the response), streamed under ASGI.

    ``request`` is Django's request or DRF's wrapper of it.
    """
    response = FileResponse(handle, as_attachment=True, filename=filename)  # sets the headers
    if isinstance(getattr(request, "_request", request), ASGIRequest):
        response.streaming_content = _chunks(handle)
    return response


_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)")
# More digits than this name a byte past any file (int() refuses strings of thousands of digits).
_DIGITS = 19


class RangeNotSatisfiable(Exception):
    """A ``Range`` header in bytes that names no part of the file, or more than one."""


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The first and last byte (inclusive) a ``Range`` header asks of a ``size``-byte file;
    None for the whole file (no header, or a unit other than bytes, which a server ignores).

    One range only (``a-b``, ``a-``, or the last ``n`` bytes as ``-n``, in ASCII digits of
    any length); a malformed one, several, or one that starts past the end raises
    RangeNotSatisfiable."""
    if header is None or not header.strip().lower().startswith("bytes="):
        return None
    found = _RANGE.fullmatch(header.strip().replace(" ", "").lower())
    if found is None:
        raise RangeNotSatisfiable(header)
    first, last = found.groups()
    if not first:
        if not last or _number(last) == 0 or size == 0:
            raise RangeNotSatisfiable(header)
        return max(0, size - _number(last)), size - 1
    start = _number(first)
    end = size - 1 if not last else min(_number(last), size - 1)
    if start >= size or (last and _number(last) < start):
        raise RangeNotSatisfiable(header)
    return start, end


def _number(digits: str) -> int:
    """The value of a run of ASCII digits; one past any file's size stands as 2**64."""
    significant = digits.lstrip("0")
    return int(significant or "0") if len(significant) <= _DIGITS else 1 << 64


def ranged_download(request: Any, handle: IO[bytes], filename: str, size: int) -> HttpResponseBase:
    """``download`` of a ``size``-byte seekable ``handle`` that honours one byte range: 206
    with ``Content-Range`` for a satisfiable one, 416 with ``Content-Range: bytes */size``
    otherwise (the handle closed either way). Every answer says ``Accept-Ranges: bytes``."""
    headers = getattr(request, "headers", {})
    try:
        span = byte_range(headers.get("Range"), size)
    except RangeNotSatisfiable:
        handle.close()
        refused = HttpResponse(status=416)
        refused["Content-Range"] = f"bytes */{size}"
        refused["Accept-Ranges"] = "bytes"
        return refused
    if span is None:
        whole = download(request, handle, filename)
        whole["Accept-Ranges"] = "bytes"
        return whole
    start, end = span
    handle.seek(start)
    chunks = _part(handle, end - start + 1)
    asgi = isinstance(getattr(request, "_request", request), ASGIRequest)
    kind = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    response = StreamingHttpResponse(_in_threads(chunks) if asgi else chunks, status=206, content_type=kind)
    response["Content-Range"] = f"bytes {start}-{end}/{size}"
    response["Content-Length"] = str(end - start + 1)
    response["Accept-Ranges"] = "bytes"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _part(handle: IO[bytes], length: int) -> Iterator[bytes]:
    """``length`` bytes of ``handle`` from where it stands, in chunks; closes it at the end."""
    try:
        while length > 0 and (chunk := handle.read(min(CHUNK_BYTES, length))):
            length -= len(chunk)
            yield chunk
    finally:
        handle.close()


async def _chunks(handle: IO[bytes]) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(handle.read, CHUNK_BYTES):
        yield chunk


# (name in the archive, a function that opens the file for reading)
ZipMember = tuple[str, Callable[[], IO[bytes]]]


def zip_download(request: Any, members: Sequence[ZipMember], filename: str) -> StreamingHttpResponse:
    """An attachment response of a ZIP archive of ``members``, built as it is sent: one
    chunk of one file at a time, never the whole archive (nor a whole file) in memory.

    Stored, not deflated (models and arrays barely compress), with ZIP64 entries so a file
    past 4 GiB fits; each entry's sizes follow its data, as a stream allows."""
    chunks = _zip_chunks(members)
    streamed = chunks if not isinstance(getattr(request, "_request", request), ASGIRequest) else _in_threads(chunks)
    response = StreamingHttpResponse(streamed, content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


class _Pipe(io.RawIOBase):
    """A write-only, unseekable stream whose bytes are taken as they are written."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def _zip_chunks(members: Sequence[ZipMember]) -> Iterator[bytes]:
    pipe = _Pipe()
    with zipfile.ZipFile(pipe, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, open_member in members:
            with open_member() as source, archive.open(name, "w", force_zip64=True) as entry:
                while chunk := source.read(CHUNK_BYTES):
                    entry.write(chunk)
                    if data := pipe.take():
                        yield data
    yield pipe.take()


async def _in_threads(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` drawn one at a time in a worker thread, for an ASGI response body."""
    done = object()
    while (chunk := await asyncio.to_thread(next, chunks, done)) is not done:
        assert isinstance(chunk, bytes)
        yield chunk
