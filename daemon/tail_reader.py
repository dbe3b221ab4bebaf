"""The reader of a partition's oplog, and the bounded inbox it fills for the
stream's consumer (``daemon.stream_consumer``).

The reader keeps the oplog cursor moving while the consumer keeps up (a tail
that pauses falls off a small oplog); past the inbox's bound it waits for the
consumer instead of shedding batches to be read back from MySQL
(docs/decisions/overload-slows-down.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from daemon import metrics
from oplog.events import Batch, OplogSource, Restarted, Subscribed
from relay.routing import passed_count

log = logging.getLogger("chat.stream")

# Oplog entries waiting for the consumer; past it the reader waits. Some
# 20 s at 1,000 msg/s: a burst that fits is delivered late but from the
# oplog, with no read of the truth, and the entries held stay a few MB.
TAIL_QUEUE_MAX = 20_000


@dataclass(frozen=True, slots=True)
class FillRequest:
    """In the consumer's inbox, among the oplog batches: "read the truth now"."""


Item = Batch | Subscribed | FillRequest


def _size(item: Batch | Subscribed) -> int:
    """What an item counts for in the inbox's bound: a batch's entries and ids passed over, a marker one."""
    if isinstance(item, Batch):
        return len(item.entries) + passed_count(item.passed) or 1
    return 1


class ConsumerInbox:
    """Oplog batches for the consumer, each with the time it arrived, and among
    them at most one ``FillRequest`` (requests coalesce until the consumer
    takes one). Bounded by entries, not batches: past ``max_entries`` a batch
    waits (``put``) until the consumer has taken half of them."""

    def __init__(self) -> None:
        self.max_entries = TAIL_QUEUE_MAX  # read here, not at import: tests make it small
        # Every batch holds an entry at least, and ``put`` keeps the batches
        # queued to ``max_entries`` at the most: the queue's own bound is that,
        # with one more for the fill request, which is never made to wait.
        self._items: asyncio.Queue[tuple[Item, float]] = asyncio.Queue(self.max_entries + 1)
        self._entries = 0
        self._room = asyncio.Event()  # set while the reader may queue more
        self._room.set()
        self._fill_requested = False

    async def put(self, batch: Batch | Subscribed) -> None:
        """Queues ``batch`` (or a relay's marker, in its place in the stream);
        while the consumer is ``max_entries`` behind, first waits for it."""
        size = _size(batch)
        if self._entries and self._entries + size > self.max_entries:
            # Overload slows the tail down rather than shedding: while the consumer is this
            # far behind, the oplog is not read. Through the relay the batches wait in its
            # buffer for this daemon (32 MB), and a burst that fits is delivered late, with
            # no read of the truth; past that the relay cuts us off, and what we then miss
            # is a hole, read back from MySQL. A paused tail of a small oplog falls off it,
            # with the same outcome. Through a ``Fanout`` the shared source waits too.
            metrics.TAIL_BACKPRESSURE.inc()
            log.warning("event=tail_backpressure queued=%d action=wait_for_consumer", self._entries)
            self._room.clear()
            await self._room.wait()
        self._entries += size
        await self._items.put((batch, time.perf_counter()))

    def request_fill(self) -> None:
        """Asks the consumer for one read of the truth; requests coalesce until it takes one."""
        if not self._fill_requested:
            self._fill_requested = True
            self._items.put_nowait((FillRequest(), 0.0))

    @property
    def entries(self) -> int:
        """The oplog entries queued now."""
        return self._entries

    def empty(self) -> bool:
        return self._items.empty()

    async def get(self) -> tuple[Item, float]:
        return self._taken(await self._items.get())

    def get_nowait(self) -> tuple[Item, float]:
        return self._taken(self._items.get_nowait())

    def _taken(self, taken: tuple[Item, float]) -> tuple[Item, float]:
        item = taken[0]
        if isinstance(item, FillRequest):
            self._fill_requested = False
        else:
            self._entries -= _size(item)
            if self._entries <= self.max_entries // 2:
                self._room.set()  # the reader takes the oplog again once half the inbox is free
        return taken


class TailReader:
    """Reads a partition's oplog source into its inbox, for the life of the stream."""

    def __init__(self, source: OplogSource, inbox: ConsumerInbox):
        self._source = source
        self._inbox = inbox

    async def run(self) -> None:
        async for event in self._source.batches():
            if isinstance(event, Restarted):
                # Nothing to do: ids are gap-free, so whatever a re-opened or
                # fallen-off tail missed shows up as a hole (or in the gap
                # check) and is read back then, and only then.
                continue
            await self._inbox.put(event)  # a batch, or a relay's marker in its place among them
