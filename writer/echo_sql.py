"""The ``echoes`` table's statements: copies owed between partitions (writer/copies.py).

Run in the writer's thread, inside the transaction of the batch they belong
to, or (``leftover_copies``) at the start of a turn under the partition's lock.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from sqlalchemy import select, tuple_
from sqlalchemy.engine import Connection

from chat.messages import Message
from db.partition_map import tables_of
from db.sql import echoes
from writer.copies import Copy, echo_rows

log = logging.getLogger("chat.writer")


def settle_echoes(conn: Connection, partition: int, owed: list[tuple[int, Copy]], new: list[Message]) -> None:
    """In a batch's transaction: records the copies its originals owe, and clears
    the debts its copies pay (each copy's echo row, by its whole primary key)."""
    if owed:
        conn.execute(echoes.insert(), [{"to_part": e.to_part, "from_part": e.from_part, "from_id": e.from_id}
                                       for e in echo_rows(owed)])
    paid = [(m.origin_part, m.origin_id) for m in new if m.origin_part is not None]
    if paid:
        conn.execute(echoes.delete().where(echoes.c.to_part == partition,
                                           tuple_(echoes.c.from_part, echoes.c.from_id).in_(paid)))


def leftover_copies(conn: Connection, partition: int, limit: int) -> list[Copy]:
    """Up to ``limit`` copies owed to ``partition`` (oldest originals first), each
    read from its original's table. An echo whose original is gone (a table
    emptied by hand) is dropped, loudly: nothing is left to copy."""
    owed = conn.execute(select(echoes.c.from_part, echoes.c.from_id).where(echoes.c.to_part == partition)
                        .order_by(echoes.c.from_part, echoes.c.from_id).limit(limit)).all()
    if not owed:
        conn.commit()
        return []
    by_part: dict[int, list[int]] = defaultdict(list)
    for from_part, from_id in owed:
        by_part[from_part].append(from_id)
    copies: list[Copy] = []
    for from_part, ids in by_part.items():
        table = tables_of(from_part).messages
        rows = conn.execute(select(table).where(table.c.id.in_(ids)).order_by(table.c.id)).all()
        copies.extend(Copy(Message.from_row(r), from_part) for r in rows)
        missing = set(ids) - {r.id for r in rows}
        if missing:
            log.error("event=echo_without_original to_part=%d from_part=%d ids=%s", partition, from_part,
                      sorted(missing)[:10])
            conn.execute(echoes.delete().where(echoes.c.to_part == partition, echoes.c.from_part == from_part,
                                               echoes.c.from_id.in_(missing)))
    conn.commit()
    if copies:
        log.info("event=leftover_copies to_part=%d copies=%d", partition, len(copies))
    return copies
