"""The writer's MongoDB steps: an insert under the writer's deadline, meta.head, the outbox repair.

``MongoSteps`` is the half of ``MessageWriter`` that speaks to the fast store,
always the collection of the writer's partition (``collection_name``), as
``writer.mysql_steps`` is the half that speaks SQL.
"""

from __future__ import annotations

import asyncio
import logging
import time

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, PyMongoError

from db import mongo
from writer.core import WriterCore
from writer.outbox_watch import OutboxWatch

log = logging.getLogger("chat.writer")


class MongoSteps:
    _mongo: AsyncDatabase
    _collection: str
    _partition: int
    _timeout: float
    _retention: int
    _core: WriterCore
    _outbox: OutboxWatch
    _head_task: asyncio.Task | None

    async def _within_timeout(self, operation):
        """A Mongo operation, waited for at most the writer's timeout. On time-out
        it is cancelled but not waited for: a cancelled driver call may clean up
        with more I/O to the server that hung (asyncio.wait_for waits for that,
        and CI measured 2-3 s), and the writer holds the lock every API process
        shares. What the cancelled call did or did not write is the outbox's to
        find out."""
        task = asyncio.ensure_future(operation)
        done, _ = await asyncio.wait({task}, timeout=self._timeout)
        if not done:
            task.cancel()
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning
            raise TimeoutError
        return task.result()

    async def _insert(self, docs: list[dict], ordered: bool = True) -> bool:
        """One insert_many under the writer's deadline. ``ordered=False`` (the
        outbox repair): every document is tried, and one refused only for a
        duplicate _id counts as stored, since ids are the writer's alone. Its
        documents may then become visible out of id order; a daemon reads such
        a hole back from MySQL, where all of them are committed."""
        try:
            await self._within_timeout(self._mongo[self._collection].insert_many(docs, ordered=ordered))
            return True
        except BulkWriteError as exc:
            if not ordered and mongo.only_duplicates(exc):
                return True
            return self._insert_failed(exc, docs)
        except (PyMongoError, TimeoutError) as exc:
            return self._insert_failed(exc, docs)

    def _insert_failed(self, exc: Exception, docs: list[dict]) -> bool:
        log.warning("event=mongo_write_failed error=%s outbox_from=%d outbox_to=%d",
                    exc.__class__.__name__, docs[0]["_id"], docs[-1]["_id"])
        self._core.mongo_failed(time.monotonic())
        self._outbox.seen(max(self._outbox.size, len(docs)), docs[0]["created_at"])  # the oldest unsent
        return False

    def _hint_head(self, upto: int) -> None:
        """Moves meta.head in the background (commits go on meanwhile), one write at a time."""
        if self._core.head_due(upto, time.monotonic()) and (self._head_task is None or self._head_task.done()):
            self._head_task = asyncio.create_task(self._advance_head(upto))

    async def _advance_head(self, upto: int) -> None:
        try:
            await self._within_timeout(mongo.advance_head(self._mongo, upto, self._partition))
            self._core.head_moved(upto, time.monotonic())
        except (PyMongoError, TimeoutError):
            # only a hint for the daemons' gap check; a later turn writes it again
            self._core.head_failed(time.monotonic())
