"""Whether ``training.asl.source.Source`` reads a sharded ISLR folder yet (the asl-cache work
of issue 27 §1): the tests that train or verify on the platform's sharded split need it.

Once both halves of §1 are merged the probe is always true; then delete this module and
the ``needs_shard_reading`` marks, so a regression fails instead of skipping.
"""

from __future__ import annotations

import tempfile
import zipfile
from functools import cache
from pathlib import Path

import pytest

from training.asl.parquet import DatasetError
from training.asl.source import INDEX_FILE, SIGN_MAP_FILE, Source


@cache
def source_reads_shards() -> bool:
    """Whether Source finds a sequence file inside a folder's ``shard-00000.zip``."""
    with tempfile.TemporaryDirectory(prefix="shard-probe-") as tmp:
        folder = Path(tmp)
        (folder / INDEX_FILE).write_text("path,participant_id,sequence_id,sign\na/1.parquet,1,1,x\n")
        (folder / SIGN_MAP_FILE).write_text('{"x": 0}')
        with zipfile.ZipFile(folder / "shard-00000.zip", "w") as shard:
            shard.writestr("a/1.parquet", b"probe")
        try:
            with Source(folder) as source:
                return source.exists("a/1.parquet") and source.read("a/1.parquet") == b"probe"
        except DatasetError:
            return False


needs_shard_reading = pytest.mark.skipif(
    not source_reads_shards(), reason="training.asl.source.Source does not read sharded folders yet (asl-cache)"
)
