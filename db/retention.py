"""Retention of the fast store where the server has no TTL indexes (FerretDB).

On MongoDB the TTL index on ``created_at`` deletes expired messages; this
sweep then finds little to do. Either way it records the retention *floor*:
every id <= floor has expired, so a daemon can answer ``recovered: false`` to
a client whose resume point is older, instead of a silent partial fill.
The floor is written before the delete, so it is never behind what is gone.

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
from datetime import datetime

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError
from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from db import mongo
from db.sql import messages
from db.threads import Threads

log = logging.getLogger("chat.retention")

PAGE = 10_000  # rows per read of MySQL while walking what has expired


def newest_expired_id(engine: Engine, after: int, cutoff: datetime) -> int:
    """The highest id created before ``cutoff``, walking up from ``after``;
    ``after`` if none. Ids are given in commit order, so created_at rises with
    them; a row stamped slightly out of order (clocks of several API hosts)
    still counts, as long as it falls within the page where expiry ends."""
    naive_cutoff = cutoff.replace(tzinfo=None)  # MySQL keeps UTC without a zone
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


async def sweep_once(db: AsyncDatabase, engine: Engine, threads: Threads, retention_seconds: int) -> int:
    """Deletes expired messages; returns how many."""
    cutoff = mongo.expired_before(retention_seconds)
    floor = await mongo.retention_floor(db)
    newest = await threads.run(newest_expired_id, engine, floor, cutoff)
    if newest <= floor:
        return 0  # nothing expired since the last sweep (by any API process)
    await db[mongo.META].update_one({"_id": "retention"}, {"$max": {"floor": newest}}, upsert=True)
    result = await db[mongo.MESSAGES].delete_many({"created_at": {"$lt": cutoff}})
    log.info("event=retention_sweep deleted=%d floor=%d", result.deleted_count, newest)
    return result.deleted_count


async def run_sweeper(db: AsyncDatabase, engine: Engine, threads: Threads, retention_seconds: int,
                      interval: float) -> None:
    while True:
        try:
            await sweep_once(db, engine, threads, retention_seconds)
        except (PyMongoError, SQLAlchemyError) as exc:
            log.warning("event=retention_sweep_failed error=%s", exc.__class__.__name__)
        await asyncio.sleep(interval)
