"""The fast store (MongoDB, FerretDB locally): schema and the few queries we run.

``messages`` holds each message of partition 0 for the retention period,
keyed by its id; partition k > 0 has ``messages_p{k}`` of the same shape
(chat.partitions). ``local.oplog.rs`` is what the daemons tail.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta

from pymongo import ASCENDING, AsyncMongoClient, ReplaceOne, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, CollectionInvalid, OperationFailure

from chat.messages import Kind, Message
from chat.partitions import collection_name, suffix

log = logging.getLogger("chat.mongo")

MESSAGES = "messages"
META = "meta"
# meta documents: {_id: "retention", floor: <highest id removed by retention>}
#                 {_id: "head", id: <highest id known to be in `messages`>}
# Partition k > 0 has its own, under the same suffix as its collection
# ("head_p1", "retention_p1" for `messages_p1`). The reads below take the
# partition last and positionally (default 0: the single stream's names).


def head_key(partition: int = 0) -> str:
    return "head" + suffix(partition)


def retention_key(partition: int = 0) -> str:
    return "retention" + suffix(partition)


def make_client(url: str, timeout_seconds: float, event_listeners: list | None = None) -> AsyncMongoClient:
    """``event_listeners``: pymongo monitoring listeners (a test's record of the commands sent)."""
    ms = int(timeout_seconds * 1000)
    return AsyncMongoClient(
        url,
        tz_aware=True,
        serverSelectionTimeoutMS=ms,
        connectTimeoutMS=ms,
        socketTimeoutMS=ms * 5,
        event_listeners=event_listeners or [],
    )


async def server(client: AsyncMongoClient) -> tuple[bool, str]:
    """(is it FerretDB, "FerretDB 1.24.0" or "MongoDB 7.0.14"): the one place the two are told apart."""
    info = await client.admin.command("buildInfo")
    if "ferretdbVersion" in info:
        return True, f"FerretDB {info['ferretdbVersion']}"
    return False, f"MongoDB {info.get('version')}"


async def ensure_schema(client: AsyncMongoClient, db_name: str, retention_seconds: int,
                        oplog_max_docs: int, oplog_size_bytes: int, partitions: int = 1) -> dict:
    """Creates what the system needs, a collection per partition; safe to run again. Returns what it found."""
    found = {"oplog": "exists", "ttl_index": False, "ferretdb": False}
    local = client["local"]
    if "oplog.rs" not in await local.list_collection_names():
        # Only FerretDB lets us create it; a real replica set has its own.
        # The small `max` bounds FerretDB's tail cost, which grows with the
        # oplog's length (docs/ferretdb.md).
        await local.create_collection("oplog.rs", capped=True, size=oplog_size_bytes, max=oplog_max_docs)
        found["oplog"] = "created"
    db = client[db_name]
    ferretdb, _name = await server(client)
    for partition in range(partitions):
        await _ensure_messages(db[collection_name(partition)], ferretdb, retention_seconds)
    found["ferretdb"] = ferretdb
    found["ttl_index"] = not ferretdb
    return found


async def _ensure_messages(messages: AsyncCollection, ferretdb: bool, retention_seconds: int) -> None:
    try:
        await messages.database.create_collection(messages.name)
    except CollectionInvalid:
        pass
    if ferretdb:
        # FerretDB 1.24 (SQLite) plans every query of ours as a full scan, even
        # by _id (explain: "SCAN messages_..."), so an index there is only work
        # for each insert: 6.5 against 5.2 ms per 42-message insert_many
        # (measured on an idle FerretDB), on the path of every delivery. No TTL index either:
        # the retention sweeper (db/retention.py) deletes expired messages.
        for name in ("to_id", "from_id", "created_at"):  # an older schema made them
            with contextlib.suppress(OperationFailure):
                await messages.drop_index(name)
        return
    # Catch-up reads "messages to or from U after id S": one index per side.
    await messages.create_index([("to", ASCENDING), ("_id", ASCENDING)], name="to_id")
    await messages.create_index([("from", ASCENDING), ("_id", ASCENDING)], name="from_id")
    await messages.create_index("created_at", name="created_at_ttl", expireAfterSeconds=retention_seconds)


DUPLICATE_KEY = 11000


def only_duplicates(exc: BulkWriteError) -> bool:
    """Whether every document an unordered insert_many refused was refused for
    a duplicate _id, i.e. is there already."""
    errors = exc.details.get("writeErrors", [])
    return bool(errors) and all(e.get("code") == DUPLICATE_KEY for e in errors) and not exc.details.get(
        "writeConcernErrors")


def refused_at(exc: BulkWriteError) -> list[int]:
    """The positions, in the documents given to insert_many, of those it refused."""
    return [int(e["index"]) for e in exc.details.get("writeErrors", [])]


def same_document(stored: dict, true: dict) -> bool:
    """Whether ``stored`` (as read back) is the writer's document ``true``; a
    driver may decode created_at naive (in UTC) or aware."""
    created = stored.get("created_at")
    if isinstance(created, datetime) and created.tzinfo is None:
        stored = {**stored, "created_at": created.replace(tzinfo=UTC)}
    return stored == true


async def messages_with_ids(db: AsyncDatabase, ids: list[int], partition: int = 0) -> dict[int, dict]:
    """The documents `messages` holds for ``ids``, by id (a scan of the collection on FerretDB)."""
    return {int(doc["_id"]): doc async for doc in db[collection_name(partition)].find({"_id": {"$in": ids}})}


async def replace_messages(db: AsyncDatabase, docs: list[dict], partition: int = 0) -> None:
    """Puts each of ``docs`` in place of the document with its _id."""
    await db[collection_name(partition)].bulk_write([ReplaceOne({"_id": d["_id"]}, d) for d in docs], ordered=False)


async def revise(db: AsyncDatabase, events: list[dict], partition: int = 0) -> None:
    """Applies EDIT and DELETE documents to the messages they name, in order:
    an edit sets the body and edited_at, a delete empties the body and marks it deleted."""
    updates = [UpdateOne({"_id": e.ref_id, "deleted": {"$ne": True}},
                         {"$set": {"body": e.body, "edited_at": e.created_at}})
               if e.kind == Kind.EDIT else UpdateOne({"_id": e.ref_id}, {"$set": {"body": "", "deleted": True}})
               for e in map(Message.from_doc, events)]
    await db[collection_name(partition)].bulk_write(updates, ordered=True)


def expired_before(retention_seconds: int, now: datetime | None = None) -> datetime:
    return (now or datetime.now(UTC)) - timedelta(seconds=retention_seconds)


async def newest_id(db: AsyncDatabase, partition: int = 0) -> int:
    """The highest message id stored. Cheap everywhere: the writer records it
    in meta.head, a lookup by string _id in a collection of two documents (FerretDB
    answers it in SQLite without decoding them; it has no usable index even
    there); the sorted query over `messages` is only the fallback for a store
    without it."""
    head = await head_hint(db, partition)
    if head is not None:
        return head
    # Numbers only: a string _id (not the writer's) sorts above every number.
    doc = await db[collection_name(partition)].find_one({"_id": {"$gt": 0}}, {"_id": 1}, sort=[("_id", -1)])
    return int(doc["_id"]) if doc and isinstance(doc["_id"], int) else 0


async def head_hint(db: AsyncDatabase, partition: int = 0) -> int | None:
    """meta.head: the highest id the writer knows to be in `messages`, or None.
    Written only by the writer, about once a second."""
    head = await db[META].find_one({"_id": head_key(partition)})
    return int(head["id"]) if head and isinstance(head.get("id"), int) else None


async def is_stored(db: AsyncDatabase, msg_id: int, partition: int = 0) -> bool:
    """Whether message ``msg_id`` is in `messages`: a lookup by _id, from the
    index on MongoDB; FerretDB scans the collection for it."""
    return await db[collection_name(partition)].find_one({"_id": msg_id}, {"_id": 1}) is not None


async def advance_head(db: AsyncDatabase, upto: int, partition: int = 0) -> None:
    await db[META].update_one({"_id": head_key(partition)}, {"$max": {"id": upto}}, upsert=True)


async def messages_between(db: AsyncDatabase, after: int, upto: int | None, limit: int,
                           partition: int = 0) -> list[dict]:
    """All messages with after < id <= upto, oldest first (the partition's stream)."""
    cond: dict = {"$gt": after}
    if upto is not None:
        cond["$lte"] = upto
    cursor = db[collection_name(partition)].find({"_id": cond}, sort=[("_id", 1)], limit=limit)
    return await cursor.to_list(length=limit)


async def messages_for(db: AsyncDatabase, user: str, after: int, upto: int, limit: int,
                       partition: int = 0) -> list[dict]:
    """A user's messages (either side) with after < id <= upto, oldest first."""
    query = {"$or": [{"to": user}, {"from": user}], "_id": {"$gt": after, "$lte": upto}}
    cursor = db[collection_name(partition)].find(query, sort=[("_id", 1)], limit=limit)
    return await cursor.to_list(length=limit)


async def retention_floor(db: AsyncDatabase, partition: int = 0) -> int:
    doc = await db[META].find_one({"_id": retention_key(partition)})
    return int(doc["floor"]) if doc else 0
