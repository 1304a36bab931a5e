"""The embedded channel layer: a message sent by another process (the platform's Celery
worker, in `make run`) reaches a consumer group of the web process; nothing is spooled
while no web process relays; stale and malformed files are dropped."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

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
