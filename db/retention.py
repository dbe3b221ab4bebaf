"""Retention of the fast store where the server has no TTL indexes (FerretDB).

On MongoDB the TTL index on ``created_at`` deletes expired messages; this
sweep then finds little to do. Either way it records the retention *floor*:
every id <= floor has expired, so a daemon can answer ``recovered: false`` to
a client whose resume point is older, instead of a silent partial fill.
The floor is written before the delete, so it is never behind what is gone.
Each partition (chat.partitions) is swept on its own: its table, its
collection, its floor.

What has expired is read from MySQL, by primary key from the floor onwards,
not from the fast store. FerretDB pushes no range, sort or integer ``_id``
down to SQLite, so every question put to `messages` there decodes the whole
collection: at 50,000 messages the old sweep took 4.3 s of FerretDB's CPU,
twice per API process per period, and starved the daemons' oplog tails
until they fell off. Now a sweep that finds nothing expired costs one index
read, and the fast store is only touched when something is to be deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from chat.partitions import collection_name
from db import mongo
from db.partition_map import tables_of
from db.threads import Threads

log = logging.getLogger("chat.retention")

PAGE = 10_000  # rows per read of MySQL while walking what has expired
# FerretDB 1.24 (SQLite) refuses a delete of more than 32,766 documents ("too
# many SQL variables": one per document). A sweep after downtime longer than
# the retention, or at about 1,100 msg/s sustained with the 30 s period,
# expires more than that: it deletes in pieces of this many ids. Each delete
# scans the collection on FerretDB (2.7 s at 110,000 messages, measured), so
# the pieces are as large as is safe, not small.
DELETE_PIECE = 25_000
PIECE_PAUSE_SECONDS = 0.05  # between pieces: the oplog tails get the server back meanwhile


def newest_expired_id(engine: Engine, after: int, cutoff: datetime, partition: int = 0) -> int:
    """The highest id created before ``cutoff``, walking up from ``after``;
    ``after`` if none. Ids are given in commit order, so created_at rises with
    them; a row stamped slightly out of order (clocks of several API hosts)
    still counts, as long as it falls within the page where expiry ends."""
    naive_cutoff = cutoff.replace(tzinfo=None)  # MySQL keeps UTC without a zone
    messages = tables_of(partition).messages
    newest = after
    with engine.connect() as conn:
        while True:
            rows = conn.execute(select(messages.c.id, messages.c.created_at).where(messages.c.id > newest)
                                .order_by(messages.c.id).limit(PAGE)).all()
            expired = [r.id for r in rows if r.created_at < naive_cutoff]
            if expired:
                newest = expired[-1]  # rows come in id order, all above `newest`
            if len(expired) < PAGE:
                return newest


async def sweep_once(db: AsyncDatabase, engine: Engine, threads: Threads, retention_seconds: int,
                     piece: int = DELETE_PIECE, partition: int = 0,
                     pause: Callable[[float], Awaitable[None]] = asyncio.sleep) -> int:
    """Deletes the partition's expired messages, at most ``piece`` ids per delete; returns how many.
    ``pause``: how it waits between pieces (the tests' fake)."""
    cutoff = mongo.expired_before(retention_seconds)
    floor = await mongo.retention_floor(db, partition)
    newest = await threads.run(newest_expired_id, engine, floor, cutoff, partition)
    if newest <= floor:
        return 0  # nothing expired since the last sweep (by any API process)
    deleted = 0
    for upto in delete_steps(floor, newest, piece):
        # The floor first, so that it is never behind what is gone: a reader
        # that finds it past its position knows messages may be missing.
        await db[mongo.META].update_one({"_id": mongo.retention_key(partition)}, {"$max": {"floor": upto}},
                                        upsert=True)
        result = await db[collection_name(partition)].delete_many({"_id": {"$lte": upto}})
        deleted += result.deleted_count
        await pause(PIECE_PAUSE_SECONDS)
    log.info("event=retention_sweep partition=%d deleted=%d floor=%d", partition, deleted, newest)
    return deleted


def delete_steps(floor: int, newest: int, piece: int) -> list[int]:
    """The upper ids of the deletes that take (floor, newest] away, ``piece``
    ids each. Every id <= floor is gone already, so each delete of ``_id <=
    upto`` removes at most ``piece`` documents (and any stray below the floor
    along with the first)."""
    return [min(upto, newest) for upto in range(floor + piece, newest + piece, piece)]


async def run_sweeper(db: AsyncDatabase, engine: Engine, threads: Threads, retention_seconds: int,
                      interval: float, partitions: Callable[[], int] = lambda: 1,
                      sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Sweeps every partition (``partitions()``: as many as the map has now) each ``interval`` seconds
    (``sleep``: the tests' fake), until cancelled;
    a sweep that fails is logged and tried again in the next period."""
    while True:
        for partition in range(partitions()):
            try:
                await sweep_once(db, engine, threads, retention_seconds, partition=partition)
            except (PyMongoError, SQLAlchemyError) as exc:
                log.warning("event=retention_sweep_failed partition=%d error=%s", partition, exc.__class__.__name__)
        await sleep(interval)
