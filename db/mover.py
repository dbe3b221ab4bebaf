"""A move of slots between partitions, at the edge: its statements on MySQL and its inserts into the fast store.

``chat.moves`` decides what a move copies where; this module does it, in steps
that each keep what they did (docs/decisions/online-moves.md):

1. ``begin``: the move in progress is row ``MOVE_ROW`` of ``partition_map``
   (the plan and, per source, the id its rows are copied up to). A mover that
   dies is rerun and resumes from there.
2. ``copy_pass``: each source's rows past its mark that name a moving user, a
   page at a time, are copied into their targets. A target is written under
   its writer lock (taken as a writer takes it, so the holder ends its turn),
   one page at a time: the target's writers pause for a page, and ids stay
   gap-free and in commit order. The unique origin of every messages table,
   checked first, makes a rerun copy nothing twice. The page's documents go to
   the target's collection before the lock is released; if that fails they are
   the target's outbox, which its writer's next turn repairs.
3. ``cutover``: with every source's and target's writer lock held (only those
   partitions' writes wait), the last rows are copied, the moved users' read
   markers and devices' positions are translated into their new partition's
   ids, the copies still owed to a source for a moved recipient (``echoes``)
   are sent to the target instead, and the map of the next epoch replaces the
   old one, all in one transaction with the end of the move in progress.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import pymongo
from pymongo.errors import BulkWriteError, PyMongoError
from sqlalchemy import func, or_, select, text, tuple_
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

from chat.messages import Kind, Message
from chat.moves import MovePlan, Progress, copy_targets, origin_of
from chat.partitions import MOVER_MARK, SLOTS, SlotMap, collection_name, lock_name
from db.mongo import expired_before
from db.partition_map import read_slot_map, tables_of, write_slot_map
from db.sql import device_acks, echoes, is_deadlock, message_row, partition_map, read_markers

log = logging.getLogger("chat.mover")

MOVE_ROW = 2  # the row of partition_map that holds the move in progress (row 1 is the map)
PAGE = 500  # rows of a source read, and copied, per step
DEADLOCK_RETRIES = 3  # a step InnoDB rolled back as a deadlock's victim is done again this many times at most
MIRROR_SECONDS = 0.5  # how long a page's insert into the fast store may hold the target's writers
LOCK_WAIT_SECONDS = 30.0  # a writer's turn ends once it sees the mover queued: this is for a MySQL that is slow


class MoveRefused(Exception):
    """What stands in the way of a move (the message says)."""


@dataclass(frozen=True, slots=True)
class Page:
    """What one step copied: ``source`` rows up to ``upto`` are done, ``copies`` written, ``skipped`` events
    whose message the target does not hold."""

    source: int
    upto: int
    scanned: int
    copies: int
    skipped: int


def read_progress(conn: Connection) -> Progress | None:
    text_ = conn.execute(select(partition_map.c.slot_map).where(partition_map.c.id == MOVE_ROW)).scalar()
    return None if text_ is None else Progress.decode(text_)


def _write_progress(conn: Connection, progress: Progress) -> None:
    conn.execute(partition_map.delete().where(partition_map.c.id == MOVE_ROW))
    conn.execute(partition_map.insert().values(id=MOVE_ROW, slot_map=progress.encode()))


def begin(engine: Engine, plan: MovePlan) -> Progress:
    """The move in progress: the one MySQL holds if it is this plan's (a rerun), else a new one.
    Refused if another move is in progress or the map has moved on since the plan was made."""
    with engine.begin() as conn:
        current = read_slot_map(conn)
        found = read_progress(conn)
        if found is not None:
            if found.plan != plan:
                raise MoveRefused(f"another move is in progress (to epoch {found.plan.after.epoch}): "
                                  "run `chatctl partitions resume` to finish it first")
            return found
        if current != plan.before:
            raise MoveRefused("the slot map changed while the move was planned: plan it again")
        progress = Progress.start(plan)
        _write_progress(conn, progress)
        return progress


def _mark_as_mover(conn: Connection) -> None:
    """This session holds writer locks for a move: a writer that waits for one of them sees so, and waits longer."""
    conn.execute(text("SELECT GET_LOCK(CONCAT(:mark, CONNECTION_ID()), 0)"), {"mark": MOVER_MARK})


def _take_writer_lock(conn: Connection, partition: int) -> None:
    """The partition's writer lock, queued as a writer queues (``.next`` first), so that the holder ends its turn."""
    name = lock_name(partition)
    _mark_as_mover(conn)
    if conn.execute(text("SELECT GET_LOCK(:n, :t)"), {"n": name + ".next", "t": LOCK_WAIT_SECONDS}).scalar() != 1:
        raise MoveRefused(f"{name}.next: not free within {LOCK_WAIT_SECONDS:g} s")
    try:
        if conn.execute(text("SELECT GET_LOCK(:n, :t)"), {"n": name, "t": LOCK_WAIT_SECONDS}).scalar() != 1:
            raise MoveRefused(f"{name}: not free within {LOCK_WAIT_SECONDS:g} s")
    finally:
        conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": name + ".next"})
    conn.commit()


def _hold_queue_lock(conn: Connection, partition: int) -> None:
    _mark_as_mover(conn)
    name = lock_name(partition) + ".next"
    if conn.execute(text("SELECT GET_LOCK(:n, :t)"), {"n": name, "t": LOCK_WAIT_SECONDS}).scalar() != 1:
        raise MoveRefused(f"{name}: not free within {LOCK_WAIT_SECONDS:g} s")
    conn.commit()


def _take_writer_locks(engine: Engine, conn: Connection, partitions: list[int]) -> None:
    """Every listed partition's writer lock, for the cutover. Every queue lock (``.next``) first, each
    in a session of its own and all at once, so that all their holders see someone queued and end
    their turns together (one after the other, the waits add up: 1.9 s for 8 partitions, measured);
    then the locks, in partition order, on ``conn``. The queue locks go with their sessions."""
    with ExitStack() as sessions, ThreadPoolExecutor(len(partitions), thread_name_prefix="mover") as pool:
        queued = [sessions.enter_context(_session(engine)) for _ in partitions]
        for holding in [pool.submit(_hold_queue_lock, c, k) for c, k in zip(queued, partitions, strict=True)]:
            holding.result()
        _mark_as_mover(conn)
        for k in partitions:
            if conn.execute(text("SELECT GET_LOCK(:n, :t)"),
                            {"n": lock_name(k), "t": LOCK_WAIT_SECONDS}).scalar() != 1:
                raise MoveRefused(f"{lock_name(k)}: not free within {LOCK_WAIT_SECONDS:g} s")
        conn.commit()


@contextmanager
def _session(engine: Engine) -> Iterator[Connection]:
    """A connection whose named locks are all released when it goes back to the pool (which keeps the session)."""
    with engine.connect() as conn:
        try:
            yield conn
        finally:
            _release_writer_locks(conn)


def _release_writer_locks(conn: Connection) -> None:
    conn.rollback()
    conn.execute(text("SELECT RELEASE_ALL_LOCKS()"))
    conn.commit()


class Mover:
    """Runs one move to its end. ``report``: one line per step, for the operator."""

    def __init__(self, engine: Engine, mongo_url: str, mongo_db: str, retention_seconds: int, timeout_seconds: float,
                 report: Callable[[str], None] = lambda line: None, page: int = PAGE):
        self._engine = engine
        self._mongo: pymongo.MongoClient = pymongo.MongoClient(
            mongo_url, tz_aware=True, serverSelectionTimeoutMS=int(timeout_seconds * 1000),
            # A page's insert runs under the target's writer lock: a slow fast store must not hold
            # that partition's writes for long. Past this the page is the outbox, which the
            # writer's next turn copies with its own hand-over rules.
            timeoutMS=int(MIRROR_SECONDS * 1000))
        self._db = mongo_db
        self._retention = retention_seconds
        self._report = report
        self._page = page
        # Targets whose fast store did not take a page within MIRROR_SECONDS: the mover sends them
        # no more. Each later page would be sent twice (mirrored_upto stays below the failed page,
        # so the writer's repair copies from there), and a store that timed out once is behind:
        # the writers' repair copies their outbox at the pace the store takes it.
        self._mirror_failed: set[int] = set()

    def close(self) -> None:
        self._mongo.close()

    def run(self, progress: Progress, catch_up_rows: int = 200, passes_max: int = 8) -> SlotMap:
        """Copies, catches up until a pass copies fewer than ``catch_up_rows`` rows or no fewer than
        the pass before (it no longer gains on the writers: the cutover copies the rest with the
        locks held, and pays no turn's hand-over per page), then cuts over; returns the new map."""
        before = None
        for n in range(1, passes_max + 1):
            copied = self.copy_pass(progress, locked=False)
            self._report(f"pass {n}: {copied} copies")
            if copied < catch_up_rows or (before is not None and copied >= before):
                break
            before = copied
        return self.cutover(progress)

    def copy_pass(self, progress: Progress, locked: bool) -> int:
        """Every source's rows past its mark, page by page; returns the copies made."""
        total = 0
        with self._engine.connect() as conn:
            try:
                for source in progress.plan.sources:
                    while True:
                        page = self._copy_page(conn, progress, source, locked)
                        total += page.copies
                        if page.scanned or page.copies:
                            self._report(f"copied partition {source} up to id {page.upto}: {page.copies} copies"
                                         + (f", {page.skipped} events without their message" if page.skipped else ""))
                        if page.scanned < self._page:
                            break
            finally:
                if not locked:
                    _release_writer_locks(conn)
        return total

    def _copy_page(self, conn: Connection, progress: Progress, source: int, locked: bool) -> Page:
        plan, mark = progress.plan, progress.copied[source]
        table = tables_of(source).messages
        leaving = plan.leaving(source)
        head = conn.execute(select(func.coalesce(func.max(table.c.id), 0))).scalar_one()
        slot = lambda col: func.crc32(col) % SLOTS  # noqa: E731 - chat.partitions.slot_of, in SQL
        rows = conn.execute(select(table).where(table.c.id > mark, table.c.id <= head,
                                                or_(slot(table.c.sender).in_(leaving),
                                                    slot(table.c.recipient).in_(leaving)))
                            .order_by(table.c.id).limit(self._page)).all()
        conn.commit()
        upto = rows[-1].id if len(rows) == self._page else head
        by_target: dict[int, list[Message]] = defaultdict(list)
        for row in rows:
            msg = Message.from_row(row)
            for target in copy_targets(msg, source, plan):
                by_target[target].append(msg)
        copies = skipped = 0
        for target, msgs in sorted(by_target.items()):
            made, missing = self._copy_into(conn, source, target, msgs, locked)
            copies, skipped = copies + made, skipped + missing
        progress.copied[source] = upto
        _write_progress(conn, progress)  # after the copies: a mover that dies in between copies them again, as nothing
        conn.commit()
        return Page(source, upto, len(rows), copies, skipped)

    def _copy_into(self, conn: Connection, source: int, target: int, msgs: list[Message],
                   locked: bool) -> tuple[int, int]:
        """Copies ``msgs`` of ``source`` into ``target`` under its writer lock; returns (copies, events skipped)."""
        if not locked:
            _take_writer_lock(conn, target)
        try:
            for attempt in range(DEADLOCK_RETRIES + 1):
                try:
                    made, skipped, docs, mirrored, before = self._insert_copies(conn, source, target, msgs)
                    conn.commit()
                    break
                except OperationalError as exc:  # a writer of another partition met it in `echoes`
                    conn.rollback()
                    if not is_deadlock(exc) or attempt == DEADLOCK_RETRIES:
                        raise
            # In the cutover, every involved partition's writes wait for the mover: the last pages'
            # documents are left to each target's writer, whose next turn copies its outbox first
            # (the targets in parallel, and a slow fast store is its hand-over rules' to bound).
            if docs and not locked and target not in self._mirror_failed:
                self._mirror(conn, target, docs, mirrored, before)
            return made, skipped
        finally:
            if not locked:
                _release_writer_locks(conn)

    def _insert_copies(self, conn: Connection, source: int, target: int,
                       msgs: list[Message]) -> tuple[int, int, list[dict], int, int]:
        into = tables_of(target)
        t, state = into.messages, into.stream_state
        newest = select(func.max(t.c.id)).scalar_subquery()
        last_id, mirrored = conn.execute(select(func.greatest(state.c.last_id, func.coalesce(newest, 0)),
                                                state.c.mirrored_upto).where(state.c.id == 1)).one()
        before = last_id
        origins = [origin_of(m, source) for m in msgs]
        held = _copies_held(conn, target, origins)
        taken_keys = _client_keys_taken(conn, target, [(m.sender, m.client_msg_id) for m in msgs if m.client_msg_id])
        refs = _translate(conn, source, target, [m.ref_id for m in msgs if m.kind and m.ref_id is not None])
        rows, docs, skipped = [], [], 0
        cutoff = expired_before(self._retention)
        revisions: list[tuple[int, Message]] = []
        for msg, origin in zip(msgs, origins, strict=True):
            if origin in held:
                continue
            ref = None
            if msg.kind:
                ref = refs.get(msg.ref_id) if msg.ref_id is not None else None
                if ref is None:
                    skipped += 1
                    continue
            last_id += 1
            key = msg.client_msg_id if (msg.sender, msg.client_msg_id) not in taken_keys else None
            copy = Message(last_id, msg.sender, msg.recipient, msg.body, msg.created_at, key, origin[0], origin[1],
                           msg.kind, ref, msg.edited_at, msg.deleted)
            held[origin] = last_id
            if key:
                taken_keys.add((msg.sender, key))
            if msg.kind in (Kind.EDIT, Kind.DELETE) and ref is not None:
                revisions.append((ref, msg))
            rows.append(message_row(copy))
            if copy.created_at >= cutoff:
                docs.append(copy.to_doc())
        if rows:
            conn.execute(t.insert(), rows)
            conn.execute(state.update().where(state.c.id == 1).values(last_id=last_id))
            # A copy still owed here (its echo row) is made now: the writer's own offer of it finds it made.
            made = [(r["origin_part"], r["origin_id"]) for r in rows]
            conn.execute(echoes.delete().where(echoes.c.to_part == target,
                                               tuple_(echoes.c.from_part, echoes.c.from_id).in_(made)))
        for ref, event in revisions:  # the message a revision names holds its latest version (docs/receipts.md)
            _apply_revision(conn, source, target, ref, event)
        return len(rows), skipped, docs, mirrored, before

    def _mirror(self, conn: Connection, target: int, docs: list[dict], mirrored: int, before: int) -> None:
        """The page's documents into the target's collection, still under its lock (they are in id order,
        after everything else). ``mirrored_upto`` moves past them only if nothing was outstanding before."""
        try:
            self._mongo[self._db][collection_name(target)].insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            if any(e.get("code") != 11000 for e in exc.details.get("writeErrors", [])):
                self._mirror_stopped(target, "BulkWriteError")
                return
        except PyMongoError as exc:
            self._mirror_stopped(target, exc.__class__.__name__)
            return
        if mirrored == before:
            state = tables_of(target).stream_state
            conn.execute(state.update().where(state.c.id == 1, state.c.mirrored_upto == before)
                         .values(mirrored_upto=docs[-1]["_id"]))
            conn.commit()

    def _mirror_stopped(self, target: int, error: str) -> None:
        self._mirror_failed.add(target)
        log.warning("event=move_mirror_failed partition=%d error=%s meaning=left_to_the_writers_repair", target, error)
        self._report(f"partition {target}'s fast store did not take a page within {MIRROR_SECONDS:g} s ({error}): "
                     "its writers' outbox repair copies the rest")

    def cutover(self, progress: Progress) -> SlotMap:
        """Under the writer locks of every source and target: the last rows, the markers, the echoes, the map."""
        plan = progress.plan
        involved = sorted(set(plan.sources) | set(plan.targets))
        started = time.monotonic()
        with self._engine.connect() as conn:
            try:
                _take_writer_locks(self._engine, conn, involved)
                with_locks = time.monotonic()
                last = 0
                for source in plan.sources:
                    while True:
                        page = self._copy_page(conn, progress, source, locked=True)
                        last += page.copies
                        if page.scanned < self._page:
                            break
                for attempt in range(DEADLOCK_RETRIES + 1):
                    try:
                        moved, markers, acks, echoed = self._switch(conn, plan)
                        break
                    except OperationalError as exc:  # a writer of another partition met it in `echoes`
                        conn.rollback()
                        if not is_deadlock(exc) or attempt == DEADLOCK_RETRIES:
                            raise
                paused = time.monotonic() - with_locks
            finally:
                _release_writer_locks(conn)
        self._report(f"cut over to epoch {plan.after.epoch}: {last} last copies, {markers} read markers and "
                     f"{acks} device positions of {len(moved)} moved users translated, {echoed} owed copies "
                     f"re-sent; writes of partitions {','.join(map(str, involved))} paused {paused * 1000:.0f} ms "
                     f"(locks taken in {(with_locks - started) * 1000:.0f} ms)")
        log.info("event=move_cut_over epoch=%d users=%d paused_ms=%.0f", plan.after.epoch, len(moved), paused * 1000)
        return plan.after


    @staticmethod
    def _switch(conn: Connection, plan: MovePlan) -> tuple[dict[str, tuple[int, int]], int, int, int]:
        """The cutover's one transaction: markers, positions and owed copies translated, the new map."""
        moved = _moved_users(conn, plan)
        markers = _translate_markers(conn, plan, moved)
        acks = _translate_acks(conn, plan, moved)
        echoed = _retarget_echoes(conn, plan)
        if read_slot_map(conn) != plan.before:
            raise MoveRefused("the slot map changed during the move: nothing was cut over")
        write_slot_map(conn, plan.after)
        conn.execute(partition_map.delete().where(partition_map.c.id == MOVE_ROW))
        conn.commit()
        return moved, markers, acks, echoed


def _copies_held(conn: Connection, target: int, origins: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """Origin -> id in ``target`` of the rows it holds already: its originals, and copies of elsewhere's."""
    t = tables_of(target).messages
    held: dict[tuple[int, int], int] = {}
    own = [i for p, i in origins if p == target]
    if own:
        held.update({(target, i): i for i in conn.execute(select(t.c.id).where(t.c.id.in_(own))).scalars()})
    others = [o for o in origins if o[0] != target]
    if others:
        found = conn.execute(select(t.c.origin_part, t.c.origin_id, t.c.id)
                             .where(tuple_(t.c.origin_part, t.c.origin_id).in_(others))).all()
        held.update({(p, i): id_ for p, i, id_ in found})
    return held


def _client_keys_taken(conn: Connection, target: int, keys: list[tuple[str, str | None]]) -> set[tuple[str, str]]:
    if not keys:
        return set()
    t = tables_of(target).messages
    found = conn.execute(select(t.c.sender, t.c.client_msg_id).where(tuple_(t.c.sender, t.c.client_msg_id).in_(keys)))
    return {(s, c) for s, c in found}


def _translate(conn: Connection, source: int, target: int, ids: list[int]) -> dict[int, int]:
    """Ids of ``source`` -> the ids of the same rows in ``target`` (those it holds)."""
    if not ids:
        return {}
    s = tables_of(source).messages
    rows = conn.execute(select(s.c.id, s.c.origin_part, s.c.origin_id).where(s.c.id.in_(set(ids)))).all()
    origin = {r.id: ((source, r.id) if r.origin_part is None else (r.origin_part, r.origin_id)) for r in rows}
    held = _copies_held(conn, target, set(origin.values()))
    return {i: held[o] for i, o in origin.items() if o in held}


def _apply_revision(conn: Connection, source: int, target: int, ref: int, event: Message) -> None:
    """The target's copy of a revised message takes the source's latest version of it."""
    s, t = tables_of(source).messages, tables_of(target).messages
    latest = conn.execute(select(s.c.body, s.c.edited_at, s.c.deleted).where(s.c.id == event.ref_id)).first()
    if latest is not None:
        conn.execute(t.update().where(t.c.id == ref).values(body=latest.body, edited_at=latest.edited_at,
                                                            deleted=latest.deleted))


def _moved_users(conn: Connection, plan: MovePlan) -> dict[str, tuple[int, int]]:
    """Each moved user with a read marker or a device position to translate: user -> (source, target).
    Read from those two small tables, never from the messages: this runs while writes wait."""
    moving = plan.moving
    moved: dict[str, tuple[int, int]] = {}
    for col in (read_markers.c.reader, device_acks.c.user):
        for user in conn.execute(select(col).distinct().where((func.crc32(col) % SLOTS).in_(moving))).scalars():
            if plan.moves(user):
                moved[user] = (plan.before.partition_of(user), plan.after.partition_of(user))
    return moved


def _translate_markers(conn: Connection, plan: MovePlan, moved: dict[str, tuple[int, int]]) -> int:
    """A moved reader's markers name ids of their old partition: each becomes the id of the same message in the
    new one. Exact: one conversation's rows are copied in their order."""
    if not moved:
        return 0
    found = conn.execute(select(read_markers.c.reader, read_markers.c.peer, read_markers.c.upto)
                         .where(read_markers.c.reader.in_(list(moved)))).all()
    by_pair: dict[tuple[int, int], list] = defaultdict(list)
    for row in found:
        by_pair[moved[row.reader]].append(row)
    n = 0
    for (source, target), rows in by_pair.items():
        new = _translate(conn, source, target, [r.upto for r in rows])
        for r in rows:
            if r.upto in new:
                conn.execute(read_markers.update()
                             .where(read_markers.c.reader == r.reader, read_markers.c.peer == r.peer)
                             .values(upto=new[r.upto]))
                n += 1
            else:
                log.warning("event=move_marker_untranslated reader=%s upto=%d", r.reader, r.upto)
    return n


def _translate_acks(conn: Connection, plan: MovePlan, moved: dict[str, tuple[int, int]]) -> int:
    """A device's position (everything up to it received) in the new partition: just below the first row of the
    user's it had not received, so that no row it lacks counts as received (a row it had may count as not yet)."""
    if not moved:
        return 0
    found = conn.execute(select(device_acks.c.user, device_acks.c.device, device_acks.c.upto)
                         .where(device_acks.c.user.in_(list(moved)))).all()
    n = 0
    for row in found:
        source, target = moved[row.user]
        s = tables_of(source).messages
        mine = or_(s.c.sender == row.user, s.c.recipient == row.user)
        lacking = list(conn.execute(select(s.c.id).where(s.c.id > row.upto, mine)).scalars())
        new = _translate(conn, source, target, lacking)
        if new:
            upto = min(new.values()) - 1
        else:
            state = tables_of(target).stream_state
            upto = conn.execute(select(state.c.last_id).where(state.c.id == 1)).scalar_one()
        conn.execute(device_acks.update().where(device_acks.c.user == row.user, device_acks.c.device == row.device)
                     .values(upto=upto))
        n += 1
    return n


def _retarget_echoes(conn: Connection, plan: MovePlan) -> int:
    """Copies still owed to a source for a recipient who moves are owed to the target instead."""
    owed = conn.execute(select(echoes.c.to_part, echoes.c.from_part, echoes.c.from_id)
                        .where(echoes.c.to_part.in_(plan.sources))).all()
    n = 0
    for to_part, from_part, from_id in owed:
        t = tables_of(from_part).messages
        recipient = conn.execute(select(t.c.recipient).where(t.c.id == from_id)).scalar()
        if recipient is None or not plan.moves(recipient):
            continue
        now_in = plan.after.partition_of(recipient)
        conn.execute(echoes.delete().where(echoes.c.to_part == to_part, echoes.c.from_part == from_part,
                                           echoes.c.from_id == from_id))
        if now_in != from_part:  # a copy into the original's own partition is the original
            conn.execute(echoes.insert().prefix_with("IGNORE").values(to_part=now_in, from_part=from_part,
                                                                     from_id=from_id))
        n += 1
    return n

