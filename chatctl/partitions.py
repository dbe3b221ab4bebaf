"""``chatctl partitions show`` and ``chatctl partitions grow N``: the slot map in MySQL.

Growing is an offline operation (docs/operations.md): every process reads the
map when it starts, so the writers must be stopped, and every process
restarted after. ``grow`` refuses while any partition's writer lock is held,
and holds them all itself while it creates the new partitions' tables and
collections and then writes the map, so that no writer starts a turn meanwhile.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection

from chat.partitions import MAX_PARTITIONS, SlotMap, lock_name
from chat.settings import Settings
from db import mongo
from db.partition_map import NoSlotMap, ensure_tables, read_slot_map, write_slot_map


class ChangeRefused(Exception):
    """What the operator must do first (the message says)."""


def describe(slot_map: SlotMap) -> str:
    """The map for an operator: its epoch, its partitions, and each one's slots as ranges."""
    lines = [f"epoch {slot_map.epoch}, {slot_map.partitions} partition{'s' if slot_map.partitions != 1 else ''}"]
    for k in range(slot_map.partitions):
        slots = slot_map.slots_of(k)
        lines.append(f"partition {k}: {len(slots)} slots {_ranges(slots)}".rstrip())
    return "\n".join(lines)


def _ranges(slots: list[int]) -> str:
    runs: list[list[int]] = []
    for s in slots:
        if runs and runs[-1][1] == s - 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def check_growth(current: SlotMap, partitions: int) -> None:
    if partitions <= current.partitions:
        raise ChangeRefused(f"the store has {current.partitions} partitions: grow to more (partitions never shrink)")
    if partitions > MAX_PARTITIONS:
        raise ChangeRefused(f"at most {MAX_PARTITIONS} partitions")


def show(settings: Settings) -> str:
    engine = create_engine(settings.mysql_url.get_secret_value())
    try:
        with engine.connect() as conn:
            return describe(_current(conn))
    finally:
        engine.dispose()


def grow(settings: Settings, partitions: int) -> str:
    """Grows the map to ``partitions``; returns the new map described."""
    engine = create_engine(settings.mysql_url.get_secret_value())
    try:
        with engine.connect() as conn:
            current = _current(conn)
            check_growth(current, partitions)
            _hold_every_writer_lock(conn, partitions)
            try:
                grown = current.grown(partitions)
                ensure_tables(engine, partitions)
                asyncio.run(_ensure_collections(settings, partitions))
                write_slot_map(conn, grown)
                conn.commit()
            finally:
                conn.execute(text("SELECT RELEASE_ALL_LOCKS()"))
        return describe(grown)
    finally:
        engine.dispose()


def _current(conn: Connection) -> SlotMap:
    slot_map = read_slot_map(conn)
    if slot_map is None:
        raise NoSlotMap("MySQL holds no slot map: run `python -m db.init` first")
    return slot_map


def _hold_every_writer_lock(conn: Connection, partitions: int) -> None:
    """Refuses if a writer holds (or waits for) any partition's lock; else takes them all."""
    names = [lock_name(k) for k in range(partitions)] + [lock_name(k) + ".next" for k in range(partitions)]
    held = [n for n in names if conn.execute(text("SELECT IS_USED_LOCK(:n)"), {"n": n}).scalar() is not None]
    if held:
        raise ChangeRefused(f"stop the writers first: {', '.join(held)} held")
    for name in names:
        if conn.execute(text("SELECT GET_LOCK(:n, 0)"), {"n": name}).scalar() != 1:
            conn.execute(text("SELECT RELEASE_ALL_LOCKS()"))
            raise ChangeRefused(f"stop the writers first: {name} was just taken")
    conn.commit()


async def _ensure_collections(settings: Settings, partitions: int) -> None:
    client = mongo.make_client(settings.mongo_url.get_secret_value(), settings.db_timeout_seconds)
    try:
        await mongo.ensure_schema(client, settings.mongo_db, settings.retention_seconds, settings.oplog_max_docs,
                                  settings.oplog_size_bytes, partitions)
    finally:
        await client.close()
