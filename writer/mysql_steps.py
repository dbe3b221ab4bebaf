"""The writer's MySQL statements, each run in the writer's one thread.

``MySQLSteps`` is the half of ``MessageWriter`` that speaks SQL: the lock,
the stream state, a batch's INSERT and COMMIT, the checkpoint and the
release. The decisions (when to ask for a hand-over) are the core's.
"""

from __future__ import annotations

import contextlib
import logging
import time

from sqlalchemy import func, select, text, tuple_
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from chat.messages import Message, now_ms
from chat.write_errors import WriteUnavailable
from db.sql import conversation_key, messages, row_to_message, stream_state
from writer.batch import CommitFailed, Committed, Pending
from writer.core import REPAIR_PAGE, WriterCore

log = logging.getLogger("chat.writer")

LOCK_NAME = "chat.writer"
# Held by the process queued for LOCK_NAME while it waits: the holder sees it
# and ends its turn after the batch in hand instead of taking another.
NEXT_LOCK_NAME = "chat.writer.next"


class MySQLSteps:
    _engine: Engine
    _timeout: float
    _core: WriterCore

    def _lock_and_read_state(self, conn: Connection) -> tuple[int, int]:
        """Takes the writer lock (queued behind NEXT_LOCK_NAME); returns (last_id, mirrored_upto)."""
        deadline = time.monotonic() + self._timeout
        lock = text("SELECT GET_LOCK(:n, :t)")
        got = 0
        if conn.execute(lock, {"n": NEXT_LOCK_NAME, "t": self._timeout}).scalar() == 1:
            try:
                got = conn.execute(lock, {"n": LOCK_NAME, "t": max(0.0, deadline - time.monotonic())}).scalar() or 0
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

    def _commit_batch(self, conn: Connection, batch: list[Pending], last_id: int) -> tuple[Committed, int]:
        started = time.perf_counter()
        try:
            # A retry of a stored message is rare (a client that lost an
            # answer), so the batch goes in without looking for them first, one
            # round trip fewer per batch: the unique (sender, client_msg_id)
            # refuses the INSERT if it holds one, and only then are they looked up.
            return self._write_batch(conn, batch, last_id, started, {})
        except IntegrityError:
            return self._write_batch(conn, batch, last_id, started, self._existing(conn, batch))

    def _write_batch(self, conn: Connection, batch: list[Pending], last_id: int, started: float,
                     known: dict[tuple[str, str], Message]) -> tuple[Committed, int]:
        """``known``: (sender, client_msg_id) -> the stored original, for the retries in ``batch``."""
        new: list[Message] = []
        answers: list[tuple[Pending, Message, bool]] = []
        created_at, stamped = now_ms(), time.monotonic()
        for p in batch:
            d = p.draft
            key = (d.sender, d.client_msg_id) if d.client_msg_id else None
            if key in known:  # a retry: answered with the original (or a conflict, see batch.answer)
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
            raise CommitFailed(Committed(new, answers, started, stamped, False)) from None
        return Committed(new, answers, started, stamped, waiting), last_id

    def _commit(self, conn: Connection) -> bool:
        """Commits a batch; returns whether another process is queued for the
        writer lock, asked in the same transaction when the core says it is due."""
        waiting = self._core.handover_check_due(time.monotonic()) and self._others_waiting(conn)
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
    def _existing(conn: Connection, batch: list[Pending]) -> dict[tuple[str, str], Message]:
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

    @staticmethod
    def _outbox_page(conn: Connection, after: int) -> list[Row]:
        """The next REPAIR_PAGE rows of the outbox past ``after``, oldest first (by primary key)."""
        return list(conn.execute(select(messages).where(messages.c.id > after)
                                 .order_by(messages.c.id).limit(REPAIR_PAGE)).all())

    def _rows_present(self, new: list[Message]) -> bool:
        """Whether a batch whose COMMIT failed is stored after all, read on a fresh connection."""
        if not new:
            return True  # only retries: nothing was to be written
        with self._engine.connect() as conn:
            rows = conn.execute(select(messages.c.id, messages.c.sender, messages.c.client_msg_id, messages.c.body)
                                .where(messages.c.id.between(new[0].id, new[-1].id))).all()
        # One transaction: all of them or none. Another process may have taken
        # these ids since (a lost connection frees the writer lock): ours only if they match.
        return {tuple(r) for r in rows} == {(m.id, m.sender, m.client_msg_id, m.body) for m in new}
