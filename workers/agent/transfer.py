"""The node's HTTP client to its platform: requests with retries, uploads, downloads.

Every call goes to the node's own server with its worker token. Connection errors and 5xx
(the platform restarting, a proxy's 502) are retried with capped exponential backoff for
about a minute and a half; an upload streams the file from disk, in parts when it is
larger than one request may be (``workers/assignments/uploads.py``); a download resumes by
byte ranges where it broke off and is checked against the size and sha256 the platform
announced; a dataset in shards is a manifest and then its files, each downloaded so (by
the kind's ingest, when it has one, which may read each into its cache and delete it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from training import stop
from training.asl.shards import is_sharded_file
from training.plugin import FetchListed, Listed
from workers.agent import trust

log = logging.getLogger("workers.agent")
UPLOAD_CHUNK = 1 << 20  # bytes a streamed request body reads from disk at a time
UPLOAD_PART = 32 << 20  # the largest single request; larger artifacts go in parts of this size
RETRY_ATTEMPTS = 8  # requests and downloads: 1+2+4+8+16+30+30 s of waiting, about 91 s, then give up
RETRY_MAX_DELAY = 30.0
# The most one GET asks for when the size is known: the platform's ASGI server holds what it
# has not yet sent in memory (it applies no backpressure to response bodies), so a file is
# fetched in ranges of this size and the web process holds one of them per download at most.
DOWNLOAD_PIECE = 64 << 20
MANIFEST_MAX_BYTES = 16 << 20  # a dataset's manifest: about 100,000 files' entries
MANIFEST_FILES = 100_000
_SHA256 = re.compile(r"[0-9a-f]{64}")
# A kind's ``Kind.ingest`` bound to its job's spec: (folder, the manifest's files, fetch).
BoundIngest = Callable[[Path, Sequence[Listed], FetchListed], None]


class JobError(RuntimeError):
    """A job cannot go on here, for a reason worth reporting to the platform as it is."""


def _never() -> bool:
    return False


def _resume_point(response: httpx.Response, size: int) -> int | None:
    """Where the platform asks a part upload to continue (its 409's ``received``), if it does."""
    if response.status_code != 409:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    received = body.get("received") if isinstance(body, dict) else None
    return received if type(received) is int and 0 <= received < size else None


def _read(path: Path, start: int, stop: int) -> Iterator[bytes]:
    """Bytes ``start:stop`` of ``path`` in UPLOAD_CHUNK pieces."""
    with path.open("rb") as handle:
        handle.seek(start)
        left = stop - start
        while left > 0 and (chunk := handle.read(min(UPLOAD_CHUNK, left))):
            left -= len(chunk)
            yield chunk


def _range(received: int, size: int | None) -> dict[str, str]:
    """The Range header of the next GET of a file: the next piece of ``DOWNLOAD_PIECE`` bytes
    when its size is known and larger, the rest after a break-off, none for a whole file."""
    if size is not None and size > DOWNLOAD_PIECE and received < size:
        return {"Range": f"bytes={received}-{min(received + DOWNLOAD_PIECE, size) - 1}"}
    return {"Range": f"bytes={received}-"} if received else {}


def _check_resumed(url: str, response: httpx.Response, received: int) -> None:
    """JobError unless a 206 answer continues at byte ``received``."""
    answered = response.headers.get("Content-Range", "")
    if not answered.startswith(f"bytes {received}-"):
        response.read()
        raise JobError(f"GET {url}: asked for the bytes from {received}, got the range {answered[:80]!r}")


def _manifest_files(raw: bytes) -> dict[str, dict[str, Any]]:
    """The files a dataset manifest lists, by name; JobError naming what is wrong with it."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise JobError("refused the dataset's manifest: it is not JSON") from None
    listed = body.get("files") if isinstance(body, dict) else None
    if not isinstance(listed, list) or not listed or len(listed) > MANIFEST_FILES:
        raise JobError(f"refused the dataset's manifest: it must list 1 to {MANIFEST_FILES} files")
    files: dict[str, dict[str, Any]] = {}
    for entry in listed:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not is_sharded_file(name):
            raise JobError(f"refused the dataset's manifest: {name!r:.80} is not a file name of a dataset in shards")
        if name in files:
            raise JobError(f"refused the dataset's manifest: it lists {name} twice")
        size, digest, url = entry.get("size_bytes"), entry.get("sha256"), entry.get("url")
        if type(size) is not int or size < 0 or not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise JobError(f"refused the dataset's manifest: {name} has no size and sha256")
        if not isinstance(url, str):
            raise JobError(f"refused the dataset's manifest: {name} has no URL")
        files[name] = {"size_bytes": size, "sha256": digest, "url": url}
    return files


def reasons(response: httpx.Response) -> str:
    """An API error body ({field: [message], "code": …} or {"detail": …}) as one line."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if not isinstance(body, dict):
        return str(body)
    parts = []
    for field, value in body.items():
        if field == "code":
            continue
        text = " ".join(str(v) for v in value) if isinstance(value, list) else str(value)
        parts.append(text if field in ("detail", "non_field_errors") else f"{field}: {text}")
    return "; ".join(parts)


class PlatformClient:
    """HTTP to the node's own server, authenticated as its worker."""

    def __init__(self, server: str, token: str) -> None:
        self.server = server.rstrip("/")
        self.http = httpx.Client(base_url=self.server, headers={"Authorization": f"Worker {token}"}, timeout=60)
        # Asked between retries of the start-up calls: a node told to stop while the
        # platform is down stops now, not after their minute and a half of retries each.
        self.stopping: Callable[[], bool] = _never

    def _pause(self, seconds: float, interruptible: bool) -> bool:
        """Sleep ``seconds``; False, at once, when ``interruptible`` and the node is stopping."""
        if not interruptible:
            time.sleep(seconds)
            return True
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            if self.stopping():
                return False
            time.sleep(min(0.1, left))
        return not self.stopping()

    def request(
        self,
        method: str,
        url: str,
        body: Callable[[], Iterator[bytes]] | None = None,
        *,
        interruptible: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        """HTTP with retries on connection errors and 5xx (the server may be restarting).

        ``body`` makes a fresh streamed request body for each attempt (a file read again
        from its start), for uploads too large to hold in memory. ``interruptible`` gives
        up between attempts once the node is stopping (``stopping``).
        """
        delay = 1.0
        for attempt in range(RETRY_ATTEMPTS):
            try:
                if body is not None:
                    kwargs["content"] = body()
                response = self.http.request(method, url, **kwargs)
                if response.status_code < 500:
                    return response
            except httpx.TransportError as exc:
                log.warning("%s %s failed (%s); retrying", method, url, exc)
            if attempt < RETRY_ATTEMPTS - 1:
                if not self._pause(delay, interruptible):
                    raise RuntimeError(f"{method} {url}: given up, the node is stopping")
                delay = min(delay * 2, RETRY_MAX_DELAY)
        raise RuntimeError(f"{method} {url}: the platform is unreachable")

    def upload(self, url: str, name: str, path: Path) -> httpx.Response:
        """PUT one file, streamed from disk; in UPLOAD_PART parts when it is larger.

        Each request streams UPLOAD_CHUNK pieces with its Content-Length, never the file as
        one bytes object, which would cost its size in memory and whose unsent rest httpx
        re-slices after every socket write (two minutes for a 1.6 GB product on loopback).
        Parts (``workers/assignments/uploads.py``) bound what one request costs the platform's web
        process, which holds a whole body in memory; a part the platform says it did not
        expect (409) is resent from where it says it is. Returns the last response: 201 once
        the whole file is in.
        """
        size = path.stat().st_size
        headers = {"Content-Disposition": f'attachment; filename="{name}"'}
        if size <= UPLOAD_PART:
            return self.request(
                "PUT", url, body=partial(_read, path, 0, size), headers={**headers, "Content-Length": str(size)}
            )
        start, attempts = 0, 0
        while True:
            end = min(size, start + UPLOAD_PART) - 1
            response = self.request(
                "PUT",
                url,
                body=partial(_read, path, start, end + 1),
                headers={
                    **headers,
                    "Content-Length": str(end - start + 1),
                    "Content-Range": f"bytes {start}-{end}/{size}",
                },
            )
            resume = _resume_point(response, size)
            if resume is not None and attempts < 3:
                # A part whose answer was lost was applied after all, or one went missing.
                attempts, start = attempts + 1, resume
                continue
            if response.status_code != 202:
                return response
            attempts, start = 0, end + 1

    def download(self, url: str, dest: Path, *, sha256: str = "", size: int | None = None) -> None:
        """GET a file the platform serves this worker into ``dest``, checked against what it said.

        Only from the node's own server (``trust.on_own_server``). Transport errors and 5xx
        (the platform restarting, a proxy's 502) are retried like ``request``; a body that
        broke off is resumed where it stopped (``Range: bytes=N-``, 206), or started again
        when the server sends the whole file. A file of known ``size`` over ``DOWNLOAD_PIECE``
        is asked for in ranges of that size, one after the other (``Range: bytes=N-M``), so
        the platform never holds more than one piece of it. The retries give up after ``RETRY_ATTEMPTS``
        failures in a row without a byte received, so a long download over a link that
        breaks now and then finishes. Any other status fails at once. With ``size``
        and ``sha256`` (the job's dataset entry, a manifest's file) a body that differs
        fails the job, naming both.
        """
        try:
            url = trust.on_own_server(url, self.server)
        except ValueError as exc:
            raise JobError(f"refused to download: {exc}") from None
        delay, failures = 1.0, 0
        digest, received = hashlib.sha256(), 0
        with dest.open("wb") as out:
            while True:
                before = received
                headers = _range(received, size)
                try:
                    with self.http.stream("GET", url, headers=headers) as response:
                        if response.status_code < 500:
                            if received and response.status_code == 416 and received == size:
                                break  # every byte had arrived before the connection broke
                            if headers and response.status_code == 206:
                                _check_resumed(url, response, received)
                            elif response.status_code == 200:  # the whole file: from its start
                                out.seek(0)
                                out.truncate()
                                digest, received = hashlib.sha256(), 0
                            else:
                                response.read()
                                raise JobError(f"GET {url}: HTTP {response.status_code} {response.text[:200]}")
                            # As they arrive: what came before a break-off is kept, and resumed after.
                            for chunk in response.iter_bytes():
                                stop.check()
                                out.write(chunk)
                                digest.update(chunk)
                                received += len(chunk)
                                if size is not None and received > size:
                                    break  # longer than announced: checked below, not stored on
                            if response.status_code == 206 and size is not None and received < size:
                                if received > before:
                                    delay, failures = 1.0, 0
                                    continue  # the next piece
                                raise JobError(f"GET {url}: an empty part at byte {received} of {size}")
                            break
                        problem = f"HTTP {response.status_code}"
                except httpx.TransportError as exc:
                    problem = str(exc) or type(exc).__name__
                if received > before:  # a break-off after progress: the retries start over
                    delay, failures = 1.0, 0
                failures += 1
                if failures >= RETRY_ATTEMPTS:
                    raise JobError(f"GET {url}: the platform is unreachable")
                log.warning("GET %s failed (%s); resuming at byte %d", url, problem, received)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_DELAY)
        if size is not None and received != size:
            raise JobError(
                f"{dest.name} is {received} bytes, but the platform said {size}: the download is not the file"
            )
        if sha256 and digest.hexdigest() != sha256.lower():
            raise JobError(f"{dest.name} has sha256 {digest.hexdigest()}, but the platform said {sha256}")

    def download_folder(
        self, url: str, dest: Path, *, sha256: str, size: int | None, ingest: BoundIngest | None = None
    ) -> None:
        """Download a dataset in shards into the folder ``dest``: first its manifest (at
        ``url``, checked against the job's ``sha256`` and ``size``), then each file it
        lists, resumably, each checked against the manifest's size and sha256.

        The manifest is refused unless it names at most ``MANIFEST_FILES`` distinct plain
        file names of a sharded folder (``training.asl.shards``: never a path, so nothing
        is written outside ``dest``), each with its size, sha256 and a URL on this node's
        own server. With ``ingest`` (the kind's ``Kind.ingest``, bound to the job's spec)
        the kind fetches the files itself, each through the same checked download, and may
        read them into what its runner reads and delete them as they arrive.
        """
        if size is None or not 0 < size <= MANIFEST_MAX_BYTES:
            raise JobError(f"refused the dataset's manifest: its size {size!r} is not 1 to {MANIFEST_MAX_BYTES} bytes")
        manifest = dest.parent / f"{dest.name}.manifest.json"
        self.download(url, manifest, sha256=sha256, size=size)
        files = _manifest_files(manifest.read_bytes())
        dest.mkdir()

        def fetch(name: str, path: Path) -> None:
            entry = files.get(name)
            if entry is None:
                raise JobError(f"the dataset's manifest lists no file {name!r:.80}")
            self.download(entry["url"], path, sha256=entry["sha256"], size=entry["size_bytes"])

        if ingest is None:
            for name in files:
                fetch(name, dest / name)
            return
        ingest(dest, [Listed(name, e["size_bytes"], e["sha256"]) for name, e in files.items()], fetch)
