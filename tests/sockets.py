"""How a test opens a socket that the server may refuse."""

from __future__ import annotations

from channels.testing import WebsocketCommunicator


async def open_or_refused(socket: WebsocketCommunicator) -> tuple[bool, int | None]:
    """(True, None) for a socket accepted and left open; (False, code) for one refused.

    A refusal must be an accept followed at once by a close with its code: a refused
    handshake reaches a browser as 1006 only, and its page cannot tell "signed out" from
    "server down" (it would keep reconnecting). An open socket is left open."""
    connected, code = await socket.connect()
    assert connected, f"refused at the handshake ({code}): a browser would see only 1006"
    if await socket.receive_nothing(timeout=0.1):
        return True, None
    message = await socket.receive_output(timeout=5)
    assert message["type"] == "websocket.close", message
    return False, message.get("code")
