"""The writer's MySQL statements, each run in the writer's one thread.

``MySQLSteps`` is the part of a ``MessageWriter`` that speaks SQL: the lock,
the stream state, a batch's trip (its INSERT, echoes and COMMIT as one query), the checkpoint and the
release, all on the tables and lock of the writer's partition. The decisions
(when to ask for a hand-over, which copies a batch owes) are the core's and
``writer.copies``'; the turn (writer/turn.py) passes them in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy import bindparam, func, select, text, tuple_
from sqlalchemy.engine import Connection, Engine, Row
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from chat.drafts import Draft
from chat.messages import Kind, Message, now_ms
from chat.partitions import MOVER_MARK, LiveMap, SlotMap, lock_name
from chat.write_errors import CopyDeferred, EventRefused, PartitionBusy, WriteUnavailable
from db.partition_map import read_slot_map, tables_of
from db.sql import MESSAGE_COLUMNS, is_deadlock, message_values, partition_map
from db.threads import Threads
from writer import commit_trip, echo_sql, event_sql
from writer.batch import CommitFailed, Committed, Pending
from writer.commit_trip import Trip, TripAnswer, insert_rows
from writer.copies import Copy, Known, OwedRead, copy_message, copy_plan, owed_copies
from writer.events import (
    Facts,
    delivered_rows,
    event_message,
    judge_ack,
    judge_read,
    judge_revision,
    revised,
    unchanged,
)

log = logging.getLogger("chat.writer")

LOCK_NAME = lock_name(0)


@dataclass(frozen=True, slots=True)
class TurnStart:
    """What a turn starts from, read under the lock just taken."""

    last_id: int  # the highest id stored
    mirrored: int  # mirrored_upto: every id up to it is in Mongo
    newer_map: SlotMap | None  # the slot map, if MySQL holds a newer one than the writer's
    owed: OwedRead | None  # the drain of the echoes owed here (a partitioned map only)


def next_lock_name(partition: int) -> str:
    """Held by the process queued for the partition's writer lock while it waits:
    the holder sees it and ends its turn after the batch in hand instead of taking another."""
    return lock_name(partition) + ".next"


NEXT_LOCK_NAME = next_lock_name(0)

DEADLOCK_RETRIES = 3  # InnoDB's victim of a deadlock, rolled back: written again this many times at most


class MySQLSteps:
    """The SQL of one partition's writer (``partition``, of the map ``live`` holds): each
    step is a coroutine that runs its statements on the writer's one MySQL thread."""

    def __init__(self, engine: Engine, *, partition: int, live: LiveMap, timeout_seconds: float,
                 edit_window_seconds: int = 48 * 3600):
        self.engine = engine
        self._edit_window = edit_window_seconds
        self._partition = partition
        self._live = live
        self._timeout = timeout_seconds
        tables = tables_of(partition)
        self._messages, self._stream_state = tables.messages, tables.stream_state
        self._lock, self._next_lock = lock_name(partition), next_lock_name(partition)
        # The statements every turn runs, built once (echo_sql says why).
        # The batches do not move stream_state.last_id (one round trip fewer
        # each): the highest id in `messages` is the truth, and a look-up of
        # the primary key's last entry. last_id is recorded with mirrored_upto.
        # The map's epoch in the same statement: a move's cutover writes the map
        # under this lock, so a turn that holds it routes by the map of now.
        messages, stream_state = self._messages, self._stream_state
        newest = select(func.max(messages.c.id)).scalar_subquery()
        epoch = (select(func.json_value(partition_map.c.slot_map, "$.epoch")).where(partition_map.c.id == 1)
                 .scalar_subquery())
        self._state_read = select(func.greatest(stream_state.c.last_id, func.coalesce(newest, 0)),
                                  stream_state.c.mirrored_upto, epoch,
                                  func.release_lock(self._next_lock)).where(stream_state.c.id == 1)
        self._state_mark = stream_state.update().where(stream_state.c.id == 1).values(
            mirrored_upto=func.greatest(stream_state.c.mirrored_upto, bindparam("mirrored_to")),
            last_id=func.greatest(stream_state.c.last_id, bindparam("last_id_to")))
        # A thread of its own for its MySQL calls: slow reads elsewhere must not
        # hold a message back (db.threads). One, so that they run in order: a
        # turn cancelled while a call is under way (a shutdown) releases the
        # writer lock after that call, never beside it on the same connection
        # (which failed the release and left the lock held by a connection back
        # in the pool: every later turn timed out). Turns never overlap.
        self._threads = Threads(1, "writer")

    def close(self) -> None:
        self._threads.close()

    # --- the steps, as a turn awaits them ------------------------------------
    async def connect(self) -> Connection:
        """The connection of one turn; a MySQL error is ``WriteUnavailable``."""
        return await self._run(self.engine.connect)

    async def lock_and_read_state(self, conn: Connection, drain_limit: int, handed_before: int) -> TurnStart:
        """The lock taken, what the turn starts from (``TurnStart``); ``handed_before``: see ``OwedRead``."""
        return await self._run(self._lock_and_read_state, conn, drain_limit, handed_before)

    async def commit_batch(self, conn: Connection, batch: list[Pending], last_id: int,
                           ask_others: bool) -> tuple[Committed, int]:
        """Writes and commits ``batch`` after ``last_id``; ``ask_others``: whether
        its transaction asks if another process is queued for the lock (the core's ``handover_check_due``)."""
        return await self._run(self._commit_batch, conn, batch, last_id, ask_others)

    async def others_waiting(self, conn: Connection) -> bool:
        return await self._run(self._others_waiting, conn, True)

    async def mark(self, conn: Connection, mirrored: int, last_id: int) -> None:
        await self._run(self._mark, conn, mirrored, last_id)

    async def mark_alone(self, mirrored: int, last_id: int) -> None:
        await self._threads.run(self._mark_alone, mirrored, last_id)

    async def release(self, conn: Connection, mirrored: int | None, last_id: int) -> None:
        """Records ``mirrored`` (unless None), releases the writer lock and closes ``conn``."""
        # shielded: a second cancel must not drop the release from the thread's queue
        await asyncio.shield(self._threads.run(self._mark_and_release, conn, mirrored, last_id))

    async def outbox_page(self, conn: Connection, after: int, limit: int) -> list[Row]:
        return await self._run(self._outbox_page, conn, after, limit)

    async def found_committed(self, new: list[Message]) -> bool:
        """Whether a batch whose COMMIT failed is stored after all; False when MySQL cannot say."""
        try:
            return await self._threads.run(self._rows_present, new)
        except SQLAlchemyError:
            return False

    async def _run(self, fn, *args):
        """``fn(*args)`` on the writer's one MySQL thread; a MySQL error is ``WriteUnavailable``."""
        try:
            return await self._threads.run(fn, *args)
        except SQLAlchemyError as exc:
            # the server's error number (1969: a statement past max_statement_time; 2013: the link lost)
            code = getattr(getattr(exc, "orig", None), "args", (None,))[:1]
            raise WriteUnavailable(f"mysql: {exc.__class__.__name__}{' ' + str(code[0]) if code else ''}") from None

    # --- the statements, run in the thread ---------------------------------------
    def _lock_and_read_state(self, conn: Connection, drain_limit: int, handed_before: int) -> TurnStart:
        """Takes the writer lock (queued behind the next-lock) and reads what the
        turn starts from, in as few round trips as the lock's holder can: each is
        one more that every other host's writer of the partition waits. The
        next-lock is let go in the read's statement; a partitioned map's drain of
        up to ``drain_limit`` echoes follows in the read's transaction, and one
        COMMIT ends both (the GET_LOCKs touch no table, so the read's snapshot is
        taken after the lock). GET_LOCK answers 0 when the wait ran out with the
        lock still held by another session (another writer, of another host):
        ``PartitionBusy``, not "MySQL unavailable"; NULL on an error."""
        started = time.monotonic()
        wait = _LockWait(started + self._timeout)
        got = self._wait_for(conn, self._next_lock, wait)
        if got == 1:
            locked = None
            try:
                locked = self._wait_for(conn, self._lock, wait)
            finally:
                if locked != 1:  # held, the next-lock is let go in the read below
                    conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": self._next_lock})
            got = locked
        if got != 1:
            conn.commit()
            if got == 0:
                log.warning("event=writer_lock_timeout partition=%d waited_s=%.1f "
                            "meaning=another_writer_held_the_lock answer=partition_busy", self._partition,
                            time.monotonic() - started)
                raise PartitionBusy(f"partition {self._partition}: another writer held its lock for "
                                    f"{self._timeout:g} s")
            raise WriteUnavailable("mysql: GET_LOCK failed")
        try:
            state = conn.execute(self._state_read).one()
        except SQLAlchemyError:
            # the session may live on (a statement's time-out): the next-lock must not stay with it
            with contextlib.suppress(SQLAlchemyError):
                conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": self._next_lock})
            raise
        found = None
        if state[2] is not None and int(state[2]) > self._live.current.epoch:
            found = read_slot_map(conn)
        slot_map = found or self._live.current
        owed = None
        if slot_map.partitions > 1:
            owed = echo_sql.leftover_copies(conn, self._partition, drain_limit, slot_map, handed_before)  # commits
        else:
            conn.commit()
        return TurnStart(state[0], state[1], found, owed)

    def _wait_for(self, conn: Connection, name: str, wait: _LockWait) -> int | None:
        """GET_LOCK of ``name`` until the wait's deadline; if a move's session holds it then, once per
        turn, the deadline moves a timeout on: a move holds a partition's writers for a page or its
        cutover, then lets go, and a user whose slot does not move must not be refused for it. Two
        timeouts of lock waits and the commit's fit in the reply's own deadline (``WriterClient``'s
        in the API and daemons: three timeouts and the writer's connect wait)."""
        got = _get_lock(conn, name, max(0.0, wait.deadline - time.monotonic()))
        if got == 0 and not wait.extended and _held_by_mover(conn, name):
            log.info("event=writer_waits_for_move partition=%d lock=%s", self._partition, name)
            wait.extended, wait.deadline = True, time.monotonic() + self._timeout
            got = _get_lock(conn, name, self._timeout)
        return got

    def _commit_batch(self, conn: Connection, batch: list[Pending], last_id: int,
                      ask_others: bool) -> tuple[Committed, int]:
        started = time.perf_counter()
        for attempt in range(DEADLOCK_RETRIES + 1):
            try:
                try:
                    # A retry of a stored message is rare (a client that lost an
                    # answer), so the batch goes in without looking for them first, one
                    # round trip fewer per batch: the unique (sender, client_msg_id)
                    # refuses the INSERT if it holds one, and only then are they looked up.
                    return self._write_batch(conn, batch, last_id, started, Known.nothing(), ask_others)
                except IntegrityError:
                    return self._write_batch(conn, batch, last_id, started, self._existing(conn, batch), ask_others)
            except OperationalError as exc:
                # Writers of two partitions meet in `echoes` (each records the copies it owes the
                # other and clears those it made), and InnoDB may pick one as a deadlock's victim:
                # its transaction is rolled back whole, nothing of it is answered yet, so it is
                # written again, as InnoDB's manual says to.
                if not is_deadlock(exc) or attempt == DEADLOCK_RETRIES:
                    raise
                log.info("event=batch_deadlock_retried partition=%d attempt=%d", self._partition, attempt + 1)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _write_batch(self, conn: Connection, batch: list[Pending], last_id: int, started: float,
                     known: Known, ask_others: bool) -> tuple[Committed, int]:
        """``known``: what the table holds of the retries and copies in ``batch``."""
        new: list[Message] = []
        answers: list[tuple[Pending, Message, bool]] = []
        refused: list[tuple[Pending, Exception]] = []
        created_at, stamped = now_ms(), time.monotonic()
        events = event_sql.has_events(batch)
        try:
            facts = event_sql.read_facts(conn, self._messages, batch, last_id) if events else None
            translated = event_sql.copy_refs(conn, self._partition, batch) if events else {}
        except SQLAlchemyError:
            conn.rollback()
            raise
        copied_before: list[tuple[int, int]] = []  # their echo rows are paid too
        for p in batch:
            d = p.draft
            if isinstance(d, Copy):
                write, keep_key = copy_plan(d, known)
                if not write:  # copied already: by another offer of it, earlier in this batch, or a move
                    answers.append((p, known.copies[d.origin], False))
                    copied_before.append(d.origin)
                    continue
                ref_id = None
                if d.original.kind:
                    ref_id = _translated_ref(d, translated, known)
                    if ref_id is None:  # its message is not copied here yet: the echo stays for a later drain
                        refused.append((p, CopyDeferred(f"copy of {d.origin}: its message is not here yet")))
                        continue
                last_id += 1
                msg = copy_message(d, last_id, keep_key, ref_id)
                known.copies[d.origin] = msg
                key = (msg.sender, msg.client_msg_id) if msg.client_msg_id else None
            else:
                key = (d.sender, d.client_msg_id) if d.client_msg_id else None
                if key in known.originals:  # a retry: answered with the original (or a conflict, see batch.answer)
                    answers.append((p, known.originals[key], False))
                    continue
                if d.kind:
                    assert facts is not None
                    try:
                        event = self._judge(d, facts, last_id + 1, created_at)
                    except EventRefused as exc:
                        refused.append((p, exc))
                        continue
                    if event.id == 0:  # nothing new to write: the marker or position stands
                        answers.append((p, event, False))
                        continue
                    msg = event
                else:
                    msg = Message(last_id + 1, d.sender, d.recipient, d.body, created_at, d.client_msg_id)
                last_id += 1
            new.append(msg)
            answers.append((p, msg, True))
            if key:
                known.originals[key] = msg
        devices: dict[tuple[str, str], int] = {}
        if facts is not None:
            devices = self._acked(batch, facts, answers)
            for user, before, after in self._acks_moved(batch, facts):
                for peer, upto in delivered_rows(user, facts, before, after):
                    last_id += 1
                    new.append(Message(last_id, user, peer, "", created_at, None, kind=Kind.DELIVERED, ref_id=upto))
        owed = owed_copies(new, self._partition, self._live.current)
        # The rows, the echoes and the COMMIT in one round trip (writer/commit_trip.py). An
        # event batch read its facts through SQLAlchemy, whose transaction it is: its effects
        # follow the trip (an edit's copy may name a copy in the trip's rows) the same way,
        # and SQLAlchemy commits.
        runs = commit_trip.in_runs(message_values(m) for m in new)
        trip = Trip()
        if runs:
            trip.add(*insert_rows(self._messages.name, MESSAGE_COLUMNS, runs[-1]))
        if new or copied_before:
            echo_sql.settle_echoes(trip, self._partition, owed, new, copied_before)
        if ask_others:
            trip.ask("SELECT IS_USED_LOCK(%s)", (self._next_lock,))
        # SQLAlchemy's transaction (an event batch's facts, a retry's look-up) is SQLAlchemy's to
        # end; so is an event batch's always, for its effects come after the trip.
        committed_by_trip = not events and not conn.in_transaction()
        if committed_by_trip:
            trip.commit()
        try:
            for run in runs[:-1]:  # too much for one query: the first rows go ahead, in the transaction
                ahead = Trip()
                ahead.add(*insert_rows(self._messages.name, MESSAGE_COLUMNS, run))
                self._send(conn, ahead)
            sent = self._send(conn, trip) if trip.statements else TripAnswer(None)
            if events:
                event_sql.write_effects(conn, self._messages, new, devices)
        except SQLAlchemyError:
            conn.rollback()
            raise
        except commit_trip.CommitUnknown:
            commit_trip.roll_back(conn)  # on a live connection, never commit this later by accident
            raise CommitFailed(Committed(new, answers, started, stamped, False, owed, refused)) from None
        if not committed_by_trip:
            try:
                conn.commit()
            except SQLAlchemyError:
                with contextlib.suppress(SQLAlchemyError):
                    conn.rollback()  # on a live connection, never commit this later by accident
                raise CommitFailed(Committed(new, answers, started, stamped, False, owed, refused)) from None
        waiting = ask_others and sent.asked is not None
        return Committed(new, answers, started, stamped, waiting, owed, refused), last_id

    def _judge(self, d: Draft, facts: Facts, next_id: int, created_at: datetime) -> Message:
        """The row an event draft writes (id ``next_id``), one with id 0 when it
        writes none, or its refusal (``EventRefused``)."""
        if d.kind in (Kind.EDIT, Kind.DELETE):
            original = judge_revision(d, facts, created_at, self._edit_window)
            revised(original, d.kind)
            return event_message(d, next_id, original.recipient, created_at, d.ref_id or 0)
        if d.kind == Kind.READ:
            upto = judge_read(d, facts)
            marker = facts.markers.get((d.sender, d.recipient), 0)
            if upto <= marker:
                return unchanged(d, marker)
            facts.markers[(d.sender, d.recipient)] = upto
            return event_message(d, next_id, d.recipient, created_at, upto)
        judge_ack(d, facts)
        return unchanged(d, 0)  # answered with the device's position once the batch's acks are counted

    @staticmethod
    def _acked(batch: list[Pending], facts: Facts, answers: list[tuple[Pending, Message, bool]]) -> dict:
        """The devices' positions the batch's accepted acks move, and each ack's answer: its device's position."""
        moved: dict[tuple[str, str], int] = {}
        for p in batch:
            d = p.draft
            if not isinstance(d, Copy) and d.kind == Kind.ACK:
                device = (d.sender, d.recipient)
                if (d.ref_id or 0) > facts.devices.get(device, 0) and (d.ref_id or 0) <= facts.last_id:
                    facts.devices[device] = moved[device] = d.ref_id or 0
        for i, (pending, msg, created) in enumerate(answers):
            if msg.kind == Kind.ACK:  # a new Message in its place: none is changed once made
                answers[i] = (pending, replace(msg, ref_id=facts.devices.get((msg.sender, msg.recipient), 0)), created)
        return moved

    @staticmethod
    def _acks_moved(batch: list[Pending], facts: Facts) -> list[tuple[str, int, int]]:
        """(user, highest position before, after) of each user whose highest position the batch's acks move."""
        after: dict[str, int] = {}
        for (user, _device), upto in facts.devices.items():
            after[user] = max(after.get(user, 0), upto)
        moved = [(user, facts.acked.get(user, 0), upto) for user, upto in after.items()
                 if upto > facts.acked.get(user, 0)]
        for user, _before, upto in moved:
            facts.acked[user] = upto
        return sorted(moved)

    def _send(self, conn: Connection, trip: Trip) -> TripAnswer:
        return commit_trip.send(conn, trip)

    def _others_waiting(self, conn: Connection, commit: bool = False) -> bool:
        """Another process is queued for the writer lock (it holds the next-lock)."""
        waiting = conn.execute(text("SELECT IS_USED_LOCK(:n)"), {"n": self._next_lock}).scalar() is not None
        if commit:
            conn.commit()
        return waiting

    def _existing(self, conn: Connection, batch: list[Pending]) -> Known:
        messages = self._messages
        keys = {(p.draft.sender, p.draft.client_msg_id) for p in batch if p.draft.client_msg_id}
        origins = {p.draft.origin for p in batch if isinstance(p.draft, Copy)}
        known = Known.nothing()
        if keys:
            rows = conn.execute(select(messages).where(
                tuple_(messages.c.sender, messages.c.client_msg_id).in_(list(keys)))).all()
            known.originals = {(r.sender, r.client_msg_id): Message.from_row(r) for r in rows}
        if origins:
            rows = conn.execute(select(messages).where(
                tuple_(messages.c.origin_part, messages.c.origin_id).in_(list(origins)))).all()
            known.copies = {(r.origin_part, r.origin_id): Message.from_row(r) for r in rows}
        return known

    def _mark(self, conn: Connection, mirrored: int, last_id: int) -> None:
        """Records that Mongo holds every id up to ``mirrored`` (the outbox starts
        after it), and the last id written (for operators: the writer reads it from `messages`)."""
        conn.execute(self._state_mark, {"mirrored_to": mirrored, "last_id_to": last_id})
        conn.commit()

    def _mark_alone(self, mirrored: int, last_id: int) -> None:
        """``_mark`` outside any turn, on a connection of its own: what a Mongo
        call left in flight at a hand-over proved once it succeeded. Both values
        only ever grow (GREATEST), so it may land before or after any turn's."""
        try:
            with self.engine.connect() as conn:
                self._mark(conn, mirrored, last_id)
        except SQLAlchemyError as exc:
            # the rows stay the outbox: a later turn copies them again (duplicates, counted as stored)
            log.warning("event=mirrored_upto_not_recorded error=%s mirrored_upto=%d", exc.__class__.__name__, mirrored)

    def _mark_and_release(self, conn: Connection, mirrored: int | None, last_id: int) -> None:
        try:
            if mirrored is not None:
                self._mark(conn, mirrored, last_id)
            conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": self._lock})
            conn.commit()
        except SQLAlchemyError:
            log.warning("event=release_failed mirrored_upto=%s", mirrored)
            # Closed, not returned to the pool: the lock dies with the MySQL session.
            conn.invalidate()
        finally:
            conn.close()

    def _outbox_page(self, conn: Connection, after: int, limit: int) -> list[Row]:
        """The next ``limit`` rows of the outbox past ``after``, oldest first (by primary key).
        Committed, so that the turn's next batch commits in its own trip (``_write_batch``)."""
        messages = self._messages
        rows = list(conn.execute(select(messages).where(messages.c.id > after)
                                 .order_by(messages.c.id).limit(limit)).all())
        conn.commit()
        return rows

    def _rows_present(self, new: list[Message]) -> bool:
        """Whether a batch whose COMMIT failed is stored after all, read on a fresh connection."""
        if not new:
            return True  # only retries: nothing was to be written
        messages = self._messages
        with self.engine.connect() as conn:
            rows = conn.execute(select(messages.c.id, messages.c.sender, messages.c.client_msg_id, messages.c.body)
                                .where(messages.c.id.between(new[0].id, new[-1].id))).all()
        # One transaction: all of them or none. Another process may have taken
        # these ids since (a lost connection frees the writer lock): ours only if they match.
        return {tuple(r) for r in rows} == {(m.id, m.sender, m.client_msg_id, m.body) for m in new}


# MariaDB's ER_STATEMENT_TIMEOUT. make_engine sets max_statement_time to the
# same timeout as the lock's wait, and a GET_LOCK the statement limit ends first
# answers NULL or this error instead of 0: "MySQL failed" where the lock was only
# held elsewhere. So the lock's statement gets a limit of its own, a second past
# its wait, and this error still reads as the lock held elsewhere.
STATEMENT_TIMEOUT = 1969


def _get_lock(conn: Connection, name: str, wait: float) -> int | None:
    """GET_LOCK's answer: 1 taken, 0 still held elsewhere when ``wait`` ran out, None an error."""
    limit = f"{wait + 1:.3f}"  # a number of ours, not input: a statement's limit takes no parameter
    try:
        return conn.execute(text(f"SET STATEMENT max_statement_time={limit} FOR SELECT GET_LOCK(:n, :t)"),
                            {"n": name, "t": wait}).scalar()
    except OperationalError as exc:
        if exc.orig is not None and exc.orig.args and exc.orig.args[0] == STATEMENT_TIMEOUT:
            return 0
        raise


@dataclass(slots=True)
class _LockWait:
    """One turn's wait for the writer lock: its deadline, and whether a move's hold has moved it on."""

    deadline: float
    extended: bool = False


def _held_by_mover(conn: Connection, name: str) -> bool:
    """Whether the session that holds ``name`` is a move's (it holds its ``MOVER_MARK`` lock)."""
    return conn.execute(text("SELECT IS_USED_LOCK(CONCAT(:mark, IS_USED_LOCK(:n))) IS NOT NULL"),
                        {"mark": MOVER_MARK, "n": name}).scalar() == 1


def _translated_ref(copy: Copy, translated: dict[tuple[int, int], int], known: Known) -> int | None:
    """An event copy's ``ref`` in this partition's ids, or None while its message is not here
    (``event_sql.copy_refs``; or copied earlier in this very batch, which ``known`` holds)."""
    key = (copy.from_part, copy.original.ref_id or 0)
    if key in translated:
        return translated[key]
    in_batch = known.copies.get(key)
    return None if in_batch is None else in_batch.id
