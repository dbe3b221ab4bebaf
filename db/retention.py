"""Retention of the fast store where the server has no TTL indexes (FerretDB).

On MongoDB the TTL index on ``created_at`` deletes expired messages; this
sweep then finds little to do. Either way it records the retention *floor*:
every id <= floor is gone, so a daemon can answer ``recovered: false`` to a
client whose resume point is older, instead of a silent partial fill.
The floor is written before the delete, so it is never behind what is gone.
"""

from __future__ import annotations

import asyncio
import logging

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError

from db import mongo

log = logging.getLogger("chat.retention")


async def sweep_once(db: AsyncDatabase, retention_seconds: int) -> int:
    """Deletes expired messages; returns how many."""
    cutoff = mongo.expired_before(retention_seconds)
    coll = db[mongo.MESSAGES]
    newest_expired = await coll.find_one({"created_at": {"$lt": cutoff}}, {"_id": 1}, sort=[("_id", -1)])
    oldest_kept = await coll.find_one({}, {"_id": 1}, sort=[("_id", 1)])
    floor = max(int(newest_expired["_id"]) if newest_expired else 0,
                # Ids are gap-free, so whatever is below the oldest kept
                # message is gone (a TTL monitor may have removed it).
                int(oldest_kept["_id"]) - 1 if oldest_kept else 0)
    if floor:
        await db[mongo.META].update_one({"_id": "retention"}, {"$max": {"floor": floor}}, upsert=True)
    if not newest_expired:
        return 0
    result = await coll.delete_many({"created_at": {"$lt": cutoff}})
    log.info("event=retention_sweep deleted=%d floor=%d", result.deleted_count, floor)
    return result.deleted_count


async def run_sweeper(db: AsyncDatabase, retention_seconds: int, interval: float) -> None:
    while True:
        try:
            await sweep_once(db, retention_seconds)
        except PyMongoError as exc:
            log.warning("event=retention_sweep_failed error=%s", exc.__class__.__name__)
        await asyncio.sleep(interval)
