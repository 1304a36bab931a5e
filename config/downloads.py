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
from collections.abc import AsyncIterator
from typing import IO, Any

from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse

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
