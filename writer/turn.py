"""A turn: one hold of a partition's writer lock, its I/O driven by the pure ``WriterCore``.

``Turn.take`` takes the lock, repairs the outbox if the core says so, then
commits batches while they come, each answered at its commit and handed to
the turn's ``Mirror`` for Mongo, until the core says to end (another process
is queued, or Mongo is behind for too long) or no request comes; then it
records ``mirrored_upto`` and releases the lock. The SQL is
``writer.mysql_steps``', the Mongo calls ``writer.mongo_steps``', the waits
``writer.turn_waits``'; what a turn does next is ``writer.core``'s to decide.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial

from sqlalchemy.engine import Connection

from chat.messages import Message
from chat.partitions import LiveMap, SlotMap
from chat.write_errors import WriteOutcomeUnknown, WriteUnavailable
from db import mongo
from writer.batch import CommitFailed, Pending, answer_all, fail, owed_copy
from writer.copies import Copy, OwedRead, home_of
from writer.core import NextStep, OutboxPlan, WriterCore, unsent_max
from writer.mirror import Mirror
from writer.mongo_steps import MongoSteps
from writer.mysql_steps import MySQLSteps
from writer.outbox_watch import OutboxWatch
from writer.turn_waits import TurnWaits

log = logging.getLogger("chat.writer")


class Turn:
    """The turns of one partition's writer, one at a time. ``hand_over(partition, copy)``
    offers a copy its originals owe to that partition's writer at once."""

    def __init__(self, core: WriterCore, sql: MySQLSteps, mongo_steps: MongoSteps, waits: TurnWaits,
                 outbox: OutboxWatch, *, partition: int, live: LiveMap, batch_max: int, retention_seconds: int,
                 hand_over: Callable[[int, Copy], None], reroute: Callable[[Pending], None],
                 adopted: Callable[[SlotMap], None] = lambda slot_map: None,
                 observe_batch: Callable[[int, float], None] = lambda n, s: None,
                 observe_turn: Callable[[float, float], None] = lambda waiting, holding: None,
                 observe_mongo_lag: Callable[[float, int], None] = lambda s, n: None,
                 observe_outbox: Callable[[int, float], None] = lambda n, s: None,
                 observe_copies: Callable[[list[Message]], None] = lambda copies: None):
        self._core = core
        self._sql = sql
        self._mongo = mongo_steps
        self._waits = waits
        self._outbox = outbox
        self._partition = partition
        self._live = live
        self._reroute = reroute  # a request whose sender lives in another partition now, to that one's writer
        self._adopted = adopted  # told of a newer map, once this turn has adopted it
        self._batch_max = batch_max
        self._retention = retention_seconds
        self._hand_over = hand_over
        self._observe_batch = observe_batch
        self._observe_turn = observe_turn  # (seconds waiting for the lock, seconds holding it), after each turn
        self._observe_mongo_lag = observe_mongo_lag
        self._observe_outbox = observe_outbox  # (messages, age of the oldest in seconds), after each turn
        self._observe_copies = observe_copies  # the copies each commit of this partition made
        self.in_hand: list[Pending] = []  # the batch being written: the one to fail if the turn breaks
        self._handed = 0  # copies handed over to this partition so far (``offered``)
        self._owed: OwedRead | None = None  # the echoes this turn found owed (partitioned only)

    async def take(self, batch: list[Pending], idle: bool = False) -> None:
        """One turn under the writer lock: repair, then commit batches while they come."""
        self.in_hand = batch
        self._owed = None
        sql, core, waits = self._sql, self._core, self._waits
        started = time.perf_counter()
        conn = await sql.connect()
        mirrored, last_id = None, 0
        locked_at = None
        try:
            # the hand-overs so far came before the drain's read, which follows the lock
            start = await sql.lock_and_read_state(conn, self._batch_max, self._handed)
            last_id, mirrored, newer = start.last_id, start.mirrored, start.newer_map
            locked_at = time.perf_counter()
            if newer is not None and self._live.adopt(newer):
                log.info("event=slot_map_adopted partition=%d epoch=%d partitions=%d", self._partition, newer.epoch,
                         newer.partitions)
                self._adopted(newer)
            if mirrored < last_id:
                self._outbox.seen(last_id - mirrored)
            if core.locked(mirrored, last_id, time.monotonic()) is OutboxPlan.REPAIR:
                mirrored, in_step = await self._repair(conn, mirrored, last_id)
                core.repaired(in_step, time.monotonic())
            if start.owed is not None:
                # Copies owed that no hand-over made (a writer killed between the two commits, a
                # full queue, another host's original); and what the drain found owed drops the
                # handed-over copies another host's writer made first (``_own``): at P = 4 on three
                # hosts half of all turns offered one, and each cost a refused INSERT, a look-up
                # and a second INSERT under the lock.
                self._owed = start.owed
                batch = self.in_hand = [owed_copy(copy) for copy in start.owed.copies] + batch
            batch = self.in_hand = waits.topped_up(batch)
            mirror = Mirror(self._mongo.inserter(core.turn), core.mirroring, mirrored, last_id,
                            unsent_max(self._batch_max), self._observe_mongo_lag)
            try:
                while batch := self._own(batch):
                    self.in_hand = batch
                    try:
                        committed, last_id = await sql.commit_batch(conn, batch, last_id,
                                                                    core.handover_check_due(time.monotonic()))
                    except WriteUnavailable as exc:
                        # answered 503 and nothing stored: an operator sees why (a statement's time-out, a lost link)
                        log.warning("event=batch_failed partition=%d requests=%d error=%s kind=%s", self._partition,
                                    len(batch), exc, exc.kind)
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
                    if not await waits.under_lock(conn, adding) or step is NextStep.END:
                        break
                    if step is NextStep.CHECKPOINT:
                        await sql.mark(conn, mirror.mirrored, last_id)
                        self._mongo.hint_head(mirror.mirrored)
                        core.checkpoint_done(time.monotonic())
                    batch = self.in_hand = await waits.linger(mirror, conn)
                core.ending()
                draining = asyncio.ensure_future(mirror.drain())
                if not await waits.under_lock(conn, draining):
                    waits.record_when_done(draining, lambda _: mirror.mirrored, last_id)
            finally:
                mirrored = mirror.mirrored
        finally:
            try:
                await sql.release(conn, mirrored, last_id)
            finally:
                core.released()
                if locked_at is not None:
                    self._observe_turn(locked_at - started, time.perf_counter() - locked_at)
            if mirrored is not None:
                self._outbox.seen(last_id - mirrored)
            self._report_outbox()
        # meta.head after the release, in the background: a hint, not worth the lock while Mongo hangs
        self._mongo.hint_head(mirrored, idle)

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
        took = await self._sql.found_committed(new)
        log.warning("event=commit_failed messages=%d found_committed=%s", len(new), took)
        if took:
            answer_all(failed.committed)
        else:
            fail([pending for pending, _msg, _created in failed.committed.answers],
                 WriteOutcomeUnknown("mysql: the commit failed and may have taken"))
            for pending, refusal in failed.committed.refused:  # refused before the commit: nothing of theirs
                if not pending.future.done():
                    pending.future.set_exception(refusal)

    def offered(self, copy: Copy) -> Pending:
        """A copy handed over to this partition, numbered for ``OwedRead.made_already``."""
        self._handed += 1
        return owed_copy(copy, self._handed - 1)

    def _own(self, batch: list[Pending]) -> list[Pending]:
        """The requests of ``batch`` that are this partition's under the map of now. A move can
        cut over while a request waits (routed by the map before it): a message goes to its
        sender's new partition's writer, and a copy is left to the recipient's partition,
        where its echo row is sent on (``echo_sql.leftover_copies``). A copy handed over
        that another writer of this partition has made since is dropped too."""
        slot_map = self._live.current
        if slot_map.partitions == 1:
            return batch
        partition, mine, owed = self._partition, [], self._owed
        for pending in batch:
            d = pending.draft
            if isinstance(d, Copy):
                if slot_map.partition_of(d.recipient) == partition and not (
                        owed is not None and owed.made_already(d.origin, pending.handed)):
                    mine.append(pending)
                else:
                    pending.future.cancel()
            elif home_of(d.sender, slot_map) == partition:
                mine.append(pending)
            else:
                self._reroute(pending)
        return mine

    def _pass_on(self, owed: list[tuple[int, Copy]], new: list[Message]) -> None:
        """After a commit: the copies its originals owe, to their partitions' writers at once."""
        for partition, copy in owed:
            self._hand_over(partition, copy)
        if self._live.current.partitions > 1:
            self._observe_copies([m for m in new if m.origin_part is not None])

    async def _repair(self, conn: Connection, mirrored: int, last_id: int) -> tuple[int, bool]:
        """Copies outbox rows to Mongo, oldest first, a page at a time; returns
        (mirrored_upto, ok). Each page is one MySQL read by primary key and one
        unordered insert, in which a duplicate key means "already there" (a
        crash mid-insert leaves part of the outbox in Mongo). Nothing asks the
        fast store what it holds: on FerretDB such a read scans the whole
        collection, longer than the writer's timeout, and a repair that cannot
        finish one step within its timeout would retry that step for ever
        (docs/decisions/outbox-repair-without-reads.md). A page costs the same
        whatever the store holds, and every page done is progress kept: a
        failure resumes after it."""
        cutoff = mongo.expired_before(self._retention)
        while mirrored < last_id:
            rows = await self._sql.outbox_page(conn, mirrored, self._core.repair_page)
            if not rows:
                return last_id, True
            docs = [Message.from_row(r).to_doc() for r in rows]
            self._outbox.seen(last_id - mirrored, docs[0]["created_at"])
            self._report_outbox()
            # An expired message is not copied back: the sweeper removed it, and the retention floor covers it.
            live = [d for d in docs if d["created_at"] >= cutoff]
            log.warning("event=outbox_repair rows=%d live=%d from_id=%d to_id=%d", len(docs), len(live),
                        docs[0]["_id"], docs[-1]["_id"])
            if live:
                inserting = asyncio.ensure_future(self._mongo.insert(live, ordered=False))
                if not await self._waits.under_lock(conn, inserting):  # another process is queued: left in flight
                    self._core.repair_page_stalled()
                    self._waits.record_when_done(inserting, partial(_if_inserted, docs[-1]["_id"]), last_id)
                    return mirrored, False
                if not inserting.result():
                    self._core.repair_page_stalled()
                    return mirrored, False
                self._core.repair_page_landed()
            mirrored = docs[-1]["_id"]
        self._outbox.cleared()
        return mirrored, True


def _if_inserted(upto: int, inserted: bool) -> int:
    """What an outbox page's insert, left in flight, proves once it is done: every id up to ``upto``, if it went in."""
    return upto if inserted else 0
