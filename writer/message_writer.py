"""Group commit of new messages into MySQL, then MongoDB, in one global order.

Every API process funnels its requests into one ``MessageWriter`` per
partition (writer/partitioned.py; everything below holds per partition, on
its own lock, tables and collection: partition 0's are named here). Requests
queued within a few milliseconds form a batch. Batches are written in
*turns* under the MySQL named lock ``chat.writer``, which all API
processes share:

1. lock; read ``stream_state`` (last_id, mirrored_upto);
2. repair: copy any outbox rows (mirrored_upto, last_id] to Mongo first;
3. per batch: give new messages the ids last_id+1, last_id+2, ... and
   commit them to MySQL in one transaction (a retry of a stored message is
   found by (sender, client_msg_id) when the unique key refuses the INSERT);
   answer at once (MySQL is the permanent store: the message is stored);
   then hand them to the turn's one Mongo insert at a time
   (``writer.mirror.Mirror``): each ``insert_many`` takes, in id order,
   everything committed since the previous one started;
4. when the queue is still empty once the last insert is done (or the
   turn has held the lock long enough): record mirrored_upto, unlock.
   Another process queued for the lock never waits on this one's Mongo
   longer than ``HANDOVER_GRACE_SECONDS``: past it the Mongo call is left
   in flight (``TurnWaits.under_lock``) and what it was to copy is the outbox.

Every decision of a turn (repair the outbox now or later, end or
checkpoint after a commit, ask for a hand-over, move meta.head) is made by
the pure ``writer.core.WriterCore``. The I/O around it is in parts that each
do one job, which ``MessageWriter`` holds: ``writer.turn.Turn`` (one hold of
the lock), ``writer.mysql_steps.MySQLSteps`` (its SQL),
``writer.mongo_steps.MongoSteps`` (its Mongo calls) and
``writer.turn_waits.TurnWaits`` (what a turn waits for); this module queues
the requests and takes the turns.

Why a lock across both stores: ids are gap-free and become visible in Mongo
(and its oplog) strictly in id order. A daemon that has seen id N therefore
knows every id <= N is readable, and a gap in the ids it sees is a message it
missed, never one that is still in flight. That is what makes catch-up exact.

Within a turn the stores are decoupled: MySQL commits, and their answers,
never wait for a Mongo insert, unless ``UNSENT_BATCHES`` batches of committed
messages already do (then the next commit waits: a Mongo slower than MySQL
for long slows the writer down instead of growing a queue:
docs/decisions/mongo-insert-pump.md). Inserts still start in id order, one at
a time, and the turn waits for the last one before it gives up the lock,
unless another process is queued for it (then for the grace at most).

A process queued for the lock holds ``chat.writer.next`` meanwhile; the
holder sees it and hands over after the batch in hand, so that lingering
never holds another process's requests for a whole turn.

Across turns the stores are not pipelined, on purpose: with FerretDB
taking inserts back to back, the daemons fell off its oplog
(docs/decisions/no-writer-pipelining.md).

MySQL commits first, so a message is never in Mongo but not in MySQL. If a
Mongo write fails, or the process dies before it, the committed rows are the
outbox: the turn stops writing to Mongo (order!), its requests still get
their 201 (the message is stored), and the next turn, in any process, or
the idle repair tick copies the outbox before anything newer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from pymongo.asynchronous.database import AsyncDatabase
from sqlalchemy.engine import Engine

from chat.drafts import Draft
from chat.messages import Message
from chat.partitions import LiveMap, SlotMap
from chat.stopping import reraise_if_cancelling
from chat.write_errors import PartitionBusy, WriterOverloaded, WriteUnavailable
from writer.batch import Pending, fail
from writer.copies import Copy
from writer.core import DEFAULT_TIMING, Timing, WriterCore
from writer.echo_watch import EchoWatch
from writer.mongo_steps import MongoSteps
from writer.mysql_steps import MySQLSteps
from writer.outbox_watch import OutboxWatch
from writer.turn import Turn
from writer.turn_waits import TurnWaits

log = logging.getLogger("chat.writer")
ONE_PARTITION = SlotMap.even(1)


def _no_hand_over(partition: int, copy: Copy) -> None:
    """Without a peer in this process, a copy is made by the drain of its partition's writer."""


def _no_reroute(pending: Pending) -> None:
    """Without a writer of the sender's new partition in this process: a fast 503, retried there."""
    fail([pending], PartitionBusy("the sender's slot moved to another partition; retry"))


class MessageWriter:
    """The writer of one partition (``partition``, of ``slot_map``, or of the map a ``LiveMap`` holds now,
    which a turn renews when a move has cut over): its lock, tables and collection.
    It queues the requests and takes turns under the lock; each part does one job: the SQL
    (``MySQLSteps``), the Mongo calls (``MongoSteps``), the waits (``TurnWaits``) and one
    lock hold's I/O (``Turn``), all on one ``WriterCore``'s decisions.
    ``hand_over(partition, copy)`` offers a copy its originals owe to that partition's writer at once."""

    # The classes of its SQL and Mongo parts: the tests put in ones that fail a step on the real databases.
    mysql_steps: type[MySQLSteps] = MySQLSteps
    mongo_steps: type[MongoSteps] = MongoSteps

    def __init__(self, engine: Engine, mongo_db: AsyncDatabase, *, batch_max: int, window_ms: float,
                 queue_max: int, timeout_seconds: float, retention_seconds: int,
                 observe_batch: Callable[[int, float], None] = lambda n, s: None,
                 observe_turn: Callable[[float, float], None] = lambda waiting, holding: None,
                 observe_mongo_lag: Callable[[float, int], None] = lambda s, n: None,
                 observe_outbox: Callable[[int, float], None] = lambda n, s: None,
                 observe_copies: Callable[[list[Message]], None] = lambda copies: None,
                 observe_strays: Callable[[int], None] = lambda n: None,
                 timing: Timing = DEFAULT_TIMING, partition: int = 0, slot_map: SlotMap | LiveMap = ONE_PARTITION,
                 hand_over: Callable[[int, Copy], None] = _no_hand_over, edit_window_seconds: int = 48 * 3600,
                 on_stored: Callable[[], None] = lambda: None, reroute: Callable[[Pending], None] = _no_reroute,
                 adopted: Callable[[SlotMap], None] = lambda slot_map: None, watch_echoes_every: float | None = None,
                 observe_insert: Callable[[float], None] = lambda s: None):
        live = slot_map if isinstance(slot_map, LiveMap) else LiveMap(slot_map)
        self._partition = partition
        self._queue: asyncio.Queue[Pending] = asyncio.Queue(maxsize=queue_max)
        # A queued writer waits for the lock as long as for any other statement: timeout_seconds.
        core, outbox = WriterCore(timing.within_lock_wait(timeout_seconds)), OutboxWatch()
        self._sql = self.mysql_steps(engine, partition=partition, live=live, timeout_seconds=timeout_seconds,
                                     edit_window_seconds=edit_window_seconds)
        self._mongo = self.mongo_steps(mongo_db, partition=partition, timeout_seconds=timeout_seconds, core=core,
                                       outbox=outbox, observe_strays=observe_strays, on_stored=on_stored,
                                       observe_insert=observe_insert)
        self._waits = TurnWaits(self._queue, core=core, sql=self._sql, partition=partition, batch_max=batch_max,
                                window_ms=window_ms)
        self._turn = Turn(core, self._sql, self._mongo, self._waits, outbox, partition=partition, live=live,
                          batch_max=batch_max, retention_seconds=retention_seconds, hand_over=hand_over,
                          reroute=reroute, adopted=adopted, observe_batch=observe_batch, observe_turn=observe_turn,
                          observe_mongo_lag=observe_mongo_lag, observe_outbox=observe_outbox,
                          observe_copies=observe_copies)
        # A leader of its partition makes the copies other hosts' commits owe it (writer.echo_watch).
        self._watch = None if watch_echoes_every is None else EchoWatch(
            engine, partition=partition, live=live, offer=self.offer_copy, interval=watch_echoes_every,
            limit=batch_max)

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

    def take_over(self, pending: Pending) -> None:
        """Queues a request another partition's writer received before a move sent its sender here."""
        try:
            self._queue.put_nowait(pending)
        except asyncio.QueueFull:
            fail([pending], WriterOverloaded())

    def wake_echo_watch(self) -> None:
        """Another host's commit left echoes for this partition (``writer.echo_wake``)."""
        if self._watch is not None:
            self._watch.wake()

    def offer_copy(self, copy: Copy) -> None:
        """Queues a copy owed to this partition. Nobody waits for it: its echo row
        is committed, so a copy that is not made now (a full queue, a failed turn)
        is made by a later turn's drain (``echo_sql.leftover_copies``)."""
        pending = self._turn.offered(copy)
        try:
            self._queue.put_nowait(pending)
        except asyncio.QueueFull:
            pending.future.cancel()

    # --- the writer task --------------------------------------------------
    async def run(self, repair_every: float = 1.0) -> None:
        if self._watch is None:
            await self._turns(repair_every)
            return
        async with asyncio.TaskGroup() as both:
            both.create_task(self._watch.run(), name=f"echo_watch_p{self._partition}")
            await self._turns(repair_every)

    async def _turns(self, repair_every: float) -> None:
        turn = self._turn
        while True:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow
                # a cancel that lands as the get completes, and a shutdown then waits for ever.
                async with asyncio.timeout(repair_every):
                    first = await self._queue.get()
            except TimeoutError:
                first = None  # idle: a turn with no batch repairs any outbox
            batch = await self._waits.next_batch(first) if first else []
            try:
                await turn.take(batch, idle=first is None)
            except Exception as exc:  # one guard: every waiting request gets an answer
                if not isinstance(exc, WriteUnavailable):
                    log.exception("event=writer_session_failed")
                    exc = WriteUnavailable(str(exc))
                elif turn.in_hand:
                    log.warning("event=writer_turn_failed partition=%d answered=%d error=%s kind=%s",
                                self._partition, len(turn.in_hand), exc, exc.kind)
                fail(turn.in_hand, exc)  # the batch in hand when it failed, not the turn's first
                reraise_if_cancelling()  # a cancel a driver reported as its own error: a shutdown

    def close(self) -> None:
        self._sql.close()
        if self._watch is not None:
            self._watch.close()
