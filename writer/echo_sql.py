"""The ``echoes`` table's statements: copies owed between partitions (writer/copies.py).

Added to the trip of the batch they belong to (``settle_echoes``), or run in
the writer's thread at the start of a turn under the partition's lock (``leftover_copies``);
``owed_now`` is a leader's watch's read, without the lock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cache

from sqlalchemy import CompoundSelect, bindparam, select, union_all
from sqlalchemy.engine import Connection, Row

from chat.messages import Message
from chat.partitions import SlotMap
from db.partition_map import tables_of
from db.sql import echoes
from writer.commit_trip import Trip, insert_rows
from writer.copies import Copy, OwedRead, echo_rows

log = logging.getLogger("chat.writer")

ECHOES = echoes.name


def settle_echoes(trip: Trip, partition: int, owed: list[tuple[int, Copy]], new: list[Message],
                  copied_before: Sequence[tuple[int, int]] = ()) -> None:
    """Adds to a batch's ``trip`` (writer/commit_trip.py), in its transaction: the
    copies its originals owe, recorded, and the debts its copies pay cleared (each
    copy's echo row, by its whole primary key), with those of copies found made
    already (``copied_before``: their origins)."""
    if owed:
        trip.add(*insert_rows(ECHOES, ("to_part", "from_part", "from_id"),
                              ((e.to_part, e.from_part, e.from_id) for e in echo_rows(owed))))
    paid = [(m.origin_part, m.origin_id) for m in new if m.origin_part is not None] + list(copied_before)
    if paid:
        pairs = ", ".join(["(%s, %s)"] * len(paid))
        trip.add(f"DELETE FROM {ECHOES} WHERE to_part = %s AND (from_part, from_id) IN ({pairs})",
                 [partition, *(v for pair in paid for v in pair)])



def leftover_copies(conn: Connection, partition: int, limit: int, slot_map: SlotMap,
                    handed_before: int) -> OwedRead:
    """Up to ``limit`` copies owed to ``partition`` (oldest originals first), each
    read from its original's table, in the transaction at hand, which it
    commits. An echo whose original is gone (a table emptied by hand) is
    dropped, loudly: nothing is left to copy. One whose recipient lives
    elsewhere now (a move cut over after the original's writer chose this
    partition) is sent on to the recipient's partition of ``slot_map``. Neither
    is owed here any more. ``handed_before``: the hand-overs made before the read (``OwedRead``)."""
    found, complete = _owed_originals(conn, partition, limit, slot_map.partitions)
    if not found:
        conn.commit()
        return OwedRead([], frozenset(), complete, handed_before)
    copies: list[Copy] = []
    for from_part, ids, rows in found:
        for r in rows:
            now_in = slot_map.partition_of(r.recipient) if slot_map.partitions > 1 else 0
            if now_in == partition:
                copies.append(Copy(Message.from_row(r), from_part))
            else:
                _send_on(conn, partition, now_in, from_part, r.id)
        missing = set(ids) - {r.id for r in rows}
        if missing:
            log.error("event=echo_without_original to_part=%d from_part=%d ids=%s", partition, from_part,
                      sorted(missing)[:10])
            conn.execute(echoes.delete().where(echoes.c.to_part == partition, echoes.c.from_part == from_part,
                                               echoes.c.from_id.in_(missing)))
    conn.commit()
    if copies:
        log.info("event=leftover_copies to_part=%d copies=%d", partition, len(copies))
    return OwedRead(copies, frozenset(copy.origin for copy in copies), complete, handed_before)


def owed_now(conn: Connection, partition: int, limit: int, slot_map: SlotMap) -> tuple[list[Copy], bool]:
    """Up to ``limit`` copies owed to ``partition`` and still its own under ``slot_map``,
    read without its lock and writing nothing (a leader's watch, ``writer.echo_watch``),
    and whether that is all of them. What a move sends on, or an echo without its
    original, is left to the drain of a turn, under the lock. ``conn`` runs each
    statement as its own transaction (autocommit): a read that finds nothing is one
    round trip, and each sees the commits before it. An echo and its original are
    committed together, so an echo read has its original to read."""
    found, complete = _owed_originals(conn, partition, limit, slot_map.partitions)
    return [Copy(Message.from_row(r), from_part) for from_part, _ids, rows in found for r in rows
            if slot_map.partition_of(r.recipient) == partition], complete


# (the originals' partition, their ids, their rows as found), and whether that is every echo owed
OwedOriginals = tuple[list[tuple[int, list[int], list[Row]]], bool]


def _owed_originals(conn: Connection, partition: int, limit: int, partitions: int) -> OwedOriginals:
    """The echoes owed to ``partition`` by the others of ``partitions``, oldest first, up to
    ``limit``, by the partition of their originals: (that partition, the originals' ids,
    their rows as found), and whether that is every echo owed. One statement, one round trip."""
    by_part: dict[int, tuple[list[int], list[Row]]] = {}
    owed = conn.execute(_owed_read(partition, partitions), {"limit": limit}).all()
    for row in owed:
        ids, rows = by_part.setdefault(row.from_part, ([], []))
        ids.append(row.from_id)
        if row.id is not None:  # NULL: the echo's original is gone
            rows.append(row)
    return [(from_part, ids, rows) for from_part, (ids, rows) in by_part.items()], len(owed) < limit


@cache
def _owed_read(to_part: int, partitions: int) -> CompoundSelect:
    """The echoes owed to ``to_part`` with their originals: for each other partition, its
    echoes (up to the limit) joined to its own table, the rows of all in one UNION ALL,
    oldest first. A read of the echoes, then one of the originals per partition they
    came from, was two round trips and more for each copy a leader's watch made, and its
    statements were a tenth of the writer's CPU at four partitions. The outer join keeps
    an echo whose original is gone, so that it is seen, and counted toward the limit."""
    members = []
    for from_part in range(partitions):
        if from_part == to_part:
            continue
        table = tables_of(from_part).messages
        members.append(
            select(echoes.c.from_part, echoes.c.from_id, table)
            .select_from(echoes.outerjoin(table, table.c.id == echoes.c.from_id))
            .where(echoes.c.to_part == to_part, echoes.c.from_part == from_part)
            .order_by(echoes.c.from_id).limit(bindparam("limit")))
    both = union_all(*members)
    return both.order_by(both.selected_columns.from_part, both.selected_columns.from_id).limit(bindparam("limit"))


def _send_on(conn: Connection, partition: int, now_in: int, from_part: int, from_id: int) -> None:
    log.info("event=echo_sent_on from_part=%d from_id=%d to_part=%d now_to_part=%d", from_part, from_id, partition,
             now_in)
    conn.execute(echoes.delete().where(echoes.c.to_part == partition, echoes.c.from_part == from_part,
                                       echoes.c.from_id == from_id))
    if now_in != from_part:  # the original's own partition holds it: nothing is owed
        conn.execute(echoes.insert().prefix_with("IGNORE").values(to_part=now_in, from_part=from_part,
                                                                 from_id=from_id))
