"""The worker's side: generate A and B, multiply exactly, commit to C, write the artifact."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from training import stop
from training.device import keep_freed_memory, select_device
from training.poc.commit import ARTIFACT_NAME, ArtifactWriter, leaf_hash_array, result_hash
from training.poc.generate import generate_matrix
from training.poc.spec import FLOAT32_EXACT_LIMIT, PocSpec, parse_seed_material, parse_spec

Progress = Callable[[dict[str, Any]], None]


class InexactProductError(RuntimeError):
    """This device's float32 product disagreed with an exact check; nothing was submitted."""


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """Full IEEE float32 matmuls (no TF32, no bf16 passes) for the duration, then restore.

    The exactness argument assumes fp32 products and accumulation; a process-wide setting
    made for training elsewhere must not leak into the proof-of-compute kernel. Uses the
    per-backend ``fp32_precision`` switches (torch ≥ 2.9): mixing them with the legacy
    ``set_float32_matmul_precision`` makes torch refuse to report either.
    """
    backends: list[Any] = [torch.backends.cuda.matmul, torch.backends.mkldnn.matmul]  # type: ignore[attr-defined]
    saved = [getattr(backend, "fp32_precision", None) for backend in backends]
    if any(value is None for value in saved):  # pragma: no cover - torch < 2.9
        legacy = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(legacy)
        return
    for backend in backends:
        backend.fp32_precision = "ieee"
    try:
        yield
    finally:
        for backend, value in zip(backends, saved, strict=True):
            backend.fp32_precision = value


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(matrix: npt.NDArray[np.int8], device: torch.device) -> torch.Tensor:
    """An int8 host matrix as float32 on ``device`` (copied as int8: a quarter of the bytes)."""
    host = torch.from_numpy(matrix)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True).to(torch.float32)


def self_check(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, chunk: int = 1024) -> bool:
    """One Freivalds round on the device, in float64: does C·r equal A·(B·r)?

    r has entries in [0, 256): |B·r| ≤ 2^8·n·b and |A·(B·r)|, |C·r| < 2^8·n·2^24 ≤ 2^46 for
    n ≤ 2^14, all integers below 2^53, so float64 evaluates both sides exactly. It catches a
    device or library that silently lowered precision before the worker signs anything.
    """
    n = a.shape[0]
    r = torch.randint(0, 256, (n, 1), device=a.device, dtype=torch.float64)
    br = torch.cat([b[i : i + chunk].double() @ r for i in range(0, n, chunk)])
    left = torch.cat([a[i : i + chunk].double() @ br for i in range(0, n, chunk)])
    right = torch.cat([c[i : i + chunk].double() @ r for i in range(0, n, chunk)])
    return bool(torch.equal(left, right))


def warm_up(device: torch.device) -> None:
    """Run a small product once so library start-up (cuBLAS handles, kernels) is not timed."""
    x = torch.ones((256, 256), device=device)
    torch.matmul(x, x)
    _sync(device)


def multiply(a: torch.Tensor, b: torch.Tensor, spec: PocSpec) -> tuple[torch.Tensor, float]:
    """C = A·B in float32 and the seconds the product alone took (device synchronised)."""
    # Every partial sum is an integer of magnitude ≤ n·b² < 2^24: exact in float32.
    assert spec.n * spec.entry_bound**2 < FLOAT32_EXACT_LIMIT
    _sync(a.device)
    start = time.perf_counter()
    c = torch.matmul(a, b)
    _sync(a.device)
    return c, time.perf_counter() - start


def _to_host_int32(c: torch.Tensor) -> npt.NDArray[np.int32]:
    exact = c.to(torch.int32)
    if exact.device.type == "cuda":
        host = torch.empty(exact.shape, dtype=torch.int32, pin_memory=True)
        host.copy_(exact, non_blocking=True)
        torch.cuda.synchronize(exact.device)
        return host.numpy()
    return exact.numpy()


def run(
    spec: Mapping[str, Any],
    seed_material: Mapping[str, Any],
    out_dir: Path,
    device: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Compute the synthetic task: C_p = A_p·B_p for every pair, committed and written.

    Returns ``{"result_hash", "gflops", "seconds", "matmul_seconds", "generate_seconds",
    "artifact", "device", "n", "count"}``: ``gflops`` is 2n³·count over the time spent in the products alone,
    ``seconds`` the whole run, ``artifact`` the file name inside ``out_dir``. ``progress``
    gets ``{"event": "pair", "step", "total", "metrics": {"gflops", "seconds"}}`` after
    each pair. Raises PocError naming a bad spec or seed field, ValueError for an
    unavailable device, and InexactProductError if the device's product fails the check.
    """
    started = time.perf_counter()
    params = parse_spec(spec)
    seed = parse_seed_material(seed_material).seed
    dev = select_device(device)
    keep_freed_memory()  # generation and hashing allocate the same n² buffers per pair
    n, count, bound = params.n, params.count, params.entry_bound
    out_dir = Path(out_dir)
    leaves: list[npt.NDArray[np.uint8]] = []
    matmul_seconds = generate_seconds = 0.0
    metadata = {"n": str(n), "count": str(count), "entry_bound": str(bound), "generator": params.generator}
    with exact_float32(), ArtifactWriter(out_dir / ARTIFACT_NAME, n, count, metadata) as writer:
        warm_up(dev)
        for pair in range(count):
            stop.check()
            tick = time.perf_counter()
            a_host = generate_matrix(seed, "A", pair, n, bound, generator=params.generator)
            b_host = generate_matrix(seed, "B", pair, n, bound, generator=params.generator)
            generate_seconds += time.perf_counter() - tick
            a, b = to_device(a_host, dev), to_device(b_host, dev)
            del a_host, b_host
            c, seconds = multiply(a, b, params)
            matmul_seconds += seconds
            if not self_check(a, b, c):
                raise InexactProductError(
                    f"The float32 product on {dev} is not exact (pair {pair}); check for TF32 or reduced-precision overrides."
                )
            del a, b
            stop.check()
            host = _to_host_int32(c)
            del c
            leaves.append(leaf_hash_array(pair, host))
            writer.write(host)
            if progress is not None:
                flops = 2.0 * n**3
                progress(
                    {
                        "event": "pair",
                        "step": pair + 1,
                        "total": count,
                        "metrics": {"gflops": flops / max(seconds, 1e-9) / 1e9, "seconds": seconds},
                    }
                )
    total_flops = 2.0 * n**3 * count
    return {
        "result_hash": result_hash(np.concatenate(leaves)),
        "gflops": total_flops / max(matmul_seconds, 1e-9) / 1e9,
        "seconds": time.perf_counter() - started,
        "matmul_seconds": matmul_seconds,
        "generate_seconds": generate_seconds,
        "artifact": ARTIFACT_NAME,
        "device": str(dev),
        "n": n,
        "count": count,
    }
