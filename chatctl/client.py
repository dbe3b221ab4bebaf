"""A reference Python client: reconnects with backoff and jitter, resumes with
``since``, drops repeats by id. The tests and the load generator use it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import orjson
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus


class Inbox:
    """What one client has received: ids in arrival order, repeats counted, not kept."""

    def __init__(self, since: str | None = None):
        self.since = since
        self.ids: list[int] = []
        self.seen: set[int] = set()
        self.duplicates = 0
        self.hellos: list[dict] = []

    def accept(self, frame: dict) -> bool:
        if frame.get("type") == "hello":
            self.hellos.append(frame)
            # Keep our own resume point while catch-up frames are still to come;
            # take the server's only when we had none, or ours could not be served
            # (then the app reloads history from the API).
            if self.since is None or not frame["recovered"]:
                self.since = frame["cursor"]
            return False
        msg_id = int(frame["id"])
        if msg_id in self.seen:
            self.duplicates += 1
            return False
        self.seen.add(msg_id)
        self.ids.append(msg_id)
        # A frame's cursor, where the map is partitioned, says where it was made;
        # a bare id resumes only for a user whose slot never moved.
        self.since = frame.get("cursor") or frame["id"]
        return True


async def listen(base_url: str, token: str, since: str | None, on_message: Callable[[dict], None],
                 count: int | None = None, max_backoff: float = 5.0, inbox: Inbox | None = None) -> Inbox:
    """Receives until ``count`` messages (or forever); ``inbox`` lets the caller watch progress."""
    inbox = inbox or Inbox(since)
    attempt = 0
    while count is None or len(inbox.ids) < count:
        query = f"token={token}" + (f"&since={inbox.since}" if inbox.since else "")
        try:
            async with websockets.connect(f"{base_url}/v1/ws?{query}", max_size=2**20) as ws:
                attempt = 0
                async for raw in ws:
                    frame = orjson.loads(raw)
                    if inbox.accept(frame):
                        on_message(frame)
                        if count is not None and len(inbox.ids) >= count:
                            return inbox
        except (OSError, ConnectionClosed, InvalidStatus, TimeoutError):
            pass
        attempt += 1
        await asyncio.sleep(min(max_backoff, 0.05 * 2 ** attempt) * random.uniform(0.5, 1))
    return inbox
