"""Device, mixed-precision and seeding choices shared by every trainer.

One place decides what "mixed precision" means on the machine at hand: bf16 autocast, on
the CPU and on a GPU with native bf16 (no loss scaling needed: bf16 keeps fp32's exponent
range); full fp32 on a GPU without it. Never fp16: its gradients need a GradScaler, which
skips the optimizer step whenever the scaled gradients overflow, and a step the worker's
scaler skipped is one the platform's replay on the CPU takes (``training.replay``). An
honest segment would then land a whole step from its replay, as a segment with a skipped
step does.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch


def select_device(preferred: str | None = None) -> torch.device:
    """The device to train on: ``preferred`` when given, else CUDA when present, else CPU.

    Raises ValueError naming the device when a requested CUDA device is not available.
    """
    if preferred:
        device = torch.device(preferred)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"Device {preferred!r} was requested but CUDA is not available on this machine.")
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The reduced precision autocast uses on ``device``: bf16 on the CPU and on a GPU that
    computes in bf16 natively (Ampere and later); None (fp32) on an older GPU."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else None
    return torch.bfloat16


@contextlib.contextmanager
def autocast(device: torch.device, enabled: bool) -> Iterator[None]:
    """Autocast to ``autocast_dtype(device)`` when ``enabled``; a no-op otherwise."""
    dtype = autocast_dtype(device) if enabled else None
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def pin_memory(device: torch.device) -> bool:
    """Whether DataLoaders should pin host memory (only pays off for host→GPU copies)."""
    return device.type == "cuda"


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) so a run replays exactly."""
    seed = int(seed) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_HOLD_BYTES = 256 * 1024**2
_allocator_tuned = False


def keep_freed_memory() -> bool:
    """Let glibc keep freed blocks up to 256 MiB for reuse instead of unmapping them.

    A CPU training step allocates and frees the same large activation tensors every step;
    by default glibc hands each one back to the kernel and faults it in again next step,
    a few milliseconds per step on a small lattice (what jemalloc or tcmalloc, which
    PyTorch's CPU guides recommend, avoid). Once per process; a no-op off glibc.
    Returns whether the setting took effect.
    """
    global _allocator_tuned
    if _allocator_tuned:
        return True
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    _allocator_tuned = bool(mallopt(_M_MMAP_THRESHOLD, _HOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _HOLD_BYTES))
    return _allocator_tuned
