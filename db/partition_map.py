"""Each partition's tables, and the slot map in MySQL.

Partition 0 is the single stream's ``messages`` and ``stream_state`` (db/sql.py,
built by the migrations). Partition k > 0 has tables of the same shape named
``messages_p{k}`` and ``stream_state_p{k}``, created by ``db.init`` for the
partitions the slot map has (``ensure_tables``): their number is data, not schema.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlalchemy import MetaData, Table, func, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from chat.partitions import SlotMap, suffix
from db.threads import Threads
from db.sql import messages, partition_map, read_retrying, stream_state

log = logging.getLogger("chat.partitions")


@dataclass(frozen=True, slots=True)
class PartitionTables:
    messages: Table
    stream_state: Table


@functools.cache
def tables_of(partition: int) -> PartitionTables:
    if partition == 0:
        return PartitionTables(messages, stream_state)
    own = MetaData()
    end = suffix(partition)
    return PartitionTables(messages.to_metadata(own, name=f"messages{end}"),
                           stream_state.to_metadata(own, name=f"stream_state{end}"))


def ensure_tables(engine: Engine, partitions: int) -> None:
    """Creates the tables of partitions 1..partitions-1 that do not exist yet,
    each ``stream_state`` with its one row (nothing written, nothing mirrored)."""
    for k in range(1, partitions):
        t = tables_of(k)
        t.messages.metadata.create_all(engine, checkfirst=True)
        with engine.begin() as conn:
            conn.execute(t.stream_state.insert().prefix_with("IGNORE").values(id=1, last_id=0, mirrored_upto=0))


class NoSlotMap(RuntimeError):
    """MySQL holds no slot map: ``python -m db.init`` has not run on this store."""


def lay_out(engine: Engine, partitions: int) -> SlotMap:
    """The slot map MySQL holds, written as ``SlotMap.even(partitions)`` if it has none
    yet, with every partition's tables created. What ``db.init`` does; safe to run again."""
    with engine.begin() as conn:
        slot_map = read_slot_map(conn)
        if slot_map is None:
            slot_map = SlotMap.even(partitions)
            write_slot_map(conn, slot_map)
    ensure_tables(engine, slot_map.partitions)
    return slot_map


def load_slot_map(engine: Engine) -> SlotMap:
    """The slot map a process starts with, or NoSlotMap saying what to run."""
    with engine.connect() as conn:
        slot_map = read_slot_map(conn)
    if slot_map is None:
        raise NoSlotMap("MySQL holds no slot map (partition_map): run `python -m db.init` first")
    return slot_map


def read_slot_map(conn: Connection) -> SlotMap | None:
    """The slot map MySQL holds, or None before ``db.init`` wrote one."""
    text = conn.execute(select(partition_map.c.slot_map).where(partition_map.c.id == 1)).scalar()
    return None if text is None else SlotMap.decode(text)


def write_slot_map(conn: Connection, slot_map: SlotMap) -> None:
    """Replaces the slot map (the caller commits)."""
    conn.execute(partition_map.delete().where(partition_map.c.id == 1))
    conn.execute(partition_map.insert().values(id=1, slot_map=slot_map.encode()))


def newer_slot_map(conn: Connection, epoch: int) -> SlotMap | None:
    """The map MySQL holds if its epoch is past ``epoch``, else None: when nothing moved, one short read."""
    found = conn.execute(select(func.json_value(partition_map.c.slot_map, "$.epoch"))
                         .where(partition_map.c.id == 1)).scalar()
    if found is None or int(found) <= epoch:
        return None
    return read_slot_map(conn)


async def watch_slot_map(engine: Engine, current: Callable[[], SlotMap], adopt: Callable[[SlotMap], object],
                         period: float, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Until cancelled: each ``period``, hands a newer map than ``current()`` to ``adopt``
    (a move's cutover). A read that fails is passed over: the next one decides."""
    threads = Threads(1, "slot-map-watch")

    def read(epoch: int) -> SlotMap | None:
        return read_retrying(engine, lambda conn: newer_slot_map(conn, epoch))

    try:
        while True:
            await sleep(period)
            try:
                found = await threads.run(read, current().epoch)
            except SQLAlchemyError as exc:
                log.warning("event=slot_map_check_failed error=%s", exc.__class__.__name__)
                continue
            if found is not None:
                log.info("event=slot_map_adopted epoch=%d partitions=%d", found.epoch, found.partitions)
                adopt(found)
    finally:
        threads.close()
