"""The embedded broker's transport: a consumer never takes a message before it is
whole, and a file that cannot be read is skipped instead of stopping the worker."""

from __future__ import annotations

import os
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from kombu import Connection

from workers.agent import fsbroker


@pytest.fixture
def connection(tmp_path: Path) -> Any:
    options = {
        "data_folder_in": str(tmp_path),
        "data_folder_out": str(tmp_path),
        "control_folder": str(tmp_path / "control"),
        "store_processed": False,
    }
    with Connection("filesystem://", transport=fsbroker.Transport, transport_options=options) as conn:
        yield conn


def test_messages_round_trip_in_order(connection: Any) -> None:
    queue = connection.SimpleQueue("w.cpc1abc")
    for i in range(3):
        queue.put({"n": i})
    assert [queue.get(timeout=1).payload["n"] for _ in range(3)] == [0, 1, 2]
    queue.close()


def test_a_consumer_polling_mid_write_sees_no_message(connection: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The consumer polls at the worst moment: the bytes are on disk, not yet published.
    (Kombu's own transport hands over an empty file here, and the worker dies on it.)"""
    producer = connection.default_channel
    consumer = connection.channel()
    real_replace = os.replace
    seen: list[str] = []

    def replace(src: str, dst: str) -> None:
        try:
            consumer._get("platform")
            seen.append("a message")
        except Empty:
            seen.append("nothing")
        real_replace(src, dst)

    monkeypatch.setattr(fsbroker.os, "replace", replace)
    producer._put("platform", {"body": "x" * 100_000})
    assert seen == ["nothing"]
    assert consumer._get("platform") == {"body": "x" * 100_000}


def test_an_unreadable_message_file_is_skipped(connection: Any, tmp_path: Path, caplog: Any) -> None:
    channel = connection.default_channel
    # What the race used to leave, named to be taken before any message this transport writes.
    (tmp_path / "!_deadbeef.platform.msg").write_bytes(b"")
    channel._put("platform", {"ok": True})
    assert channel._get("platform") == {"ok": True}
    assert "skipped an unreadable message file on queue platform" in caplog.text
    with pytest.raises(Empty):
        channel._get("platform")
