"""The training trace: what a worker commits to about how it trained, and which parts the
platform re-executes.

A trained kind's run writes a checkpoint of its whole training state (weights, optimizer,
schedule, scaler, loop counters) every ``every`` optimizer steps and at each epoch's end,
and lists them in ``trace.json``: one leaf per checkpoint (its index, the optimizer step it
was taken at, the epoch, the training loss there in micro-units, and the sha256 of the
checkpoint file and of its weights). The leaves' Merkle root (RFC 6962 over each leaf's
canonical JSON, ``protocol.merkle``) goes into the signed ComputeResult's proof as
``proof["trace"]``, so the worker is bound to the whole chain before it learns which
segments (checkpoint i → i + 1) the platform picks (``challenge``, keyed on the root with a
platform secret). The worker then hands over the picked segments' checkpoints, and the
platform re-executes each segment from its start and compares the result with its end.

Nothing here imports Django: the node builds the trace, the platform checks it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from protocol import merkle
from protocol.encoding import canonical_json

TRACE_FILE = "trace.json"
TRACE_VERSION = 1
# A trace.json above this is refused unread (a leaf is about 250 bytes).
MAX_TRACE_BYTES = 4 * 2**20
MAX_LEAVES = 10_000


class TraceError(ValueError):
    """A trace that is malformed or does not match its commitment; the message says why, as
    the requester reads it."""


def checkpoint_name(index: int) -> str:
    """The artifact name of checkpoint ``index``."""
    return f"ckpt-{index:05d}.safetensors"


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is a checkpoint's artifact name."""
    return (
        len(name) == len(checkpoint_name(0))
        and name.startswith("ckpt-")
        and name[5:10].isdigit()
        and name.endswith(".safetensors")
    )


@dataclass(frozen=True)
class Leaf:
    """One checkpoint in the chain."""

    index: int
    step: int  # optimizer steps done when it was taken
    epoch: int  # the epoch it falls in (its end, for an epoch's last checkpoint)
    loss_micro: int  # mean training loss of the steps since the previous checkpoint, × 1e6 (0 for the first)
    state_sha256: str  # sha256 of the checkpoint file
    weights_sha256: str  # sha256 of the model's weights alone (``training.artifacts`` order)

    def encode(self) -> bytes:
        """The leaf's bytes under the root."""
        return canonical_json(asdict(self), "leaf")


@dataclass(frozen=True)
class Trace:
    """A run's chain of checkpoints."""

    every: int
    leaves: tuple[Leaf, ...]

    @property
    def root(self) -> str:
        """Hex Merkle root over the leaves."""
        return trace_root(self.leaves)

    @property
    def segments(self) -> int:
        """Segments the chain holds (checkpoint i → i + 1)."""
        return max(0, len(self.leaves) - 1)

    def commitment(self) -> dict[str, Any]:
        """What goes into the signed proof as ``proof["trace"]``."""
        return {"version": TRACE_VERSION, "root": self.root, "every": self.every, "leaves": len(self.leaves)}

    def to_json(self) -> dict[str, Any]:
        return {"version": TRACE_VERSION, "every": self.every, "leaves": [asdict(leaf) for leaf in self.leaves]}

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1))


def trace_root(leaves: Sequence[Leaf]) -> str:
    """Hex RFC 6962 Merkle root over the leaves' canonical JSON."""
    return merkle.root([leaf.encode() for leaf in leaves]).hex()


def _int(raw: Mapping[str, Any], name: str, lo: int = 0) -> int:
    value = raw.get(name)
    if type(value) is not int or value < lo:
        raise TraceError(f"trace.json: {name} must be an integer ≥ {lo}.")
    return value


def _hex64(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise TraceError(f"trace.json: {name} must be 64 lower-case hex characters.")
    return value


def parse_trace(raw: Any) -> Trace:
    """A trace from its JSON; TraceError says what is wrong. Checks the chain's shape: indices
    0, 1, 2, … and steps that never go back."""
    if not isinstance(raw, dict) or raw.get("version") != TRACE_VERSION:
        raise TraceError(f"trace.json is not a version-{TRACE_VERSION} trace.")
    every = _int(raw, "every", 1)
    items = raw.get("leaves")
    if not isinstance(items, list) or not 2 <= len(items) <= MAX_LEAVES:
        raise TraceError(f"trace.json must list between 2 and {MAX_LEAVES} checkpoints.")
    leaves: list[Leaf] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != {f for f in Leaf.__dataclass_fields__}:
            raise TraceError(
                f"trace.json: checkpoint {i} must have exactly the fields {sorted(Leaf.__dataclass_fields__)}."
            )
        leaf = Leaf(
            index=_int(item, "index"),
            step=_int(item, "step"),
            epoch=_int(item, "epoch"),
            loss_micro=_int(item, "loss_micro"),
            state_sha256=_hex64(item, "state_sha256"),
            weights_sha256=_hex64(item, "weights_sha256"),
        )
        if leaf.index != i:
            raise TraceError(f"trace.json: checkpoint {i} says it is number {leaf.index}.")
        if i and not 0 < leaf.step - leaves[-1].step <= every:
            raise TraceError(
                f"trace.json: checkpoint {i} is {leaf.step - leaves[-1].step} steps after the one before it "
                f"(must be 1 to {every})."
            )
        leaves.append(leaf)
    if leaves[0].step != 0:
        raise TraceError("trace.json: the first checkpoint must be the untrained state (step 0).")
    return Trace(every=every, leaves=tuple(leaves))


def read_trace(path: Path) -> Trace:
    """``parse_trace`` of a file, refusing one too large to be a trace."""
    if path.stat().st_size > MAX_TRACE_BYTES:
        raise TraceError(f"trace.json is larger than {MAX_TRACE_BYTES} bytes.")
    try:
        raw = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceError(f"trace.json is not JSON: {exc}") from None
    return parse_trace(raw)


def segments_needed(segments: int, detect: float, bad_fraction: float) -> int:
    """How many of ``segments`` to re-execute so that a chain with at least ``bad_fraction``
    of its segments wrong is caught with probability ≥ ``detect`` (drawing without
    replacement; all of them when the chain is short)."""
    if segments <= 0:
        return 0
    bad = max(1, math.ceil(bad_fraction * segments))
    miss = 1.0
    for drawn in range(segments):
        # P(no bad segment among drawn + 1 picks) = Π (good − j) / (segments − j).
        good_left = segments - bad - drawn
        miss *= max(0, good_left) / (segments - drawn)
        if 1.0 - miss >= detect:
            return drawn + 1
    return segments


# What the challenge is sized for: a chain with a tenth of its segments wrong is caught with
# probability 0.99, and re-executing the challenged segments costs at most a tenth of training.
# Their steps are budgeted at 6 % of the training's, not 10: a replayed step costs more than
# a trained one where the run trains in bf16 and the check replays in fp32 (about 1.1× on a
# CPU with native bf16), and each segment adds its set-up (two checkpoint reads and hashes,
# the state load: about 80 ms at the cube defaults). At 10 % the check cost 0.123 of the
# training there (bench/prooftrain.py). The price is more checkpoints on the worker's disk:
# about s / 0.06 ≈ 730 for a long run, against 440.
DETECT = 0.99
BAD_FRACTION = 0.1
VERIFY_SHARE = 0.06


def trace_every(total_steps: int) -> int:
    """The segment length k for a run of ``total_steps`` optimizer steps: the longest whose
    challenge (``segments_needed`` segments of k steps) replays at most ``VERIFY_SHARE`` of the
    training's steps, k = max(1, ⌊VERIFY_SHARE · T / s⌋) with s = segments_needed(T, DETECT,
    BAD_FRACTION). Longer segments would cost more to check; shorter ones, more checkpoints."""
    s = segments_needed(max(1, total_steps), DETECT, BAD_FRACTION)
    return max(1, math.floor(VERIFY_SHARE * total_steps / max(1, s)))


def challenge(root: str, secret: bytes, segments: int, count: int) -> list[int]:
    """``count`` distinct segments of ``segments``, sorted, drawn from HMAC(secret, root): fixed
    once the root is, and unknown to whoever lacks the secret."""
    count = min(count, segments)
    picked: set[int] = set()
    counter = 0
    while len(picked) < count:
        block = hmac.new(secret, f"challenge:{root}:{counter}".encode(), hashlib.sha256).digest()
        for i in range(0, 32, 8):
            value = int.from_bytes(block[i : i + 8], "big")
            # Rejection sampling keeps every segment equally likely.
            limit = (1 << 64) - (1 << 64) % segments
            if value < limit and len(picked) < count:
                picked.add(value % segments)
        counter += 1
    return sorted(picked)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Segment:
    """One challenged segment: the checkpoint files at its two ends and their leaves."""

    start: Path
    start_leaf: Leaf
    end: Path
    end_leaf: Leaf
