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
"""

from __future__ import annotations

import asyncio
import io
import zipfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import IO, Any

from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, StreamingHttpResponse

CHUNK_BYTES = 1 << 20


def download(request: Any, handle: IO[bytes], filename: str) -> FileResponse:
    """An attachment response for ``handle`` (closed with the response), streamed under ASGI.

    ``request`` is Django's request or DRF's wrapper of it.
    """
    response = FileResponse(handle, as_attachment=True, filename=filename)  # sets the headers
    if isinstance(getattr(request, "_request", request), ASGIRequest):
        response.streaming_content = _chunks(handle)
    return response


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
