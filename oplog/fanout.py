"""One oplog source shared by the streams of several partitions in one daemon.

A daemon that serves several partitions reads the oplog once (its own tail,
narrowed to its partitions' namespaces, or the relay's frames for them), not
once per partition: on FerretDB every tail re-reads the whole oplog. The
fanout splits each batch by namespace (``oplog.namespaces``) and hands each
partition's stream a source of its own (``FanoutView``, an
``oplog.events.OplogSource``), so a stream cannot tell it from a tail.

The shared source opens once every stream has started (each sets its view's
``last_ts`` to the oplog's newest entry when it reads its position), from
the oldest of those points: nothing a stream's start-up did not read is
skipped. A restart of the shared source is every stream's restart.

Each view's queue is bounded (``VIEW_QUEUE_MAX``): past it the fanout waits,
and so does the shared source, so that a stream's back-pressure reaches the
oplog and nothing is dropped. A partition's stream that falls further behind
than its own queue holds the other partitions up with it (tails of their own
would not); what waits then is held by the oplog, not by the daemon.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from bson import Timestamp

from oplog.events import Batch, OplogEvent, Restarted, Subscribed
from oplog.namespaces import split_by_namespace

# Batches waiting for a stream's reader. The reader moves each at once into
# its stream's own queue, bounded by entries (daemon/tail_reader.py): this one
# fills only while that one is full, so a few batches are room enough, and
# past them the fanout, and the shared source, wait.
VIEW_QUEUE_MAX = 4


class SharedSource(Protocol):
    """An oplog source of several namespaces (``OplogTail``, ``RelayTail``)."""

    namespaces: tuple[str, ...]
    last_ts: Timestamp | None

    async def newest_ts(self) -> Timestamp | None: ...

    def batches(self) -> AsyncIterator[OplogEvent]: ...


class FanoutView:
    """One namespace's share of a ``Fanout``: what its stream tails."""

    def __init__(self, fanout: Fanout, namespace: str):
        self._fanout = fanout
        self.namespace = namespace
        self.last_ts: Timestamp | None = None  # the stream's start sets it: where the shared source opens
        self.queue: asyncio.Queue[OplogEvent] = asyncio.Queue(VIEW_QUEUE_MAX)  # read here: tests make it small
        self.subscribed = False

    async def newest_ts(self) -> Timestamp | None:
        return await self._fanout.source.newest_ts()

    async def batches(self) -> AsyncIterator[OplogEvent]:
        self.subscribed = True
        self._fanout.view_subscribed()
        while True:
            event = await self.queue.get()
            if isinstance(event, Batch):
                self.last_ts = event.last_ts
            yield event


class Fanout:
    def __init__(self, source: SharedSource, namespaces: Sequence[str]):
        self.source = source
        self.views = {ns: FanoutView(self, ns) for ns in namespaces}
        self._all_subscribed = asyncio.Event()

    def view_subscribed(self) -> None:
        if all(view.subscribed for view in self.views.values()):
            self._all_subscribed.set()

    async def run(self) -> None:
        """Reads the shared source for the life of the daemon; raises what stops it."""
        await self._all_subscribed.wait()
        self.source.last_ts = start_point([view.last_ts for view in self.views.values()])
        views = self.views
        async for event in self.source.batches():
            # A full view makes the fanout wait, and the source with it: back-pressure, nothing dropped.
            if isinstance(event, Restarted):
                for view in views.values():
                    await view.queue.put(event)
                continue
            if isinstance(event, Subscribed):
                await views[event.namespace].queue.put(event)
                continue
            if event.namespace is not None:  # a relay's batch routed by user: one namespace's already
                if (own := views.get(event.namespace)) is not None:
                    await own.queue.put(event)
                continue
            for ns, entries in split_by_namespace(event.entries, views).items():
                await views[ns].queue.put(Batch(entries))
        raise RuntimeError("the shared oplog source ended")


def start_point(points: list[Timestamp | None]) -> Timestamp:
    """The oldest of the streams' start points; a stream that found the oplog
    empty (None) wants every entry, from the beginning."""
    if not points or any(p is None for p in points):
        return Timestamp(0, 0)
    return min(p for p in points if p is not None)
