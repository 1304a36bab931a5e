"""The file names of a sharded ISLR dataset folder, which the platform's split writes, the
node downloads file by file and ``training.asl.source.Source`` reads (its ``SHARD_NAME``).

A sharded folder holds ``train.csv`` and ``sign_to_prediction_index_map.json`` at its root
and ``shard-00000.zip``, ``shard-00001.zip``, … each holding sequence files under the
relative paths train.csv names (no train.csv inside a shard).
"""

from __future__ import annotations

from training.asl.source import INDEX_FILE, SHARD_NAME, SIGN_MAP_FILE

__all__ = ["SHARD_NAME", "is_sharded_file", "shard_name"]


def shard_name(index: int) -> str:
    """The file name of a sharded folder's ``index``-th shard (from 0)."""
    return f"shard-{index:05d}.zip"


def is_sharded_file(name: str) -> bool:
    """Whether ``name`` may be a file of a sharded folder: a shard or one of the two index
    files; nothing else (no folders, no other names) is ever written into one."""
    return name in (INDEX_FILE, SIGN_MAP_FILE) or SHARD_NAME.fullmatch(name) is not None
