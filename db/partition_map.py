"""Each partition's tables, and the slot map in MySQL.

Partition 0 is the single stream's ``messages`` and ``stream_state`` (db/sql.py,
built by the migrations). Partition k > 0 has tables of the same shape named
``messages_p{k}`` and ``stream_state_p{k}``, created by ``db.init`` for the
partitions the slot map has (``ensure_tables``): their number is data, not schema.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sqlalchemy import MetaData, Table, select
from sqlalchemy.engine import Connection, Engine

from chat.partitions import SlotMap, suffix
from db.sql import messages, partition_map, stream_state


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
    """Creates the tables of partitions 1..partitions-1 that do not exist yet."""
    for k in range(1, partitions):
        t = tables_of(k)
        t.messages.metadata.create_all(engine, checkfirst=True)


def read_slot_map(conn: Connection) -> SlotMap | None:
    """The slot map MySQL holds, or None before ``db.init`` wrote one."""
    text = conn.execute(select(partition_map.c.slot_map).where(partition_map.c.id == 1)).scalar()
    return None if text is None else SlotMap.decode(text)


def write_slot_map(conn: Connection, slot_map: SlotMap) -> None:
    """Replaces the slot map (the caller commits)."""
    conn.execute(partition_map.delete().where(partition_map.c.id == 1))
    conn.execute(partition_map.insert().values(id=1, slot_map=slot_map.encode()))
