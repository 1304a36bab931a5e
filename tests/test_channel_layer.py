"""The embedded channel layer: a message sent by another process (the platform's Celery
worker, in `make run`) reaches a consumer group of the web process; nothing is spooled
while no web process relays; stale and malformed files are dropped."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from asgiref.sync import async_to_sync

from config.channel_layers import EmbeddedChannelLayer

ROOT = Path(__file__).resolve().parent.parent


def send_from_another_process(spool: Path, group: str, message: dict[str, object]) -> None:
    """What a Celery process does: async_to_sync(layer.group_send) with no consumer of its own."""
    code = textwrap.dedent(
        f"""
        from asgiref.sync import async_to_sync
        from config.channel_layers import EmbeddedChannelLayer
        layer = EmbeddedChannelLayer(spool={str(spool)!r})
        async_to_sync(layer.group_send)({group!r}, {message!r})
        """
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_a_message_from_another_process_reaches_the_web_processs_group(tmp_path: Path) -> None:
    async def scenario() -> dict[str, object]:
        web = EmbeddedChannelLayer(spool=str(tmp_path), poll_interval=0.02)
        channel = await web.new_channel()
        await web.group_add("task.42", channel)
        assert web.serving
        await asyncio.to_thread(
            send_from_another_process, tmp_path, "task.42", {"type": "task.status", "status": "completed"}
        )
        return await asyncio.wait_for(web.receive(channel), timeout=10)

    received = asyncio.run(scenario())
    assert received == {"type": "task.status", "status": "completed"}
    assert not list(tmp_path.glob("*.json"))  # delivered files are removed


def test_nothing_is_spooled_while_no_web_process_relays(tmp_path: Path) -> None:
    send_from_another_process(tmp_path, "task.42", {"type": "task.status"})
    assert not list(tmp_path.glob("*.json"))


def test_stale_and_malformed_files_are_dropped(tmp_path: Path) -> None:
    async def scenario() -> int:
        web = EmbeddedChannelLayer(spool=str(tmp_path), poll_interval=3600)
        channel = await web.new_channel()
        await web.group_add("g", channel)
        (tmp_path / "00000000000000000001-1-0.json").write_text(json.dumps({"group": "g", "message": {"type": "x"}}))
        (tmp_path / f"{10**19 + 1}-1-1.json").write_text("{not json")
        return await web.relay_pending()

    assert asyncio.run(scenario()) == 0
    assert not list(tmp_path.glob("*.json"))


def spool_name(written_ns: int, pid: int = 1, n: int = 0) -> str:
    return f"{written_ns:020d}-{pid}-{n}.json"


def test_a_file_still_being_written_is_left_to_its_writer(tmp_path: Path) -> None:
    """A writer's temporary file (``.<name>``, renamed when complete) must not be taken for
    a message: the relay would drop the half-written file and the writer's rename fail."""

    async def scenario() -> tuple[int, int, dict[str, object]]:
        web = EmbeddedChannelLayer(spool=str(tmp_path), poll_interval=3600)
        channel = await web.new_channel()
        await web.group_add("g", channel)
        name = spool_name(time.time_ns())
        temporary = tmp_path / f".{name}"
        temporary.write_text('{"group": "g", "mess')  # the writer is midway
        during = await web.relay_pending()
        temporary.write_text(json.dumps({"group": "g", "message": {"type": "task.status"}}))
        os.replace(temporary, tmp_path / name)  # the writer finishes
        after = await web.relay_pending()
        return during, after, await asyncio.wait_for(web.receive(channel), timeout=5)

    assert asyncio.run(scenario()) == (0, 1, {"type": "task.status"})
    assert not list(tmp_path.iterdir()) or [p.name for p in tmp_path.iterdir()] == [f"relay.{os.getpid()}"]


def test_a_writers_leftover_temporary_file_is_removed_once_stale(tmp_path: Path) -> None:
    """A writer that died between writing and renaming leaves its temporary file: it goes
    once it is clearly abandoned, so the directory does not grow forever."""

    async def scenario() -> None:
        web = EmbeddedChannelLayer(spool=str(tmp_path), poll_interval=3600)
        await web.group_add("g", await web.new_channel())
        fresh, stale = tmp_path / f".{spool_name(time.time_ns(), n=1)}", tmp_path / f".{spool_name(1, n=2)}"
        fresh.write_text("{")
        stale.write_text("{")
        old = time.time() - 3600
        os.utime(stale, (old, old))
        assert await web.relay_pending() == 0
        assert fresh.exists()
        assert not stale.exists()

    asyncio.run(scenario())


def test_corrupt_spool_files_reach_no_consumer_and_do_not_hold_back_the_rest(tmp_path: Path) -> None:
    """Only well-formed group messages are relayed: one with no type (or a socket's own
    ``websocket.*`` type) would crash every consumer of the group, closing them with 1011."""

    async def scenario() -> tuple[int, list[dict[str, object]]]:
        web = EmbeddedChannelLayer(spool=str(tmp_path), poll_interval=3600)
        channel = await web.new_channel()
        await web.group_add("g", channel)
        now = time.time_ns()
        bad: list[object] = [
            {"group": "g", "message": {"status": "no type"}},
            {"group": "g", "message": {"type": 5}},
            {"group": "g", "message": {"type": "websocket.disconnect", "code": 1000}},
            {"group": "g", "message": ["not", "a", "dict"]},
            {"group": "no spaces allowed", "message": {"type": "task.status"}},
            {"group": ["g"], "message": {"type": "task.status"}},
            ["not", "an", "envelope"],
        ]
        for n, envelope in enumerate(bad):
            (tmp_path / spool_name(now, n=n)).write_text(json.dumps(envelope))
        (tmp_path / "not-a-time.json").write_text(json.dumps({"group": "g", "message": {"type": "task.status"}}))
        (tmp_path / spool_name(now + 1)).write_text(json.dumps({"group": "g", "message": {"type": "task.status"}}))
        delivered = await web.relay_pending()
        received = []
        while True:
            try:
                received.append(await asyncio.wait_for(web.receive(channel), timeout=0.2))
            except TimeoutError:
                return delivered, received

    assert asyncio.run(scenario()) == (1, [{"type": "task.status"}])
    assert not list(tmp_path.glob("*.json"))


def test_a_corrupt_relay_marker_does_not_break_sending(tmp_path: Path) -> None:
    """A marker whose name is not a process id is not a relay: a sender skips it."""
    (tmp_path / "relay.not-a-pid").touch()
    layer = EmbeddedChannelLayer(spool=str(tmp_path))
    async_to_sync(layer.group_send)("g", {"type": "task.status"})
    assert not list(tmp_path.glob("*.json"))
    (tmp_path / f"relay.{os.getppid()}").touch()  # a live process that relays
    async_to_sync(layer.group_send)("g", {"type": "task.status"})
    assert len(list(tmp_path.glob("*.json"))) == 1
