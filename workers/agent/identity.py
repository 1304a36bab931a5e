"""The node's key file and the credentials file the platform gives it.

``worker.pem`` holds the ed25519 private key (PKCS#8 PEM, mode 0600); it never leaves
the node, and a key file that its group or others may read is refused, as ssh refuses
one. ``worker.json`` beside it holds the server URL, worker id, address, the worker API
token, the ledger's chain id and the node's broker login from registration (also 0600, and refused, like the key,
when its group or others may read it).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from protocol.keys import KeyPair, from_seed


class IdentityError(Exception):
    """A key or credentials file is missing, unreadable or malformed."""


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` readable by its owner only, without a window where it is wider."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _read_private(path: Path, what: str) -> bytes:
    """The bytes of a file only its owner may read; one its group or others may read is
    refused (checked on the open file, so a swap between check and read can't slip by)."""
    with path.open("rb") as handle:
        mode = stat.S_IMODE(os.fstat(handle.fileno()).st_mode)
        if os.name == "posix" and mode & 0o077:
            raise IdentityError(
                f"{path} is readable by other users (mode {mode:04o}); it holds the {what}: "
                f"make it private with `chmod 600 {path}` and try again."
            )
        return handle.read()


def init_key(path: Path) -> KeyPair:
    """Generate a key file at ``path``; refuse to overwrite an existing one."""
    if path.exists() or path.is_symlink():
        raise IdentityError(f"{path} already exists; one key per node (delete it only to become a new worker).")
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_private(path, pem)
    except OSError as exc:  # no permission, a parent that is a file, a read-only disk
        raise IdentityError(f"Cannot write the key file {path}: {exc.strerror or exc}") from None
    return load_key(path)


def load_key(path: Path) -> KeyPair:
    """Read the node's key pair from its PEM file, refusing one others may read."""
    try:
        # The key controls the worker's earnings: a copy others can read is a leak.
        data = _read_private(path, "node's private key")
        private = serialization.load_pem_private_key(data, password=None)
    except FileNotFoundError:
        raise IdentityError(f"No key file at {path}; run `python -m workers.agent init` first.") from None
    except OSError as exc:  # a directory, no permission, an I/O error
        raise IdentityError(f"Cannot read the key file {path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError) as exc:
        raise IdentityError(f"{path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise IdentityError(f"{path} does not hold an ed25519 key.")
    seed = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return from_seed(seed)


@dataclass(frozen=True)
class Credentials:
    """What registration returned: where the platform is and how to authenticate.

    ``chain_id`` is the ledger chain the node registered on; the node signs transactions
    for that chain only. Empty in a ``worker.json`` from an agent that did not record it.
    ``broker_url`` is the node's own login to its queue on the platform's node broker
    (``amqps://<address>:<password>@host/vhost``); empty when the platform gave none
    (its embedded broker: ``run --broker`` names it).
    """

    server: str
    worker_id: str
    address: str
    token: str
    chain_id: str = ""
    broker_url: str = ""

    def save(self, path: Path) -> None:
        data = json.dumps(self.__dict__, indent=2).encode()
        # A hidden name of its own, never ``path.with_suffix(".tmp")``: for a key named
        # ``<name>.tmp`` that is the key file itself, which this would delete.
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.unlink(missing_ok=True)
            _write_private(tmp, data)
            tmp.replace(path)
        except OSError as exc:  # no permission, a directory in the way, a full disk
            raise IdentityError(f"Cannot write the credentials file {path}: {exc.strerror or exc}") from None

    @classmethod
    def load(cls, path: Path) -> Credentials:
        try:
            # The token lets its holder act as the node (heartbeats, progress, fetching the
            # tasks' data), the broker login take its jobs: refused when others may read
            # it, as the key is.
            data: dict[str, Any] = json.loads(_read_private(path, "worker's API token and broker login"))
            fields = {k: str(data[k]) for k in ("server", "worker_id", "address", "token")}
            return cls(**fields, chain_id=str(data.get("chain_id") or ""), broker_url=str(data.get("broker_url") or ""))
        except FileNotFoundError:
            raise IdentityError(f"No credentials at {path}; run `python -m workers.agent register` first.") from None
        except OSError as exc:  # a directory, no permission, an I/O error
            raise IdentityError(f"Cannot read the credentials file {path}: {exc.strerror or exc}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise IdentityError(f"{path} is not a valid credentials file: {exc}") from None


def credentials_path(key_path: Path) -> Path:
    """``worker.json`` beside ``worker.pem``; a key file that would share that name is refused."""
    path = key_path.with_name(key_path.stem + ".json")
    if path == key_path:
        raise IdentityError(f"{key_path} ends in .json, the name of its credentials file; name the key worker.pem.")
    return path
