"""The synthetic kind's inputs: its spec and the seed that binds A and B to one assignment.

Seed encoding (version 1), fixed so that any implementation derives the same bytes:

    seed = sha256(block_hash ‖ worker_address ‖ task_id)

- ``block_hash``: the 32 raw bytes of the 64-hex-digit block hash (case-insensitive);
- ``worker_address``: the worker's bech32 address as ASCII bytes (``cpc1…``), as given;
- ``task_id``: the 16 bytes of the task's UUID (RFC 4122 byte order, ``uuid.UUID.bytes``).

The two fixed-length fields sit at either end, so the variable-length address between them
makes the concatenation unambiguous without a length prefix.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from training.specs import defaults, param

MAX_N = 16_384
MAX_COUNT = 64
MAX_ENTRY_BOUND = 8
# float32 represents every integer of magnitude ≤ 2^24 exactly; see PocSpec.
FLOAT32_EXACT_LIMIT = 2**24
MAX_ADDRESS_LENGTH = 90
# How A and B are drawn from the seed (training.poc.generate). New tasks name
# DEFAULT_GENERATOR (the marketplace writes it into every spec); a spec without the field
# is computed and verified with UNNAMED_GENERATOR, by agents and platforms of any version.
Generator = Literal["aes256ctr", "shake128"]
GENERATORS: tuple[Generator, ...] = ("aes256ctr", "shake128")
DEFAULT_GENERATOR: Generator = "aes256ctr"
UNNAMED_GENERATOR: Generator = "shake128"


@dataclass(frozen=True)
class SyntheticSpec:
    """Exact matmul of seeded integer matrices: the proof-of-compute kind."""

    n: int = param(1024, "Matrix edge n: A and B are n×n.", lo=64, hi=MAX_N, common=True)
    count: int = param(1, "Number of (A, B) pairs to multiply.", lo=1, hi=MAX_COUNT, common=True)
    entry_bound: int = param(
        8, "Entries are integers in [-entry_bound, entry_bound].", lo=1, hi=MAX_ENTRY_BOUND, common=True
    )
    generator: str = param(
        DEFAULT_GENERATOR,
        "How A and B are drawn from the seed: aes256ctr (AES-256 in counter mode, the fast default) "
        "or shake128 (the first generator, several times slower to check; kept for tasks posted with it).",
        choices=GENERATORS,
        form=False,
    )


# What a spec without the field means to the runner and the verifier (a missing generator
# is UNNAMED_GENERATOR's, not the posted default).
DEFAULTS: dict[str, int] = {name: defaults(SyntheticSpec)[name] for name in ("n", "count", "entry_bound")}


def feature(generator: str) -> str:
    """The capability feature of an agent that draws the matrices with ``generator``: what
    agents report and the scheduler matches (marketplace.kinds, workers.agent.capabilities)."""
    return f"poc:{generator}"


class PocError(ValueError):
    """A spec or seed material the synthetic kind cannot use; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class PocSpec:
    """``count`` products of n×n matrices with integer entries in [−entry_bound, entry_bound].

    Every partial sum of a row-by-column product is an integer of magnitude at most
    n·entry_bound², whatever order the hardware adds in; keeping that below 2^24 makes
    the float32 product exact, hence bit-identical on every device.
    """

    n: int
    count: int
    entry_bound: int
    generator: Generator = UNNAMED_GENERATOR

    @property
    def max_abs_entry(self) -> int:
        """The largest |C_ij| an honest product can have."""
        return self.n * self.entry_bound**2

    @property
    def rows(self) -> int:
        """Leaves of the result tree: every row of every product."""
        return self.n * self.count


@dataclass(frozen=True)
class SeedMaterial:
    """What the scheduler fixes for one assignment, already decoded."""

    block_hash: bytes
    worker_address: str
    task_id: uuid.UUID

    @property
    def seed(self) -> bytes:
        """sha256(block_hash ‖ worker_address ‖ task_id), as documented above."""
        return derive_seed(self.block_hash, self.worker_address, self.task_id)


def _int_field(spec: Mapping[str, Any], name: str, low: int, high: int) -> int:
    value = spec.get(name, DEFAULTS[name])
    # bool is an int subclass; True as a matrix size is a caller's mistake, not 1.
    if type(value) is not int:
        raise PocError(name, f"must be an integer, got {type(value).__name__}.")
    if not low <= value <= high:
        raise PocError(name, f"must be between {low} and {high}, got {value}.")
    return value


def parse_spec(spec: Mapping[str, Any]) -> PocSpec:
    """Validate a synthetic spec (missing fields take the registry's defaults).

    Raises PocError naming the field when a value is missing its type or bounds, or when
    n × entry_bound² ≥ 2^24 (the float32 product would no longer be exact).
    """
    if not isinstance(spec, Mapping):
        raise PocError("spec", "must be a JSON object.")
    n = _int_field(spec, "n", 1, MAX_N)
    count = _int_field(spec, "count", 1, MAX_COUNT)
    bound = _int_field(spec, "entry_bound", 1, MAX_ENTRY_BOUND)
    if n * bound**2 >= FLOAT32_EXACT_LIMIT:
        raise PocError("entry_bound", "n × entry_bound² must stay below 2^24 so float32 products are exact.")
    generator = spec.get("generator", UNNAMED_GENERATOR)
    if generator not in GENERATORS:
        # Text an older library does not know must stop the job, never be computed wrongly.
        raise PocError("generator", f"must be one of {', '.join(GENERATORS)}, got {str(generator)[:40]!r}.")
    return PocSpec(n=n, count=count, entry_bound=bound, generator=generator)


def derive_seed(block_hash: bytes, worker_address: str, task_id: uuid.UUID) -> bytes:
    """The 32-byte seed of one assignment (encoding in the module docstring)."""
    if len(block_hash) != 32:
        raise PocError("block_hash", "must be 32 bytes.")
    return hashlib.sha256(block_hash + worker_address.encode("ascii") + task_id.bytes).digest()


def parse_seed_material(material: Mapping[str, Any]) -> SeedMaterial:
    """Decode ``{"block_hash", "worker_address", "task_id"}``; PocError names a bad field."""
    if not isinstance(material, Mapping):
        raise PocError("seed", "must be a JSON object with block_hash, worker_address and task_id.")
    block_hash = material.get("block_hash")
    if not isinstance(block_hash, str) or len(block_hash) != 64:
        raise PocError("block_hash", "must be 64 hexadecimal digits.")
    try:
        raw_hash = bytes.fromhex(block_hash)
    except ValueError:
        raise PocError("block_hash", "must be 64 hexadecimal digits.") from None
    address = material.get("worker_address")
    if (
        not isinstance(address, str)
        or not address
        or len(address) > MAX_ADDRESS_LENGTH
        or not address.isascii()
        or not address.isprintable()
    ):
        raise PocError(
            "worker_address", f"must be a printable ASCII address of at most {MAX_ADDRESS_LENGTH} characters."
        )
    task_id = material.get("task_id")
    parsed_id = task_id if isinstance(task_id, uuid.UUID) else _parse_uuid(task_id)
    return SeedMaterial(block_hash=raw_hash, worker_address=address, task_id=parsed_id)


def _parse_uuid(value: object) -> uuid.UUID:
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise PocError("task_id", "must be a UUID.")
