"""Group commit of new messages into MySQL, then MongoDB, in one global order.

Every API process funnels its requests into one ``MessageWriter`` per
partition (writer/partitioned.py; everything below holds per partition, on
its own lock, tables and collection: partition 0's are named here). Requests
queued within a few milliseconds form a batch. Batches are written in
*sessions* under the MySQL named lock ``chat.writer``, which all API
processes share:

1. lock; read ``stream_state`` (last_id, mirrored_upto);
2. repair: copy any outbox rows (mirrored_upto, last_id] to Mongo first;
3. per batch: give new messages the ids last_id+1, last_id+2, ... and
   commit them to MySQL in one transaction (a retry of a stored message is
   found by (sender, client_msg_id) when the unique key refuses the INSERT);
   answer at once (MySQL is the permanent store: the message is stored);
   then hand them to the session's one Mongo insert at a time
   (``writer.mirror.Mirror``): each ``insert_many`` takes, in id order,
   everything committed since the previous one started;
4. when the queue is still empty once the last insert is done (or the
   session has held the lock long enough): record mirrored_upto, unlock.
   Another process queued for the lock never waits on this one's Mongo
   longer than ``HANDOVER_GRACE_SECONDS``: past it the Mongo call is left
   in flight (``_under_lock``) and what it was to copy is the outbox.

Every decision of a session (repair the outbox now or later, end or
checkpoint after a commit, ask for a hand-over, move meta.head) is made by
the pure ``writer.core.WriterCore``; this module does the I/O around it, and
``writer.mysql_steps`` holds its SQL.

Why a lock across both stores: ids are gap-free and become visible in Mongo
(and its oplog) strictly in id order. A daemon that has seen id N therefore
knows every id <= N is readable, and a gap in the ids it sees is a message it
missed, never one that is still in flight. That is what makes catch-up exact.

Within a session the stores are decoupled: MySQL commits, and their answers,
never wait for a Mongo insert, unless ``UNSENT_BATCHES`` batches of committed
messages already do (then the next commit waits: a Mongo slower than MySQL
for long slows the writer down instead of growing a queue; measured in
docs/decisions/mongo-insert-pump.md). Inserts still start in id order, one at
a time, and the session waits for the last one before it gives up the lock,
unless another process is queued for it (then for the grace at most).

A process queued for the lock holds ``chat.writer.next`` meanwhile; the
holder sees it and hands over after the batch in hand, so that lingering
never holds another process's requests for a whole session.

Across sessions the stores are not pipelined, on purpose: with FerretDB
taking inserts back to back, the daemons fell off its oplog
(docs/decisions/no-writer-pipelining.md).

MySQL commits first, so a message is never in Mongo but not in MySQL. If a
Mongo write fails, or the process dies before it, the committed rows are the
outbox: the session stops writing to Mongo (order!), its requests still get
their 201 (the message is stored), and the next session, in any process, or
the idle repair tick copies the outbox before anything newer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial

from pymongo.asynchronous.database import AsyncDatabase
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from chat.drafts import Draft
from chat.messages import Message
from chat.partitions import SlotMap, collection_name, lock_name
from chat.write_errors import WriteOutcomeUnknown, WriterOverloaded, WriteUnavailable
from db import mongo
from db.partition_map import tables_of
from db.sql import row_to_message
from db.threads import Threads
from writer.batch import CommitFailed, Pending, answer_all, fail
from writer.copies import Copy
from writer.core import DEFAULT_TIMING, NextStep, OutboxPlan, Timing, WriterCore, unsent_max
from writer.mirror import Mirror
from writer.mongo_steps import MongoSteps
from writer.mysql_steps import MySQLSteps, next_lock_name
from writer.outbox_watch import OutboxWatch
from writer.turn_waits import TurnWaits
from chat.stopping import reraise_if_cancelling

log = logging.getLogger("chat.writer")
ONE_PARTITION = SlotMap.even(1)


def _no_hand_over(partition: int, copy: Copy) -> None:
    """Without a peer in this process, a copy is made by the drain of its partition's writer."""


class MessageWriter(MySQLSteps, MongoSteps, TurnWaits):
    """The writer of one partition (``partition``, of ``slot_map``): its lock, tables and collection.
    ``hand_over(partition, copy)`` offers a copy its originals owe to that partition's writer at once."""

    def __init__(self, engine: Engine, mongo_db: AsyncDatabase, *, batch_max: int, window_ms: float,
                 queue_max: int, timeout_seconds: float, retention_seconds: int,
                 observe_batch: Callable[[int, float], None] = lambda n, s: None,
                 observe_mongo_lag: Callable[[float, int], None] = lambda s, n: None,
                 observe_outbox: Callable[[int, float], None] = lambda n, s: None,
                 observe_copies: Callable[[int], None] = lambda n: None,
                 observe_strays: Callable[[int], None] = lambda n: None,
                 timing: Timing = DEFAULT_TIMING, partition: int = 0, slot_map: SlotMap = ONE_PARTITION,
                 hand_over: Callable[[int, Copy], None] = _no_hand_over):
        self._partition = partition
        self._slot_map = slot_map
        self._hand_over = hand_over
        tables = tables_of(partition)
        self._messages, self._stream_state = tables.messages, tables.stream_state
        self._lock, self._next_lock = lock_name(partition), next_lock_name(partition)
        self._collection = collection_name(partition)
        self._engine = engine
        # A thread of its own for its MySQL calls: slow reads elsewhere must not
        # hold a message back (db.threads). One, so that they run in order: a
        # turn cancelled while a call is under way (a shutdown) releases the
        # writer lock after that call, never beside it on the same connection
        # (which failed the release and left the lock held by a connection back
        # in the pool: every later turn timed out). Turns never overlap.
        self._threads = Threads(1, "writer")
        self._mongo = mongo_db
        self._batch_max = batch_max
        self._window = window_ms / 1000
        self._queue: asyncio.Queue[Pending] = asyncio.Queue(maxsize=queue_max)
        self._timeout = timeout_seconds
        self._retention = retention_seconds
        self._observe_batch = observe_batch
        self._observe_mongo_lag = observe_mongo_lag
        self._observe_outbox = observe_outbox  # (messages, age of the oldest in seconds), after each turn
        self._observe_copies = observe_copies  # copies committed in this partition, per batch
        self._observe_strays = observe_strays  # documents not the writer's found at its ids, replaced
        self._outbox = OutboxWatch()
        self._core = WriterCore(timing)
        self._head_task: asyncio.Task | None = None  # a meta.head write started mid-turn
        self._in_hand: list[Pending] = []  # the batch being written: the one to fail if the turn breaks
        self._left: set[asyncio.Future] = set()

    # --- the request side -------------------------------------------------
    async def submit(self, draft: Draft) -> tuple[Message, bool]:
        """Stores one message; returns (message, created). False = a retry's original."""
        return await self.enqueue(draft)

    def enqueue(self, draft: Draft) -> asyncio.Future:
        """Queues one message; the future resolves as ``submit`` returns or raises.
        (The writer process answers its socket from the future's callback: no task per message.)"""
        future = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(Pending(draft, future))
        except asyncio.QueueFull:
            raise WriterOverloaded from None
        return future

    def offer_copy(self, copy: Copy) -> None:
        """Queues a copy owed to this partition. Nobody waits for it: its echo row
        is committed, so a copy that is not made now (a full queue, a failed turn)
        is made by a later turn's drain (``_leftovers``)."""
        future = asyncio.get_running_loop().create_future()
        future.add_done_callback(_copy_settled)
        try:
            self._queue.put_nowait(Pending(copy, future))
        except asyncio.QueueFull:
            future.cancel()

    # --- the writer task --------------------------------------------------
    async def run(self, repair_every: float = 1.0) -> None:
        while True:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow
                # a cancel that lands as the get completes, and a shutdown then waits for ever.
                async with asyncio.timeout(repair_every):
                    first = await self._queue.get()
            except TimeoutError:
                first = None  # idle: a turn with no batch repairs any outbox
            self._in_hand = await self._next_batch(first) if first else []
            try:
                await self._session(self._in_hand, idle=first is None)
            except Exception as exc:  # one guard: every waiting request gets an answer
                if not isinstance(exc, WriteUnavailable):
                    log.exception("event=writer_session_failed")
                    exc = WriteUnavailable(str(exc))
                elif self._in_hand:
                    log.warning("event=writer_turn_failed partition=%d answered=%d error=%s kind=%s",
                                self._partition, len(self._in_hand), exc, exc.kind)
                fail(self._in_hand, exc)  # the batch in hand when it failed, not the turn's first
                reraise_if_cancelling()  # a cancel a driver reported as its own error: a shutdown

    async def _session(self, batch: list[Pending], idle: bool = False) -> None:
        """One turn under the writer lock: repair, then commit batches while they come."""
        try:
            conn = await self._threads.run(self._engine.connect)
        except SQLAlchemyError as exc:
            raise WriteUnavailable(f"mysql: {exc.__class__.__name__}") from None
        core = self._core
        mirrored, last_id = None, 0
        try:
            last_id, mirrored = await self._mysql(self._lock_and_read_state, conn)
            if mirrored < last_id:
                self._outbox.seen(last_id - mirrored)
            if core.locked(mirrored, last_id, time.monotonic()) is OutboxPlan.REPAIR:
                mirrored, in_step = await self._repair(conn, mirrored, last_id)
                core.repaired(in_step, time.monotonic())
            if self._slot_map.partitions > 1:
                batch = self._in_hand = await self._leftovers(conn) + batch
            mirror = Mirror(self._inserter(core.turn), core.mirroring, mirrored, last_id,
                            unsent_max(self._batch_max), self._observe_mongo_lag)
            try:
                while batch:
                    try:
                        committed, last_id = await self._mysql(self._commit_batch, conn, batch, last_id)
                    except WriteUnavailable as exc:
                        fail(batch, exc)
                        break
                    except CommitFailed as failed:
                        # The turn's connection, and the writer lock with it,
                        # may be gone: the turn ends, and what did commit is an
                        # outbox that the next turn copies to Mongo.
                        await self._settle(failed)
                        break
                    answer_all(committed)  # stored: MySQL is the permanent store
                    self._pass_on(committed.owed, committed.new_messages)
                    self._observe_batch(len(committed.answers), time.perf_counter() - committed.started)
                    step = core.committed(committed.others_waiting, time.monotonic())
                    adding = asyncio.ensure_future(mirror.add(committed.new_messages, last_id, committed.stamped))
                    if not await self._under_lock(conn, adding) or step is NextStep.END:
                        break
                    if step is NextStep.CHECKPOINT:
                        await self._mysql(self._mark, conn, mirror.mirrored, last_id)
                        self._hint_head(mirror.mirrored)
                        core.checkpoint_done(time.monotonic())
                    batch = self._in_hand = await self._linger(mirror, conn)
                core.ending()
                draining = asyncio.ensure_future(mirror.drain())
                if not await self._under_lock(conn, draining):
                    self._record_when_done(draining, lambda _: mirror.mirrored, last_id)
            finally:
                mirrored = mirror.mirrored
        finally:
            try:
                # shielded: a second cancel must not drop the release from the thread's queue
                await asyncio.shield(self._threads.run(self._mark_and_release, conn, mirrored, last_id))
            finally:
                core.released()
            if mirrored is not None:
                self._outbox.seen(last_id - mirrored)
            self._report_outbox()
        # meta.head after the release, in the background: a hint, not worth the lock while Mongo hangs
        if core.head_due(mirrored, time.monotonic(), idle) and (self._head_task is None or self._head_task.done()):
            self._head_task = asyncio.create_task(self._advance_head(mirrored))

    def _report_outbox(self) -> None:
        now = datetime.now(UTC)
        self._observe_outbox(self._outbox.size, self._outbox.age(now))
        if self._outbox.due_loud(now, time.monotonic()):
            log.error("event=outbox_aging messages=%d age_s=%.0f meaning=the_fast_store_lags_mysql "
                      "delivery=from_mysql_by_the_daemons_gap_check", self._outbox.size, self._outbox.age(now))

    async def _settle(self, failed: CommitFailed) -> None:
        """Answers a batch whose COMMIT failed. Its rows, read on a fresh
        connection, say if it took: then the answers are the usual 201s. If
        they are not there, the commit may still be under way (a read time-out
        on a slow MySQL), so the answer is "may be stored", never "nothing stored"."""
        new = failed.committed.new_messages
        try:
            took = await self._threads.run(self._rows_present, new)
        except SQLAlchemyError:
            took = False
        log.warning("event=commit_failed messages=%d found_committed=%s", len(new), took)
        if took:
            answer_all(failed.committed)
        else:
            fail([pending for pending, _msg, _created in failed.committed.answers],
                 WriteOutcomeUnknown("mysql: the commit failed and may have taken"))

    def close(self) -> None:
        self._threads.close()

    async def _leftovers(self, conn: Connection) -> list[Pending]:
        """Copies owed to this partition that no hand-over made (a writer killed
        between the two commits, a full queue, another host's original)."""
        copies = await self._mysql(self._leftover_copies, conn, self._batch_max)
        loop = asyncio.get_running_loop()
        pending = []
        for copy in copies:
            future = loop.create_future()
            future.add_done_callback(_copy_settled)
            pending.append(Pending(copy, future))
        return pending

    def _pass_on(self, owed: list[tuple[int, Copy]], new: list[Message]) -> None:
        """After a commit: the copies its originals owe, to their partitions' writers at once."""
        for partition, copy in owed:
            self._hand_over(partition, copy)
        if self._slot_map.partitions > 1:
            self._observe_copies(sum(1 for m in new if m.origin_part is not None))

    async def _repair(self, conn: Connection, mirrored: int, last_id: int) -> tuple[int, bool]:
        """Copies outbox rows to Mongo, oldest first, a page at a time; returns
        (mirrored_upto, ok). Each page is one MySQL read by primary key and one
        unordered insert, in which a duplicate key means "already there" (a
        crash mid-insert leaves part of the outbox in Mongo). Nothing asks the
        fast store what it holds: on FerretDB such a read scans the whole
        collection, 2.8 s at 109,000 messages, longer than the writer's timeout,
        and a repair that cannot finish one step within its timeout would retry
        that step for ever. A page costs the same whatever the store holds, and
        every page done is progress kept: a failure resumes after it."""
        cutoff = mongo.expired_before(self._retention)
        while mirrored < last_id:
            rows = await self._mysql(self._outbox_page, conn, mirrored)
            if not rows:
                return last_id, True
            docs = [row_to_message(r).to_doc() for r in rows]
            self._outbox.seen(last_id - mirrored, docs[0]["created_at"])
            self._report_outbox()
            # An expired message is not copied back: the sweeper removed it, and the retention floor covers it.
            live = [d for d in docs if d["created_at"] >= cutoff]
            log.warning("event=outbox_repair rows=%d live=%d from_id=%d to_id=%d", len(docs), len(live),
                        docs[0]["_id"], docs[-1]["_id"])
            if live:
                inserting = asyncio.ensure_future(self._insert(live, ordered=False))
                if not await self._under_lock(conn, inserting):  # another process is queued: left in flight
                    self._record_when_done(inserting, partial(_if_inserted, docs[-1]["_id"]), last_id)
                    return mirrored, False
                if not inserting.result():
                    return mirrored, False
            mirrored = docs[-1]["_id"]
        self._outbox.cleared()
        return mirrored, True


def _if_inserted(upto: int, inserted: bool) -> int:
    """What an outbox page's insert, left in flight, proves once it is done: every id up to ``upto``, if it went in."""
    return upto if inserted else 0


def _copy_settled(future: asyncio.Future) -> None:
    """A copy's outcome is nobody's answer: a failure leaves its echo row for a later turn."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("event=copy_deferred error=%s", future.exception().__class__.__name__)
