"""Group commit of new messages into MySQL, then MongoDB, in one global order.

Every API process funnels its requests into one ``MessageWriter``. Requests
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
   (``_Mirror``): each ``insert_many`` takes, in id order, everything
   committed since the previous one started;
4. when the queue is still empty once the last insert is done (or the
   session has held the lock long enough): record mirrored_upto, unlock.

Why a lock across both stores: ids are gap-free and become visible in Mongo
(and its oplog) strictly in id order. A daemon that has seen id N therefore
knows every id <= N is readable, and a gap in the ids it sees is a message it
missed, never one that is still in flight. That is what makes catch-up exact.

Within a session the stores are decoupled: MySQL commits, and their answers,
never wait for a Mongo insert, unless ``UNSENT_BATCHES`` batches of committed
messages already do (then the next commit waits: a Mongo slower than MySQL
for long slows the writer down instead of growing a queue). With at most
one answered batch waiting for Mongo, each commit waited for the previous
batch's insert, and a POST's time followed FerretDB's insert time, which the
daemons' tails make long. As deployed (2 API processes, the writer process,
2 daemons tailing FerretDB, ab -k -c 100, single runs): 3,861-4,243 POST/s
at p99 44-48 ms, decoupled and with sessions that run on
(CHECKPOINT_SECONDS), against 2,926-3,202 at p99 80-92. Inserts still start
in id order, one at a time, and the session waits for the last one before it
gives up the lock.

A process queued for the lock holds ``chat.writer.next`` meanwhile; the
holder sees it and hands over after the batch in hand, so that lingering
never holds another process's requests for a whole session.

Across sessions the stores are not pipelined, on purpose. Tried:
the next holder committed and answered its first batch while the last one's
final insert ran, and waited for that insert (a second named lock) only to
insert its own. The write path alone went from 2,762-2,828 to 3,222-3,782
POST/s (ab -k -c 100, two API processes, no daemon), but with the daemons
tailing, FerretDB saw inserts back to back: at 1,000 msg/s and 1,000
WebSocket clients the daemons fell off its oplog 3-6 times per 20 s run
(0 before) and delivery p99 went from 400-425 ms to 3.5-4.7 s. Reverted.

MySQL commits first, so a message is never in Mongo but not in MySQL. If a
Mongo write fails, or the process dies before it, the committed rows are the
outbox: the session stops writing to Mongo (order!), its requests still get
their 201 (the message is stored), and the next session, in any process, or
the idle repair tick copies the outbox before anything newer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, PyMongoError
from sqlalchemy import func, select, text, tuple_
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from chat.messages import Message, now_ms
from db import mongo
from db.outbox_watch import OutboxWatch
from db.sql import conversation_key, messages, stream_state
from db.threads import Threads

log = logging.getLogger("chat.writer")

LOCK_NAME = "chat.writer"
# Held by the process queued for LOCK_NAME while it waits: the holder sees it
# and ends its session after the batch in hand instead of taking another.
NEXT_LOCK_NAME = "chat.writer.next"
REPAIR_PAGE = 2000
# A session whose Mongo insert failed ends after this long, so that the next
# one repairs the outbox once Mongo is back (MONGO_RETRY_SECONDS) instead of
# committing to it for as long as requests keep coming.
SESSION_MAX_SECONDS = 0.25
# A session that runs on (requests keep coming, nobody else is queued for the
# lock) records mirrored_upto and moves meta.head this often. Ending it
# instead, to do that and take the lock again, stopped every commit for a
# whole Mongo insert four times a second: most of a POST's p99.
CHECKPOINT_SECONDS = 1.0
# Committed messages that may wait for Mongo, in batches of batch_max: past
# that, commits wait for the insert in flight (Mongo slower than MySQL for
# long must slow the writer down, not grow a queue without end).
UNSENT_BATCHES = 4
# A pause after each Mongo insert before the next one starts. Back-to-back
# inserts (the next one taking what was committed meanwhile) slowed
# FerretDB's tails, ours and its own probe's alike: at 250 msg/s delivery
# p50 went from 59-75 to 76-99 ms (interleaved runs) against a writer that
# had a MySQL commit between its inserts. Commits never wait
# for this pause, and what it delays is only the start of the next insert;
# with INSERT_GAP_BELOW messages or more waiting for Mongo (a flood of POSTs:
# ab -k -c 100 keeps about 100 waiting, 1,000 msg/s about 20), there is none.
INSERT_GAP_SECONDS = 0.005
INSERT_GAP_BELOW = 64
# After a failed Mongo write, sessions leave the outbox alone this long
# (messages are still stored and answered; the copy waits), so that a Mongo
# that is down or hung costs one timeout, not one per session under the lock.
MONGO_RETRY_SECONDS = 2.0
# How often a batch's commit asks whether another process is queued for the
# lock (one more round trip, and the host's one writer process is nearly
# always alone): a waiting process waits this much longer at most.
HANDOVER_CHECK_SECONDS = 0.02


class WriteUnavailable(Exception):
    """MySQL is down, slow or locked past the timeout: nothing was stored."""

    kind = "mysql_unavailable"  # the error code of the API's 503


class WriteOutcomeUnknown(WriteUnavailable):
    """MySQL failed during the commit itself and could not be asked afterwards
    whether it took: the messages may be stored. A retry with the same
    client_msg_id returns them if so, and stores them once if not."""


class _CommitFailed(Exception):
    """The batch's COMMIT (or the handover check in its transaction) failed: it may have taken."""

    def __init__(self, committed: "_Committed"):
        super().__init__("commit failed")
        self.committed = committed


class WriterOverloaded(Exception):
    """More requests are queued than the writer accepts: nothing was stored."""


class ClientIdConflict(Exception):
    """The sender reused a client_msg_id for a different message."""

    def __init__(self, original: Message):
        super().__init__("client_msg_id already used for a different message")
        self.original = original


@dataclass(frozen=True, slots=True)
class Draft:
    sender: str
    recipient: str
    body: str
    client_msg_id: str | None = None


@dataclass(slots=True)
class _Pending:
    draft: Draft
    future: asyncio.Future = field(repr=False)


@dataclass(slots=True)
class _Committed:
    """One batch after its MySQL commit: what to insert into Mongo and whom to answer."""
    new_messages: list[Message]
    answers: list[tuple[_Pending, Message, bool]]
    started: float
    stamped: float  # time.monotonic() when created_at was taken, just before the INSERT
    others_waiting: bool  # another process is queued for the lock: hand over after this batch


def row_to_message(row) -> Message:
    created = row.created_at.replace(tzinfo=UTC)
    return Message(row.id, row.sender, row.recipient, row.body, created, row.client_msg_id)


def _answer(pending: _Pending, msg: Message, created: bool) -> None:
    if pending.future.done():
        return
    d = pending.draft
    if not created and (msg.recipient, msg.body) != (d.recipient, d.body):
        pending.future.set_exception(ClientIdConflict(msg))
    else:
        pending.future.set_result((msg, created))


def _answer_all(committed: _Committed) -> None:
    for pending, msg, created in committed.answers:
        _answer(pending, msg, created)


def _fail(batch: list[_Pending], exc: Exception) -> None:
    for p in batch:
        if not p.future.done():
            p.future.set_exception(exc)


class _Mirror:
    """A session's committed messages on their way to Mongo. One insert at a
    time, in id order, by one task (the pump) that runs while anything is
    unsent: each insert takes everything committed since the previous one
    started, and starts as soon as that one (and its pause) is done, whatever
    the session is doing then. A MySQL commit (and its answers) never waits for
    a Mongo insert unless ``unsent_max`` messages already do. After a failed
    insert nothing more is inserted: the rows are the outbox, copied in order later."""

    def __init__(self, insert: Callable[[list[dict]], Awaitable[bool]], ok: bool, mirrored: int,
                 last_id: int, unsent_max: int, observe_lag: Callable[[float, int], None] = lambda s, n: None):
        self._insert = insert
        self.ok = ok  # every insert so far succeeded (and, at the start, Mongo held everything to last_id)
        self.mirrored = mirrored  # every id up to it is in Mongo
        self._last_id = last_id
        self._unsent: list[Message] = []
        # (created_at as time.monotonic(), messages) of each batch in _unsent: how long each took to reach Mongo
        self._unsent_commits: list[tuple[float, int]] = []
        self._unsent_max = unsent_max
        self._observe_lag = observe_lag
        self.inserting: asyncio.Task | None = None  # the pump
        self._room: asyncio.Future | None = None  # a commit waiting for the pump to take what is unsent

    async def add(self, new: list[Message], last_id: int, stamped: float) -> None:
        """Messages just committed, up to ``last_id``; ``stamped``: their created_at, as time.monotonic()."""
        self._unsent.extend(new)
        if new:
            self._unsent_commits.append((stamped, len(new)))
        self._last_id = last_id
        if self.inserting is None or self.inserting.done():
            await self.settle()
        elif len(self._unsent) >= self._unsent_max:
            # Mongo slower than MySQL for long: the writer slows down to it
            # rather than queue without end, until the pump takes these.
            self._room = asyncio.get_running_loop().create_future()
            await self._room

    async def settle(self) -> None:
        """Collects a pump that ended, then starts one if anything is unsent."""
        if self.inserting is not None:
            await self.inserting
            self.inserting = None
        if not self.ok:
            self._unsent, self._unsent_commits = [], []  # the outbox: the next session copies them
        elif self._unsent:
            self.inserting = asyncio.create_task(self._pump())
        else:
            self.mirrored = self._last_id  # nothing in flight, nothing unsent, nothing failed

    async def drain(self) -> None:
        """Until Mongo holds every message committed, or an insert failed."""
        while self.inserting is not None:
            await self.settle()

    async def _pump(self) -> None:
        try:
            while self._unsent:
                docs = [m.to_doc() for m in self._unsent]
                commits, upto = self._unsent_commits, self._last_id
                self._unsent, self._unsent_commits = [], []
                self._make_room()
                if not await self._insert(docs):
                    self.ok = False
                    return
                self.mirrored = upto
                now = time.monotonic()
                for stamped, count in commits:  # weighted by messages: a quantile of messages, not of batches
                    self._observe_lag(now - stamped, count)
                if len(self._unsent) < INSERT_GAP_BELOW:  # under a flood the next insert goes at once
                    await asyncio.sleep(INSERT_GAP_SECONDS)
        finally:
            self._make_room()  # a commit never waits on a pump that has ended

    def _make_room(self) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_result(None)
        self._room = None


class MessageWriter:
    def __init__(self, engine: Engine, mongo_db: AsyncDatabase, *, batch_max: int, window_ms: float,
                 queue_max: int, timeout_seconds: float, retention_seconds: int,
                 observe_batch: Callable[[int, float], None] = lambda n, s: None,
                 observe_mongo_lag: Callable[[float, int], None] = lambda s, n: None,
                 observe_outbox: Callable[[int, float], None] = lambda n, s: None,
                 handover_check_seconds: float = HANDOVER_CHECK_SECONDS):
        self._engine = engine
        # A thread of its own for its MySQL calls: slow reads elsewhere must not
        # hold a message back (db.threads). One, so that they run in order: a
        # session cancelled while a call is under way (a shutdown) releases the
        # writer lock after that call, never beside it on the same connection
        # (which failed the release and left the lock held by a connection back
        # in the pool: every later session timed out). Sessions never overlap.
        self._threads = Threads(1, "writer")
        self._mongo = mongo_db
        self._batch_max = batch_max
        self._window = window_ms / 1000
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=queue_max)
        self._timeout = timeout_seconds
        self._retention = retention_seconds
        self._observe_batch = observe_batch
        self._observe_mongo_lag = observe_mongo_lag
        self._observe_outbox = observe_outbox  # (messages, age of the oldest in seconds), after each turn
        self._outbox = OutboxWatch()
        self._head_written, self._head_at = 0, 0.0
        self._head_task: asyncio.Task | None = None  # a meta.head write started mid-session
        self._mongo_retry_at = 0.0  # until then, after a failed Mongo write, the outbox waits
        self._handover_check_every = handover_check_seconds
        self._handover_check_at = 0.0  # the next batch's commit asks whether another process waits
        self._in_hand: list[_Pending] = []  # the batch being written: the one to fail if the session breaks

    # --- the request side -------------------------------------------------
    async def submit(self, draft: Draft) -> tuple[Message, bool]:
        """Stores one message; returns (message, created). False = a retry's original."""
        return await self.enqueue(draft)

    def enqueue(self, draft: Draft) -> asyncio.Future:
        """Queues one message; the future resolves as ``submit`` returns or raises.
        (The writer process answers its socket from the future's callback: no task per message.)"""
        future = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Pending(draft, future))
        except asyncio.QueueFull:
            raise WriterOverloaded from None
        return future

    # --- the writer task --------------------------------------------------
    async def run(self, repair_every: float = 1.0) -> None:
        while True:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow
                # a cancel that lands as the get completes, and a shutdown then waits for ever.
                async with asyncio.timeout(repair_every):
                    first = await self._queue.get()
            except TimeoutError:
                first = None  # idle: a session with no batch repairs any outbox
            self._in_hand = await self._next_batch(first) if first else []
            try:
                await self._session(self._in_hand, idle=first is None)
            except Exception as exc:  # one guard: every waiting request gets an answer
                if not isinstance(exc, WriteUnavailable):
                    log.exception("event=writer_session_failed")
                    exc = WriteUnavailable(str(exc))
                _fail(self._in_hand, exc)  # the batch in hand when it failed, not the session's first

    async def _next_batch(self, first: _Pending | None) -> list[_Pending]:
        if first is None:
            if self._queue.empty():
                return []
            first = self._queue.get_nowait()
        if self._window:
            await asyncio.sleep(self._window)  # let concurrent requests join the batch
        batch = [first]
        while len(batch) < self._batch_max and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return batch

    async def _request_or_done(self, inserting: asyncio.Task) -> list[_Pending]:
        """A batch as soon as a request comes, or [] once the insert is done."""
        getter = asyncio.ensure_future(self._queue.get())
        try:
            await asyncio.wait((getter, inserting), return_when=asyncio.FIRST_COMPLETED)
        finally:
            getter.cancel()  # no-op if it has a request already
        try:
            first = await getter
        except asyncio.CancelledError:
            # A cancelled get leaves its request in the queue; but a cancel of
            # this task (a shutdown) that lands here must not be taken for it.
            if getter.cancelled() and not asyncio.current_task().cancelling():
                return []
            raise
        return await self._next_batch(first)

    async def _linger(self, mirror: "_Mirror", conn: Connection) -> list[_Pending]:
        """The next batch: the answered clients' next requests, taken as they
        come while Mongo works (each finished insert hands on what was committed
        meanwhile); [] once Mongo has everything and nobody else asks, or
        another process is queued for the lock."""
        while True:
            batch = await self._next_batch(None)
            if batch or mirror.inserting is None:
                break
            batch = await self._request_or_done(mirror.inserting)
            if batch:
                return batch
            await mirror.settle()
        if batch or await self._mysql(self._others_waiting, conn, True):
            return batch
        return await self._next_batch(None)

    async def _session(self, batch: list[_Pending], idle: bool = False) -> None:
        try:
            conn = await self._threads.run(self._engine.connect)
        except SQLAlchemyError as exc:
            raise WriteUnavailable(f"mysql: {exc.__class__.__name__}") from None
        mirrored, last_id = None, 0
        try:
            last_id, mirrored = await self._mysql(self._lock_and_read_state, conn)
            mongo_ok = True
            if mirrored < last_id:
                self._outbox.seen(last_id - mirrored)
                if time.monotonic() < self._mongo_retry_at:
                    # Mongo failed moments ago: commit to the outbox without
                    # waiting on it again under the lock every API process shares.
                    mongo_ok = False
                else:
                    mirrored, mongo_ok = await self._repair(conn, mirrored, last_id)
            started = checkpointed = time.monotonic()
            mirror = _Mirror(self._insert, mongo_ok, mirrored, last_id, self._batch_max * UNSENT_BATCHES,
                             self._observe_mongo_lag)
            try:
                while batch:
                    try:
                        committed, last_id = await self._mysql(self._commit_batch, conn, batch, last_id)
                    except WriteUnavailable as exc:
                        _fail(batch, exc)
                        break
                    except _CommitFailed as failed:
                        # The session's connection, and the writer lock with it,
                        # may be gone: the session ends, and what did commit is an
                        # outbox that the next session copies to Mongo.
                        await self._settle(failed)
                        break
                    _answer_all(committed)  # stored: MySQL is the permanent store
                    self._observe_batch(len(committed.answers), time.perf_counter() - committed.started)
                    await mirror.add(committed.new_messages, last_id, committed.stamped)
                    if committed.others_waiting or (not mirror.ok and time.monotonic() - started > SESSION_MAX_SECONDS):
                        break
                    if time.monotonic() - checkpointed > CHECKPOINT_SECONDS:
                        await self._mysql(self._mark, conn, mirror.mirrored, last_id)
                        self._hint_head(mirror.mirrored)
                        checkpointed = time.monotonic()
                    batch = self._in_hand = await self._linger(mirror, conn)
                await mirror.drain()
            finally:
                mirrored = mirror.mirrored
            if self._head_due(mirrored, idle):
                await self._advance_head(mirrored)
        finally:
            # shielded: a second cancel must not drop the release from the thread's queue
            await asyncio.shield(self._threads.run(self._mark_and_release, conn, mirrored, last_id))
            if mirrored is not None:
                self._outbox.seen(last_id - mirrored)
            self._report_outbox()

    def _report_outbox(self) -> None:
        now = datetime.now(UTC)
        self._observe_outbox(self._outbox.size, self._outbox.age(now))
        if self._outbox.due_loud(now, time.monotonic()):
            log.error("event=outbox_aging messages=%d age_s=%.0f meaning=the_fast_store_lags_mysql "
                      "delivery=from_mysql_by_the_daemons_gap_check", self._outbox.size, self._outbox.age(now))

    async def _settle(self, failed: _CommitFailed) -> None:
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
            _answer_all(failed.committed)
        else:
            _fail([pending for pending, _msg, _created in failed.committed.answers],
                  WriteOutcomeUnknown("mysql: the commit failed and may have taken"))

    def _rows_present(self, new: list[Message]) -> bool:
        if not new:
            return True  # only retries: nothing was to be written
        with self._engine.connect() as conn:
            rows = conn.execute(select(messages.c.id, messages.c.sender, messages.c.client_msg_id, messages.c.body)
                                .where(messages.c.id.between(new[0].id, new[-1].id))).all()
        # One transaction: all of them or none. Another process may have taken
        # these ids since (a lost connection frees the writer lock): ours only if they match.
        return {tuple(r) for r in rows} == {(m.id, m.sender, m.client_msg_id, m.body) for m in new}

    def close(self) -> None:
        self._threads.close()

    async def _mysql(self, fn, *args):
        try:
            return await self._threads.run(fn, *args)
        except SQLAlchemyError as exc:
            raise WriteUnavailable(f"mysql: {exc.__class__.__name__}") from None

    # --- MySQL steps (run in a thread) -------------------------------------------
    def _lock_and_read_state(self, conn: Connection) -> tuple[int, int]:
        deadline = time.monotonic() + self._timeout
        lock = text("SELECT GET_LOCK(:n, :t)")
        got = 0
        if conn.execute(lock, {"n": NEXT_LOCK_NAME, "t": self._timeout}).scalar() == 1:
            try:
                got = conn.execute(lock, {"n": LOCK_NAME, "t": max(0.0, deadline - time.monotonic())}).scalar()
            finally:
                conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": NEXT_LOCK_NAME})
        conn.commit()
        if got != 1:
            raise WriteUnavailable("mysql: writer lock timeout")
        # The batches do not move stream_state.last_id (one round trip fewer
        # each): the highest id in `messages` is the truth, and a look-up of
        # the primary key's last entry. last_id is recorded with mirrored_upto.
        newest = select(func.max(messages.c.id)).scalar_subquery()
        state = conn.execute(select(func.greatest(stream_state.c.last_id, func.coalesce(newest, 0)),
                                    stream_state.c.mirrored_upto).where(stream_state.c.id == 1)).one()
        conn.commit()
        return state[0], state[1]

    def _commit_batch(self, conn: Connection, batch: list[_Pending], last_id: int) -> tuple[_Committed, int]:
        started = time.perf_counter()
        try:
            # A retry of a stored message is rare (a client that lost an
            # answer), so the batch goes in without looking for them first, one
            # round trip fewer per batch: the unique (sender, client_msg_id)
            # refuses the INSERT if it holds one, and only then are they looked up.
            return self._write_batch(conn, batch, last_id, started, {})
        except IntegrityError:
            return self._write_batch(conn, batch, last_id, started, self._existing(conn, batch))

    def _write_batch(self, conn: Connection, batch: list[_Pending], last_id: int, started: float,
                     known: dict[tuple[str, str], Message]) -> tuple[_Committed, int]:
        """``known``: (sender, client_msg_id) -> the stored original, for the retries in ``batch``."""
        new: list[Message] = []
        answers: list[tuple[_Pending, Message, bool]] = []
        created_at, stamped = now_ms(), time.monotonic()
        for p in batch:
            d = p.draft
            key = (d.sender, d.client_msg_id) if d.client_msg_id else None
            if key in known:  # a retry: answered with the original (or a conflict, see _answer)
                answers.append((p, known[key], False))
                continue
            last_id += 1
            msg = Message(last_id, d.sender, d.recipient, d.body, created_at, d.client_msg_id)
            new.append(msg)
            answers.append((p, msg, True))
            if key:
                known[key] = msg
        try:
            if new:
                conn.execute(messages.insert(), [
                    {"id": m.id, "sender": m.sender, "recipient": m.recipient,
                     "conversation": conversation_key(m.sender, m.recipient), "body": m.body,
                     "client_msg_id": m.client_msg_id, "created_at": m.created_at.replace(tzinfo=None)}
                    for m in new])
        except SQLAlchemyError:
            conn.rollback()
            raise
        try:
            waiting = self._commit(conn)
        except SQLAlchemyError:
            with contextlib.suppress(SQLAlchemyError):
                conn.rollback()  # on a live connection, never commit this later by accident
            raise _CommitFailed(_Committed(new, answers, started, stamped, False)) from None
        return _Committed(new, answers, started, stamped, waiting), last_id

    def _commit(self, conn: Connection) -> bool:
        """Commits a batch; returns whether another process is queued for the
        writer lock, asked in the same transaction every ``handover_check_seconds``."""
        waiting = False
        if time.monotonic() >= self._handover_check_at:
            self._handover_check_at = time.monotonic() + self._handover_check_every
            waiting = self._others_waiting(conn)
        conn.commit()
        return waiting

    @staticmethod
    def _others_waiting(conn: Connection, commit: bool = False) -> bool:
        """Another process is queued for the writer lock (it holds NEXT_LOCK_NAME)."""
        waiting = conn.execute(text("SELECT IS_USED_LOCK(:n)"), {"n": NEXT_LOCK_NAME}).scalar() is not None
        if commit:
            conn.commit()
        return waiting

    @staticmethod
    def _existing(conn: Connection, batch: list[_Pending]) -> dict[tuple[str, str], Message]:
        keys = {(p.draft.sender, p.draft.client_msg_id) for p in batch if p.draft.client_msg_id}
        if not keys:
            return {}
        rows = conn.execute(select(messages).where(
            tuple_(messages.c.sender, messages.c.client_msg_id).in_(list(keys)))).all()
        return {(r.sender, r.client_msg_id): row_to_message(r) for r in rows}

    @staticmethod
    def _mark(conn: Connection, mirrored: int, last_id: int) -> None:
        """Records that Mongo holds every id up to ``mirrored`` (the outbox starts
        after it), and the last id written (for operators: the writer reads it from `messages`)."""
        conn.execute(stream_state.update().where(stream_state.c.id == 1).values(
            mirrored_upto=func.greatest(stream_state.c.mirrored_upto, mirrored),
            last_id=func.greatest(stream_state.c.last_id, last_id)))
        conn.commit()

    def _mark_and_release(self, conn: Connection, mirrored: int | None, last_id: int) -> None:
        try:
            if mirrored is not None:
                self._mark(conn, mirrored, last_id)
            conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": LOCK_NAME})
            conn.commit()
        except SQLAlchemyError:
            log.warning("event=release_failed mirrored_upto=%s", mirrored)
            # Closed, not returned to the pool: the lock dies with the MySQL session.
            conn.invalidate()
        finally:
            conn.close()

    # --- Mongo steps ------------------------------------------------------------
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
            await self._within_timeout(self._mongo[mongo.MESSAGES].insert_many(docs, ordered=ordered))
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
        self._mongo_retry_at = time.monotonic() + MONGO_RETRY_SECONDS
        self._outbox.seen(max(self._outbox.size, len(docs)), docs[0]["created_at"])  # the oldest unsent
        return False

    def _head_due(self, upto: int, idle: bool = False) -> bool:
        """meta.head is only a hint for the daemons' gap check, and every write
        of it is one more oplog entry: at most about once a second (at once
        when idle), and not while Mongo is failing."""
        now = time.monotonic()
        return upto > self._head_written and (idle or now - self._head_at > 1.0) and now >= self._mongo_retry_at

    def _hint_head(self, upto: int) -> None:
        """Moves meta.head in the background (commits go on meanwhile), one write at a time."""
        if self._head_due(upto) and (self._head_task is None or self._head_task.done()):
            self._head_task = asyncio.create_task(self._advance_head(upto))

    async def _advance_head(self, upto: int) -> None:
        try:
            await self._within_timeout(mongo.advance_head(self._mongo, upto))
            self._head_written, self._head_at = upto, time.monotonic()
        except (PyMongoError, TimeoutError):
            # only a hint for the daemons' gap check; a later session writes it again
            self._mongo_retry_at = time.monotonic() + MONGO_RETRY_SECONDS

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
            rows = await self._mysql(lambda c: c.execute(select(messages).where(messages.c.id > mirrored)
                                                         .order_by(messages.c.id).limit(REPAIR_PAGE)).all(), conn)
            if not rows:
                return last_id, True
            docs = [row_to_message(r).to_doc() for r in rows]
            self._outbox.seen(last_id - mirrored, docs[0]["created_at"])
            self._report_outbox()
            # An expired message is not copied back: the sweeper removed it, and the retention floor covers it.
            live = [d for d in docs if d["created_at"] >= cutoff]
            log.warning("event=outbox_repair rows=%d live=%d from_id=%d to_id=%d", len(docs), len(live),
                        docs[0]["_id"], docs[-1]["_id"])
            if live and not await self._insert(live, ordered=False):
                return mirrored, False
            mirrored = docs[-1]["_id"]
        self._outbox.cleared()
        return mirrored, True
