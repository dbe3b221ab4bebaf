"""The writer's MongoDB steps: an insert under the writer's deadline (and what a duplicate _id means), meta.head.

``MongoSteps`` is the part of a ``MessageWriter`` that speaks to the fast
store, always the collection of the writer's partition (``collection_name``),
as ``writer.mysql_steps`` is the part that speaks SQL. It tells the core what
Mongo did (a failed insert, meta.head moved), and the outbox watch what the
fast store lacks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, PyMongoError

from chat.messages import REVISIONS
from chat.partitions import collection_name
from db import mongo
from writer.core import WriterCore
from writer.outbox_watch import OutboxWatch

log = logging.getLogger("chat.writer")


class MongoSteps:
    """The Mongo calls of one partition's writer, each waited for ``timeout_seconds`` at most.
    ``observe_strays``: documents not the writer's found at its ids, replaced. ``on_stored``:
    after each insert that stored its documents (the FerretDB tails' wake, ``oplog.wake``)."""

    def __init__(self, db: AsyncDatabase, *, partition: int, timeout_seconds: float, core: WriterCore,
                 outbox: OutboxWatch, observe_strays: Callable[[int], None] = lambda n: None,
                 on_stored: Callable[[], None] = lambda: None,
                 observe_insert: Callable[[float], None] = lambda seconds: None):
        self.db = db
        self._partition = partition
        self._collection = collection_name(partition)
        self._timeout = timeout_seconds
        self._core = core
        self._outbox = outbox
        self._observe_strays = observe_strays
        self._on_stored = on_stored
        self._observe_insert = observe_insert  # seconds of each insert answered
        self._head_task: asyncio.Task | None = None  # a meta.head write under way, in the background

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

    async def insert(self, docs: list[dict], ordered: bool = True) -> bool:
        """``_insert``, and the wake of the tails once it stored the documents."""
        stored = await self._insert(docs, ordered)
        if stored:
            self._on_stored()
        return stored

    async def _insert(self, docs: list[dict], ordered: bool = True) -> bool:
        """``insert_documents``, then the revisions among them applied to the
        messages they name (``mongo.revise``): the fast store holds each
        message's latest version, as MySQL does, so that no catch-up from it
        sends a deleted body. A failed revision is a failed insert: the rows
        stay the outbox, and the repair inserts them again (duplicates) and
        applies their revisions again (they set values: doing one twice is doing it once)."""
        if not await self.insert_documents(docs, ordered):
            return False
        revisions = [d for d in docs if d.get("kind") in REVISIONS]
        if not revisions:
            return True
        try:
            await self._within_timeout(mongo.revise(self.db, revisions, self._partition))
            return True
        except (PyMongoError, TimeoutError) as exc:
            return self._insert_failed(exc, docs)

    async def insert_documents(self, docs: list[dict], ordered: bool = True) -> bool:
        """One insert_many under the writer's deadline. ``ordered=False`` (the
        outbox repair): every document is tried. A document refused only for a
        duplicate _id is settled by ``_settle_duplicates``; after one, an
        ordered insert goes on with the rest unordered, so that a run of
        them costs one more insert, not one each. Unordered documents may
        become visible out of id order; a daemon reads such a hole back from
        MySQL, where all of them are committed."""
        try:
            asked = time.monotonic()
            await self._within_timeout(self.db[self._collection].insert_many(docs, ordered=ordered))
            took = time.monotonic() - asked
            self._core.mongo_answered(took)
            self._observe_insert(took)
            return True
        except BulkWriteError as exc:
            if not mongo.only_duplicates(exc):
                return self._insert_failed(exc, docs)
            refused = mongo.refused_at(exc)
            if ordered and (rest := docs[refused[-1] + 1:]) and not await self.insert_documents(rest, ordered=False):
                return False
            return await self._settle_duplicates([docs[i] for i in refused])
        except (PyMongoError, TimeoutError) as exc:
            return self._insert_failed(exc, docs)

    async def _settle_duplicates(self, ours: list[dict]) -> bool:
        """``ours``, committed rows, were refused for a duplicate _id. What holds
        each id is read back: the same document is a retry's (an insert cut
        short by a crash or the deadline), and counts as stored; another was
        not written by the writer (a script, a restore, another application
        took the id first), and ours takes its place, loudly. A check that
        cannot finish within the deadline (on FerretDB the read scans the
        collection) counts them as stored: a repair step that cannot finish
        would never make progress (docs/decisions/outbox-repair-without-reads.md),
        and no daemon delivers a document MySQL does not confirm."""
        ids = [d["_id"] for d in ours]
        try:
            found = await self._within_timeout(mongo.messages_with_ids(self.db, ids, self._partition))
        except (PyMongoError, TimeoutError) as exc:
            log.warning("event=duplicate_unchecked error=%s count=%d ids=%.200r action=counted_as_stored",
                        exc.__class__.__name__, len(ids), ids[:5])
            return True
        strays = [d for d in ours if d["_id"] in found and not mongo.same_document(found[d["_id"]], d)]
        if not strays:
            return True
        stray_ids = [d["_id"] for d in strays]
        self._observe_strays(len(strays))
        log.error("event=stray_document reason=differs_from_mysql source=writer partition=%d count=%d ids=%.200r "
                  "action=replaced_by_mysql_row meaning=a_document_the_writer_did_not_write_held_its_id",
                  self._partition, len(strays), stray_ids[:5])
        try:
            await self._within_timeout(mongo.replace_messages(self.db, strays, self._partition))
        except (PyMongoError, TimeoutError) as exc:
            log.error("event=stray_replace_failed error=%s count=%d ids=%.200r action=left_in_place",
                      exc.__class__.__name__, len(strays), stray_ids[:5])
        return True

    def _insert_failed(self, exc: Exception, docs: list[dict]) -> bool:
        log.warning("event=mongo_write_failed error=%s outbox_from=%d outbox_to=%d",
                    exc.__class__.__name__, docs[0]["_id"], docs[-1]["_id"])
        self._core.mongo_failed(time.monotonic())
        self._outbox.seen(max(self._outbox.size, len(docs)), docs[0]["created_at"])  # the oldest unsent
        return False

    def inserter(self, turn: int) -> Callable[[list[dict]], Awaitable[bool]]:
        """The Mongo insert of turn ``turn``'s pump: none once the turn is over, has
        left a call in flight or seen one fail (``WriterCore.may_insert``); the rows are the outbox."""
        async def insert(docs: list[dict]) -> bool:
            return self._core.may_insert(turn) and await self.insert(docs)

        return insert

    def hint_head(self, upto: int, idle: bool = False) -> None:
        """Moves meta.head in the background (commits go on meanwhile), one write at a time."""
        if self._core.head_due(upto, time.monotonic(), idle) and (self._head_task is None or self._head_task.done()):
            self._head_task = asyncio.create_task(self._advance_head(upto))

    async def _advance_head(self, upto: int) -> None:
        try:
            await self._within_timeout(mongo.advance_head(self.db, upto, self._partition))
            self._core.head_moved(upto, time.monotonic())
        except (PyMongoError, TimeoutError):
            # only a hint for the daemons' gap check; a later turn writes it again
            self._core.head_failed(time.monotonic())
