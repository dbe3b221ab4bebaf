"""One ``MessageWriter`` per partition, side by side in one process.

Each partition is a cell (chat.partitions): its own lock, sequence, tables and
collection, so its writer takes turns only against the writers of the same
partition on other hosts, never against another partition's. A draft goes to
its sender's partition (``writer.copies.home_of``); the copies its commit
owes are handed at once to the writers of the recipients' partitions, in
this process.

The map is the one a ``LiveMap`` holds now: any of the writers' turns that
reads a newer one in MySQL (a move's cutover, written under the locks of
the partitions it changes) adopts it for all of them. A request routed by
the map before goes on to the writer of its sender's new partition, and a
partition the new map adds gets its writer here at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pymongo.asynchronous.database import AsyncDatabase
from sqlalchemy.engine import Engine

from chat.drafts import Draft
from chat.messages import Message
from chat.partitions import MAX_PARTITIONS, LiveMap, SlotMap
from chat.settings import Settings
from writer.batch import Pending
from writer.copies import Copy, home_of
from writer.core import timing_of
from writer.message_writer import MessageWriter

# How often the writer of a partition led by another host takes an idle turn (writer.echo_watch).
NOT_LED_IDLE_TURN_SECONDS = 5.0

# Makes the writer of one partition: (partition, live map, hand_over, reroute, adopted) -> MessageWriter.
WriterFactory = Callable[[int, LiveMap, Callable[[int, Copy], None], Callable[[Pending], None],
                          Callable[[SlotMap], None]], MessageWriter]


class PartitionedWriter:
    """``led``: the partitions this host leads (``CHAT_WRITER_LEADS``), whose copies its
    writers make; None: all of them, with no leader elsewhere. ``echoes_owed(partition)``:
    a commit here left echoes for a partition another host leads (``writer.echo_wake``)."""

    def __init__(self, slot_map: SlotMap, make: WriterFactory, led: frozenset[int] | None = None,
                 echoes_owed: Callable[[int], None] = lambda partition: None):
        self.live = LiveMap(slot_map)
        self._led = led
        self._echoes_owed = echoes_owed
        self._make = make
        self.writers: list[MessageWriter] = []
        self._running: asyncio.TaskGroup | None = None
        self._repair_every = 1.0
        self._adopted(slot_map)

    @property
    def slot_map(self) -> SlotMap:
        return self.live.current

    def writer_of(self, draft: Draft) -> MessageWriter:
        return self.writers[home_of(draft.sender, self.live.current)]

    def adopt(self, slot_map: SlotMap) -> None:
        """A newer map read elsewhere in the process (the API's watch)."""
        if self.live.adopt(slot_map):
            self._adopted(slot_map)

    def _adopted(self, slot_map: SlotMap) -> None:
        """A writer for each partition the map has and this process lacks, running at once if the others are."""
        for k in range(len(self.writers), slot_map.partitions):
            writer = self._make(k, self.live, self._hand_over, self._reroute, self._adopted)
            self.writers.append(writer)
            if self._running is not None:
                self._running.create_task(writer.run(self._idle_turn_every(k)), name=f"writer_p{k}")

    def _reroute(self, pending: Pending) -> None:
        self.writer_of(pending.draft).take_over(pending)  # type: ignore[arg-type]  # a Draft: copies never reroute

    async def submit(self, draft: Draft) -> tuple[Message, bool]:
        """Stores one message in its sender's partition; returns (message, created) as ``MessageWriter.submit``."""
        return await self.enqueue(draft)

    def enqueue(self, draft: Draft) -> asyncio.Future:
        return self.writer_of(draft).enqueue(draft)

    def _hand_over(self, partition: int, copy: Copy) -> None:
        # Else its echo row waits: for that partition's leader, which watches it, or for a turn's drain.
        if partition < len(self.writers) and (self._led is None or partition in self._led):
            self.writers[partition].offer_copy(copy)
        elif self._led is not None:
            self._echoes_owed(partition)

    def echoes_woken(self, partitions: list[int]) -> None:
        """Another host's commit left echoes for ``partitions``: the watches of those led here read them now."""
        for k in partitions:
            if k < len(self.writers) and self._led is not None and k in self._led:
                self.writers[k].wake_echo_watch()

    async def run(self, repair_every: float = 1.0) -> None:
        """Every partition's writer, until cancelled. One that fails ends them all,
        and its error (the first, if several) is this one's, as a writer's own would be."""
        self._repair_every = repair_every
        try:
            async with asyncio.TaskGroup() as writers:
                self._running = writers
                for k, w in enumerate(self.writers):
                    writers.create_task(w.run(self._idle_turn_every(k)), name=f"writer_p{k}")
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None
        finally:
            self._running = None

    def _idle_turn_every(self, partition: int) -> float:
        return idle_turn_every(partition, self._led, self._repair_every)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def idle_turn_every(partition: int, led: frozenset[int] | None, repair_every: float) -> float:
    """How long partition ``partition``'s writer waits idle before a turn that repairs and
    drains, on a host that leads ``led`` (None: every partition). A writer of a partition
    another host leads is idle nearly always (its requests go to the leader), and each of its
    idle turns stopped the leader's turn for two hand-overs of the lock; it is there for when
    the leader is away, and then the backups' turns, which its POSTs reach, drain too."""
    if led is None or partition in led:
        return repair_every
    return max(repair_every, NOT_LED_IDLE_TURN_SECONDS)


def build(settings: Settings, engine: Engine, mongo_db: AsyncDatabase, slot_map: SlotMap,
          on_stored: Callable[[], None] = lambda: None,
          echoes_owed: Callable[[int], None] = lambda partition: None) -> PartitionedWriter:
    """The writers of every partition of ``slot_map``, with the settings' limits and the writer's metrics.
    ``on_stored``: after each batch stored in the fast store (``oplog.wake``); ``echoes_owed``: after a
    commit that left echoes for a partition another host leads (``writer.echo_wake``)."""
    # Imported here: registering the writer's metrics makes a process export
    # them, and only a process that writes has any.
    from writer import metrics

    def make(partition: int, live: LiveMap, hand_over: Callable[[int, Copy], None],
             reroute: Callable[[Pending], None], adopted: Callable[[SlotMap], None]) -> MessageWriter:
        leads = led is not None and partition in led
        return MessageWriter(engine, mongo_db, batch_max=settings.writer.batch_max,
                             window_ms=settings.writer.batch_window_ms,
                             queue_max=settings.writer.queue_max, timeout_seconds=settings.stores.db_timeout_seconds,
                             retention_seconds=settings.stores.retention_seconds, observe_batch=metrics.observe_batch,
                             observe_turn=metrics.observe_turn,
                             observe_mongo_lag=metrics.MONGO_LAG.observe, observe_insert=metrics.MONGO_INSERT.observe,
                             observe_outbox=metrics.outbox_observer(partition),
                             observe_copies=metrics.copies_observer(partition),
                             observe_strays=metrics.strays_observer(partition),
                             partition=partition, slot_map=live, hand_over=hand_over, reroute=reroute,
                             adopted=adopted, edit_window_seconds=settings.writer.edit_window_seconds,
                             on_stored=on_stored, timing=timing_of(leads),
                             watch_echoes_every=settings.echo_watch_seconds() if leads else None)

    led = settings.writer.led()
    return PartitionedWriter(slot_map, make, led, echoes_owed)


def engine_pool_size(slot_map: SlotMap) -> int:
    """Connections the writers' engine may keep: one per partition's turn and one per
    led partition's echo watch, and one to check a failed COMMIT on (``Turn._settle``),
    for as many partitions as a map can have: a move may add partitions while the
    process runs. A pool opens a connection only when one is needed, so the unused ones cost nothing."""
    return 2 * MAX_PARTITIONS + 1
