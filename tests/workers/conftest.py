"""Fixtures the node-agent tests share: a fresh key file, the stand-in platform served on
127.0.0.1 (a test module with a platform of its own defines its own fixture), and one torch
thread for the modules that train real runs in-process (``usefixtures("one_thread")``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.workers.processes import serving
from tests.workers.stub_platform import StubPlatform
from workers.agent.identity import init_key


@pytest.fixture
def platform() -> Iterator[StubPlatform]:
    server = StubPlatform()
    with serving(server):
        yield server


@pytest.fixture
def key_path(tmp_path: Path) -> Path:
    path = tmp_path / "worker.pem"
    init_key(path)
    return path


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch on one thread for the test: in-process training beside the suite's other
    processes, and the same arithmetic from run to run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
