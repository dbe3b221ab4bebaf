"""Group commit of new messages into MySQL, then MongoDB, in one global order.

Every API process funnels its requests into one ``MessageWriter``. A batch
(all requests queued within a few milliseconds) is written under the MySQL
named lock ``chat.writer``, which all API processes share:

1. lock; read ``stream_state`` (last_id, mirrored_upto);
2. repair: copy any outbox rows (mirrored_upto, last_id] to Mongo first;
3. resolve retries by (sender, client_msg_id); give new messages the ids
   last_id+1, last_id+2, ... and commit them to MySQL in one transaction;
4. ``insert_many`` the new documents into Mongo, in id order;
5. advance mirrored_upto; unlock.

Why a lock across both stores: ids are gap-free and become visible in Mongo
(and its oplog) strictly in id order. A daemon that has seen id N therefore
knows every id <= N is readable, and a gap in the ids it sees is a message it
missed, never one that is still in flight. That is what makes catch-up exact.

MySQL commits first, so a message is never in Mongo but not in MySQL. If the
Mongo write fails or the process dies before it, the committed rows are the
outbox; the next batch (or the idle repair tick) copies them before anything
newer, so the order above still holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, PyMongoError
from sqlalchemy import select, text, tuple_
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from chat.messages import Message, now_ms
from db import mongo
from db.sql import conversation_key, messages, stream_state

log = logging.getLogger("chat.writer")

LOCK_NAME = "chat.writer"
REPAIR_PAGE = 2000


class WriteUnavailable(Exception):
    """MySQL is down, slow or locked past the timeout: nothing was stored."""


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
class _Planned:
    """What the MySQL step decided, handed to the Mongo step."""
    repair_docs: list[dict]
    new_messages: list[Message]
    last_id: int
    answers: list[tuple[_Pending, Message, bool]]


def row_to_message(row) -> Message:
    created = row.created_at.replace(tzinfo=UTC)
    return Message(row.id, row.sender, row.recipient, row.body, created, row.client_msg_id)


class MessageWriter:
    def __init__(self, engine: Engine, mongo_db: AsyncDatabase, *, batch_max: int, window_ms: float,
                 queue_max: int, timeout_seconds: float, retention_seconds: int,
                 observe_batch: Callable[[int, float], None] = lambda n, s: None):
        self._engine = engine
        self._mongo = mongo_db
        self._batch_max = batch_max
        self._window = window_ms / 1000
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=queue_max)
        self._timeout = timeout_seconds
        self._retention = retention_seconds
        self._observe_batch = observe_batch
        self._outbox_suspected = True  # check at start: a previous process may have died mid-batch

    # --- the request side -------------------------------------------------
    async def submit(self, draft: Draft) -> tuple[Message, bool]:
        """Stores one message; returns (message, created). False = a retry's original."""
        future = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Pending(draft, future))
        except asyncio.QueueFull:
            raise WriterOverloaded from None
        return await future

    # --- the writer task --------------------------------------------------
    async def run(self, repair_every: float = 1.0) -> None:
        while True:
            try:
                first = await asyncio.wait_for(self._queue.get(), timeout=repair_every)
            except TimeoutError:
                if self._outbox_suspected:
                    await self._safe_batch([])
                continue
            if self._window:
                await asyncio.sleep(self._window)  # let concurrent requests join the batch
            batch = [first]
            while len(batch) < self._batch_max and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._safe_batch(batch)

    async def _safe_batch(self, batch: list[_Pending]) -> None:
        started = time.perf_counter()
        try:
            await self._write(batch)
        except Exception as exc:  # one guard: every waiting request gets an answer
            if not isinstance(exc, WriteUnavailable):
                log.exception("event=batch_failed size=%d", len(batch))
                exc = WriteUnavailable(str(exc))
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(exc)
        finally:
            if batch:
                self._observe_batch(len(batch), time.perf_counter() - started)

    async def _write(self, batch: list[_Pending]) -> None:
        try:
            conn = await asyncio.to_thread(self._engine.connect)
        except SQLAlchemyError as exc:
            raise WriteUnavailable(f"mysql: {exc.__class__.__name__}") from None
        try:
            try:
                plan = await asyncio.to_thread(self._commit_to_mysql, conn, batch)
            except SQLAlchemyError as exc:
                raise WriteUnavailable(f"mysql: {exc.__class__.__name__}") from None
            # The rows are committed: from here on every request succeeds,
            # whatever happens to Mongo (the outbox covers it).
            mirrored = await self._copy_to_mongo(plan)
            for pending, msg, created in plan.answers:
                _answer(pending, msg, created)
            if mirrored is not None:
                try:
                    await asyncio.to_thread(self._mark_mirrored, conn, mirrored)
                except SQLAlchemyError:
                    log.warning("event=mark_mirrored_failed upto=%d", mirrored)
                    self._outbox_suspected = True
        finally:
            await asyncio.to_thread(self._release, conn)

    def _commit_to_mysql(self, conn: Connection, batch: list[_Pending]) -> _Planned:
        got = conn.execute(text("SELECT GET_LOCK(:n, :t)"), {"n": LOCK_NAME, "t": self._timeout}).scalar()
        if got != 1:
            conn.rollback()
            raise WriteUnavailable("mysql: writer lock timeout")
        state = conn.execute(select(stream_state.c.last_id, stream_state.c.mirrored_upto)
                             .where(stream_state.c.id == 1)).one()
        last_id, mirrored = state.last_id, state.mirrored_upto
        repair_docs: list[dict] = []
        if mirrored < last_id:
            rows = conn.execute(select(messages).where(messages.c.id > mirrored)
                                .order_by(messages.c.id).limit(REPAIR_PAGE)).all()
            repair_docs = [row_to_message(r).to_doc() for r in rows]
        known = self._existing(conn, batch)  # (sender, client_msg_id) -> (message, stored before?)
        new: list[Message] = []
        answers: list[tuple[_Pending, Message, bool]] = []
        created_at = now_ms()
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
        if new:
            conn.execute(messages.insert(), [
                {"id": m.id, "sender": m.sender, "recipient": m.recipient,
                 "conversation": conversation_key(m.sender, m.recipient), "body": m.body,
                 "client_msg_id": m.client_msg_id, "created_at": m.created_at.replace(tzinfo=None)}
                for m in new])
            conn.execute(stream_state.update().where(stream_state.c.id == 1).values(last_id=last_id))
        conn.commit()
        return _Planned(repair_docs, new, last_id, answers)

    @staticmethod
    def _existing(conn: Connection, batch: list[_Pending]) -> dict[tuple[str, str], Message]:
        keys = {(p.draft.sender, p.draft.client_msg_id) for p in batch if p.draft.client_msg_id}
        if not keys:
            return {}
        rows = conn.execute(select(messages).where(
            tuple_(messages.c.sender, messages.c.client_msg_id).in_(list(keys)))).all()
        return {(r.sender, r.client_msg_id): row_to_message(r) for r in rows}

    async def _copy_to_mongo(self, plan: _Planned) -> int | None:
        """Inserts repair rows then new rows, in id order. Returns the new
        mirrored_upto, or None if Mongo failed (the rows stay in the outbox)."""
        coll = self._mongo[mongo.MESSAGES]
        docs = plan.repair_docs
        try:
            if docs:
                # Part of the outbox may already be in Mongo (a crash mid-insert):
                # insert only what is missing, still in id order.
                lo, hi = docs[0]["_id"], docs[-1]["_id"]
                present = {d["_id"] async for d in coll.find({"_id": {"$gte": lo, "$lte": hi}}, {"_id": 1})}
                cutoff = mongo.expired_before(self._retention)
                missing = [d for d in docs if d["_id"] not in present and d["created_at"] >= cutoff]
                log.warning("event=outbox_repair rows=%d missing=%d from_id=%d to_id=%d",
                            len(docs), len(missing), lo, hi)
                if missing:
                    await asyncio.wait_for(coll.insert_many(missing, ordered=True), self._timeout)
                if plan.new_messages and hi < plan.new_messages[0].id - 1:
                    # The outbox is longer than one page: keep order, leave the
                    # new rows to the next batch's repair.
                    self._outbox_suspected = True
                    return hi
            if plan.new_messages:
                await asyncio.wait_for(
                    coll.insert_many([m.to_doc() for m in plan.new_messages], ordered=True), self._timeout)
            self._outbox_suspected = False
            return plan.last_id
        except (PyMongoError, BulkWriteError, TimeoutError) as exc:
            log.warning("event=mongo_write_failed error=%s outbox_upto=%d", exc.__class__.__name__, plan.last_id)
            self._outbox_suspected = True
            return None

    def _mark_mirrored(self, conn: Connection, upto: int) -> None:
        conn.execute(stream_state.update().where(stream_state.c.id == 1)
                     .where(stream_state.c.mirrored_upto < upto).values(mirrored_upto=upto))
        conn.commit()

    @staticmethod
    def _release(conn: Connection) -> None:
        try:
            conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": LOCK_NAME})
            conn.commit()
        except SQLAlchemyError:
            pass  # the lock dies with the session anyway
        finally:
            conn.close()


def _answer(pending: _Pending, msg: Message, created: bool) -> None:
    if pending.future.done():
        return
    d = pending.draft
    if not created and (msg.recipient, msg.body) != (d.recipient, d.body):
        pending.future.set_exception(ClientIdConflict(msg))
    else:
        pending.future.set_result((msg, created))
