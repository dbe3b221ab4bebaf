"""A daemon's oplog tail through the host's relay (relay/server.py).

An ``oplog.events.OplogSource``, as ``oplog.tail.OplogTail`` is, so the
stream cannot tell the two apart: ``batches()`` yields oplog batches in
order, and ``Restarted`` whenever entries may have been missed (the relay
could not resume us from its ring, its own tail re-opened, or we are
reconnecting). The stream needs
nothing more: ids are gap-free, so a missed entry shows up as a hole, or in
the gap check, and is read back from MySQL or the `messages` collection.

While the relay is away (a restart: about a second under supervisord), the
daemon reconnects every ``RECONNECT_CAP`` seconds at most, and its gap
check delivers what is stored meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from bson import Timestamp
from pymongo import AsyncMongoClient

from oplog.backoff import Backoff
from oplog.events import Batch, OplogEvent, Restarted
from oplog.tail import newest_ts
from relay.protocol import FRAME_MAX, BadFrame, frame, read_frame
from chat.stopping import reraise_if_cancelling

log = logging.getLogger("chat.relay")

RECONNECT_CAP = 1.0


class RelayTail:
    def __init__(self, client: AsyncMongoClient, namespace: str | tuple[str, ...], socket_path: str):
        """``namespace``: one, or the several a daemon's partitions have (the first is ``namespace``);
        the relay sends the entries of those only."""
        self._client = client
        self.namespaces = (namespace,) if isinstance(namespace, str) else tuple(namespace)
        self.namespace = self.namespaces[0]
        self._path = socket_path
        self.last_ts: Timestamp | None = None  # the last entry received: where a reconnect resumes

    async def newest_ts(self) -> Timestamp | None:
        return await newest_ts(self._client)

    async def batches(self) -> AsyncIterator[OplogEvent]:
        backoff = Backoff(base=0.05, cap=RECONNECT_CAP)
        codec = self._client.codec_options
        while True:
            writer = None
            try:
                reader, writer = await asyncio.open_unix_connection(self._path)
                writer.write(frame({"since": self.last_ts, "ns": list(self.namespaces)}))
                hello = await read_frame(reader, FRAME_MAX, codec)
                if hello is None:
                    raise ConnectionError("the relay closed before its hello")
                log.info("event=relay_connected resumed=%s", hello.get("resumed"))
                if not hello.get("resumed"):
                    yield Restarted()
                backoff.reset()
                while (message := await read_frame(reader, FRAME_MAX, codec)) is not None:
                    batch = message.get("b")
                    if batch:
                        # A batch of several namespaces comes as a frame each: resume after the newest.
                        last = batch[-1]["ts"]
                        self.last_ts = last if self.last_ts is None or last > self.last_ts else self.last_ts
                        yield Batch(batch)
                    elif message.get("restarted"):
                        yield Restarted()
                log.warning("event=relay_closed action=reconnect")
            except (OSError, BadFrame) as exc:  # ConnectionError is an OSError
                reraise_if_cancelling()
                log.warning("event=relay_unreachable error=%s detail=%s", exc.__class__.__name__, exc)
            finally:
                if writer is not None:
                    writer.close()
            await asyncio.sleep(backoff.next())
