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
check delivers what is stored meanwhile. It logs the first failed attempt
at once and then one line every ``UNREACHABLE_LOG_SECONDS`` at most, with
the count of attempts that failed since the line before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from bson import Timestamp
from pymongo import AsyncMongoClient

from oplog.backoff import Backoff
from oplog.events import Batch, OplogEvent, Restarted
from oplog.tail import newest_ts
from relay.protocol import FRAME_MAX, BadFrame, frame, read_frame
from chat.stopping import reraise_if_cancelling

log = logging.getLogger("chat.relay")

RECONNECT_CAP = 1.0
UNREACHABLE_LOG_SECONDS = 5.0


class RepeatedFailures:
    """When a failure that repeats is logged: the first at once, then at most
    one line every ``every`` seconds, standing for the failures since the line
    before. Holds no clock: the caller passes the time."""

    def __init__(self, every: float):
        self.every = every
        self.unlogged = 0  # failures since the last line
        self.quiet_until: float | None = None  # None: no failure since the last success

    def failed(self, now: float) -> int:
        """How many failures a line logged now stands for (this one included), or 0: stay quiet."""
        self.unlogged += 1
        if self.quiet_until is not None and now < self.quiet_until:
            return 0
        self.quiet_until = now + self.every
        count, self.unlogged = self.unlogged, 0
        return count

    def succeeded(self) -> int:
        """The failures that no line counted yet; the next failure is logged at once."""
        count, self.unlogged, self.quiet_until = self.unlogged, 0, None
        return count


class RelayTail:
    def __init__(self, client: AsyncMongoClient, namespace: str | tuple[str, ...], socket_path: str,
                 clock: Callable[[], float] = time.monotonic):
        """``namespace``: one, or the several a daemon's partitions have (the first is ``namespace``);
        the relay sends the entries of those only. ``clock`` paces the relay_unreachable lines."""
        self._client = client
        self._clock = clock
        self._failures = RepeatedFailures(UNREACHABLE_LOG_SECONDS)
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
                log.info("event=relay_connected resumed=%s unlogged_failures=%d", hello.get("resumed"),
                         self._failures.succeeded())
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
                failures = self._failures.failed(self._clock())
                if failures:
                    log.warning("event=relay_unreachable error=%s detail=%s failures=%d", exc.__class__.__name__,
                                exc, failures)
            finally:
                if writer is not None:
                    writer.close()
            await asyncio.sleep(backoff.next())
