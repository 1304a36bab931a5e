"""Training tests share two CPU cores with other work: keep torch to one thread and tiny sizes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=["avx512", "portable"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a PoC test on the AVX-512 kernels and again on the portable hashlib/numpy path."""
    from training.poc import kernels

    if request.param == "avx512":
        if not kernels.ENABLED:
            pytest.skip("this CPU has no AVX-512 (or the extension is not built): the portable path covers it")
    else:
        monkeypatch.setattr(kernels, "ENABLED", False)
        monkeypatch.setattr(kernels, "AES_ENABLED", False)
    return str(request.param)
