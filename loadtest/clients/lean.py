"""A WebSocket client for load generation, small enough that one process
holds 15,000 of them (a full ``websockets`` client costs tens of KB each).

It speaks just what a chat client needs: the handshake, text frames in
(through ``chatctl.client.Inbox``, the reference client's dedup and resume
bookkeeping), pongs out. The handshake and the frame parser are those every
load client here shares (``loadtest.clients.websocket``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

import orjson
from websockets.frames import Frame, Opcode

from chatctl.client import Inbox
from loadtest.clients.websocket import Fragments, Handshake, split_messages, upgrade_request


class LeanClient(asyncio.Protocol):
    __slots__ = ("inbox", "on_frame", "transport", "handshake", "buf", "partial", "opened", "closed_code", "lost")
    transport: asyncio.Transport  # set by connection_made, which asyncio calls before anything else

    def __init__(self, inbox: Inbox, on_frame: Callable[[dict, float], None]):
        self.inbox = inbox
        self.on_frame = on_frame
        self.handshake = Handshake()
        self.buf = b""  # an unfinished frame
        self.partial: Fragments | None = None
        self.opened = asyncio.get_running_loop().create_future()  # the hello frame, or the refusal status
        self.closed_code: int | None = None
        self.lost = asyncio.get_running_loop().create_future()  # done once the connection is gone

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream socket's: it reads and writes

    def data_received(self, data: bytes) -> None:
        if self.handshake.status != 101:
            data = self.handshake.read(data)
            if self.handshake.refused:
                self._settle(self.handshake.status)
                self.transport.close()
        if not data:
            return
        now = time.time()
        frames, self.buf, self.partial = split_messages(self.buf + data if self.buf else data, self.partial)
        for opcode, payload in frames:
            if opcode == Opcode.TEXT:
                doc = orjson.loads(payload)
                if doc.get("type") == "hello":
                    self.inbox.accept(doc)
                    self._settle(doc)
                elif self.inbox.accept(doc):
                    self.on_frame(doc, now)
            elif opcode == Opcode.PING:
                self.transport.write(Frame(Opcode.PONG, payload).serialize(mask=True))
            elif opcode == Opcode.CLOSE:
                self.closed_code = int.from_bytes(payload[:2], "big") if payload else 1005
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._settle(0)
        if not self.lost.done():
            self.lost.set_result(None)

    def _settle(self, result: dict | int) -> None:
        if not self.opened.done():
            self.opened.set_result(result)


class HandshakeRefused(ConnectionError):
    """The server answered the upgrade with ``status`` (a 421: the user's partition is another)."""

    def __init__(self, status: int):
        super().__init__(f"handshake refused: {status}")
        self.status = status


async def connect(host: str, port: int, token: str, inbox: Inbox, on_frame: Callable[[dict, float], None],
                  source: str | None = None, timeout: float = 30, query: str = "") -> LeanClient:
    """Opens /v1/ws and waits for the hello; raises ``HandshakeRefused`` with the status if refused.
    ``query``: more parameters for the handshake's query string (``partition=2``)."""
    loop = asyncio.get_running_loop()
    query = "&".join(part for part in (f"since={inbox.since}" if inbox.since else "", query) if part)
    _, client = await loop.create_connection(lambda: LeanClient(inbox, on_frame), host, port,
                                             local_addr=(source, 0) if source else None)
    # The token in a header, as the daemons require by default: a URL lands in proxies' error logs.
    client.transport.write(upgrade_request(host, port, f"/v1/ws?{query}", f"Authorization: Bearer {token}\r\n"))
    try:
        result = await asyncio.wait_for(client.opened, timeout)
    except TimeoutError:
        client.transport.abort()
        raise ConnectionError("no hello") from None
    if not isinstance(result, dict):
        client.transport.abort()
        raise HandshakeRefused(result)
    return client
