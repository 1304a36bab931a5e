"""Device, mixed-precision and seeding choices shared by every trainer.

One place decides what "mixed precision" means on the machine at hand: bf16 autocast on
CPU (no loss scaling needed, bf16 keeps fp32's exponent range), fp16 autocast with a
GradScaler on CUDA (fp16 gradients underflow without scaling).
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


def autocast_dtype(device: torch.device) -> torch.dtype:
    """The reduced precision used under autocast on ``device``."""
    return torch.float16 if device.type == "cuda" else torch.bfloat16


@contextlib.contextmanager
def autocast(device: torch.device, enabled: bool) -> Iterator[None]:
    """Autocast to bf16 (CPU) or fp16 (CUDA) when ``enabled``; a no-op otherwise."""
    if not enabled:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=autocast_dtype(device)):
        yield


def make_grad_scaler(device: torch.device, enabled: bool) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16 on CUDA; None where no scaling is needed (CPU, or AMP off)."""
    if enabled and device.type == "cuda":
        return torch.amp.GradScaler("cuda")
    return None


def pin_memory(device: torch.device) -> bool:
    """Whether DataLoaders should pin host memory (only pays off for host→GPU copies)."""
    return device.type == "cuda"


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) so a run replays exactly."""
    seed = int(seed) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
