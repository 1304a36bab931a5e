"""The synthetic proof-of-compute kind: seeded integer matmuls, committed and verified.

A worker multiplies ``count`` pairs of n×n integer matrices A_p, B_p, generated from
sha256(block_hash ‖ worker_address ‖ task_id) (``spec``, ``generate``). The float32
product is exact, so C is bit-identical on every device. C goes into an int32
safetensors artifact and result_hash is the RFC 6962 Merkle root over its rows
(``commit``). The platform checks the root and runs Freivalds' check in exact arithmetic
with fresh random vectors: false acceptance ≤ 2^−60, O(n²) per pair instead of O(n³)
(``verifier``), on AVX-512 kernels where the CPU has them (``kernels``). Any row can be
opened with an audit path (``prove_row``, ``check_row``) and recomputed on its own
(``expected_row``).

numpy, torch and a small C extension; no Django.
"""

from training.poc.commit import (
    ARTIFACT_NAME,
    ArtifactProblem,
    RowProof,
    check_row,
    leaf_data,
    prove_row,
)
from training.poc.generate import generate_matrix, generate_rows
from training.poc.runner import InexactProductError, run
from training.poc.spec import (
    GENERATORS,
    Generator,
    PocError,
    PocSpec,
    SeedMaterial,
    derive_seed,
    parse_seed_material,
    parse_spec,
)
from training.poc.verifier import VerificationResult, expected_row, freivalds_bits, rounds_for, verify

__all__ = [
    "ARTIFACT_NAME",
    "GENERATORS",
    "ArtifactProblem",
    "Generator",
    "InexactProductError",
    "PocError",
    "PocSpec",
    "RowProof",
    "SeedMaterial",
    "VerificationResult",
    "check_row",
    "derive_seed",
    "expected_row",
    "freivalds_bits",
    "generate_matrix",
    "generate_rows",
    "leaf_data",
    "parse_seed_material",
    "parse_spec",
    "prove_row",
    "rounds_for",
    "run",
    "verify",
]
