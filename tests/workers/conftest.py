"""Fixtures the node-agent tests share: a fresh key file, and the stand-in platform
served on 127.0.0.1 (a test module with a platform of its own defines its own fixture)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
