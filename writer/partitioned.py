"""One ``MessageWriter`` per partition, side by side in one process.

Each partition is a cell (chat.partitions): its own lock, sequence, tables and
collection, so its writer takes turns only against the writers of the same
partition on other hosts, never against another partition's. A draft goes to
its sender's partition (``writer.copies.home_of``, on the slot map read when
the process started); the copies its commit owes are handed at once to the
writers of the recipients' partitions, in this process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pymongo.asynchronous.database import AsyncDatabase
from sqlalchemy.engine import Engine

from chat.drafts import Draft
from chat.messages import Message
from chat.partitions import SlotMap
from chat.settings import Settings
from writer.copies import Copy, home_of
from writer.message_writer import MessageWriter

# Makes the writer of one partition: (partition, hand_over) -> MessageWriter.
WriterFactory = Callable[[int, Callable[[int, Copy], None]], MessageWriter]


class PartitionedWriter:
    def __init__(self, slot_map: SlotMap, make: WriterFactory):
        self.slot_map = slot_map
        self.writers = [make(k, self._hand_over) for k in range(slot_map.partitions)]

    def writer_of(self, draft: Draft) -> MessageWriter:
        return self.writers[home_of(draft.sender, self.slot_map)]

    async def submit(self, draft: Draft) -> tuple[Message, bool]:
        """Stores one message in its sender's partition; returns (message, created) as ``MessageWriter.submit``."""
        return await self.enqueue(draft)

    def enqueue(self, draft: Draft) -> asyncio.Future:
        return self.writer_of(draft).enqueue(draft)

    def _hand_over(self, partition: int, copy: Copy) -> None:
        self.writers[partition].offer_copy(copy)

    async def run(self, repair_every: float = 1.0) -> None:
        """Every partition's writer, until cancelled. One that fails ends them all,
        and its error (the first, if several) is this one's, as a writer's own would be."""
        try:
            async with asyncio.TaskGroup() as writers:
                for k, w in enumerate(self.writers):
                    writers.create_task(w.run(repair_every), name=f"writer_p{k}")
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def build(settings: Settings, engine: Engine, mongo_db: AsyncDatabase, slot_map: SlotMap,
          on_stored: Callable[[], None] = lambda: None) -> PartitionedWriter:
    """The writers of every partition of ``slot_map``, with the settings' limits and the writer's metrics.
    ``on_stored``: after each batch stored in the fast store (``oplog.wake``)."""
    # Imported here: registering the writer's metrics makes a process export
    # them, and only a process that writes has any.
    from writer import metrics

    def make(partition: int, hand_over: Callable[[int, Copy], None]) -> MessageWriter:
        return MessageWriter(engine, mongo_db, batch_max=settings.writer.batch_max,
                             window_ms=settings.writer.batch_window_ms,
                             queue_max=settings.writer.queue_max, timeout_seconds=settings.stores.db_timeout_seconds,
                             retention_seconds=settings.stores.retention_seconds, observe_batch=metrics.observe_batch,
                             observe_mongo_lag=metrics.MONGO_LAG.observe,
                             observe_outbox=metrics.outbox_observer(partition),
                             observe_copies=metrics.copies_observer(partition),
                             observe_strays=metrics.strays_observer(partition),
                             partition=partition, slot_map=slot_map, hand_over=hand_over,
                             edit_window_seconds=settings.writer.edit_window_seconds, on_stored=on_stored)

    return PartitionedWriter(slot_map, make)


def engine_pool_size(slot_map: SlotMap) -> int:
    """Connections the writers' engine keeps: one per partition's turn, and one to
    check a failed COMMIT on (``Turn._settle``); bursts use the overflow."""
    return slot_map.partitions + 1
