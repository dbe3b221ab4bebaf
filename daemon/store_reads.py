"""The stream's reads that fill its cache, serve catch-up and say whether an
id exists: the I/O edge of ``daemon.stream`` and ``daemon.catchup``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import PyMongoError
from sqlalchemy.exc import SQLAlchemyError

from chat.messages import Encoded, encode_doc
from daemon.catchup import GAP, MessageOrGap
from daemon.recent_cache import RecentCache
from db import mongo
from db.stream_ranges import StreamRanges

log = logging.getLogger("chat.stream")

# What a read of the stores raises when they do not answer (away, or slower than
# CHAT_DB_TIMEOUT_SECONDS): the client is told to come back, not that the server failed.
STORE_ERRORS = (PyMongoError, SQLAlchemyError)


async def cache_from_mysql(ranges: StreamRanges, cache: RecentCache, high: int, page: int,
                           encode: Callable[[dict], Encoded] = encode_doc) -> bool:
    """Fills ``cache`` with the messages up to ``high`` from MySQL by primary
    key, a page at a time, each encoded as it comes (no peak of decoded rows);
    False if MySQL failed, and the cache is then left empty."""
    after = max(0, high - cache.max_messages)
    try:
        while after < high:
            docs = await ranges.between(after, high, page)
            if not docs:
                break
            cache.extend(docs, encode)
            after = docs[-1]["_id"]
    except SQLAlchemyError as exc:
        log.warning("event=cache_from_mysql_failed error=%s action=read_messages", exc.__class__.__name__)
        cache.clear()
        return False
    return True


async def stored_items(db: AsyncDatabase, user: str, since: int, upto: int, limit: int, retention_seconds: int,
                       admit: Callable[[list[dict]], list[dict]], partition: int = 0,
                       encode: Callable[[dict], Encoded] = encode_doc) -> AsyncGenerator[MessageOrGap, None]:
    """The user's messages from `messages`, ``limit`` per read, only those
    ``admit`` keeps (the writer's), and GAP where some of them may have been
    deleted before a read: the retention floor (the sweeper raises it before
    it deletes) or the TTL edge passed the read position."""
    after, newest = since, None
    while True:
        found = await mongo.messages_for(db, user, after, upto, limit, partition)
        # Read after the query, for the floor to cover what it deleted.
        if await mongo.retention_floor(db, partition) > after or (
                newest is not None and newest < mongo.expired_before(retention_seconds)):
            yield GAP
        for doc in admit(found):
            msg_id, _, _, newest, payload = encode(doc)
            yield msg_id, newest, payload
        if len(found) < limit:
            return
        after = found[-1]["_id"]  # a number (the query compares numbers), not always the writer's


async def committed_items(ranges: StreamRanges, user: str, since: int, upto: int, page: int,
                          encode: Callable[[dict], Encoded] = encode_doc) -> AsyncGenerator[MessageOrGap, None]:
    """The user's messages with since < id <= upto from MySQL, the truth, by
    primary key, ``page`` rows per read: for the ids the stream released from
    MySQL that the fast store may lack yet (``daemon.catchup.stored_upto``),
    and for a routed user's last seconds before the relay served it
    (``daemon.stream.Stream.pages``). Every row of the range is looked at, the
    user's sent back: short ranges. Raises SQLAlchemyError when MySQL fails:
    the catch-up ends with 1013 (the client resumes), never a silent gap."""
    after = since
    while after < upto:
        docs = await ranges.of_user(user, after, upto, page)
        for doc in docs:
            msg_id, _, _, created_at, payload = encode(doc)
            yield msg_id, created_at, payload
        if len(docs) < page:
            return
        after = docs[-1]["_id"]


class StoredIds:
    """Whether an id was ever written, for a client's ``since`` past the
    position: the truth (MySQL's committed head) when there is MySQL, else
    meta.head, then `messages` itself.

    meta.head is read first because it is cheap, but it lags the store: the
    writer moves it about once a second, and not while its Mongo writes fail.
    A ``since`` past it may be a message another daemon has delivered already,
    so the store is asked before the answer is "no such message" (which sends
    the client to reload history). One lookup at a time: on FerretDB each
    scans `messages`, and a crowd of made-up ids must not multiply that."""

    def __init__(self, db: AsyncDatabase, partition: int = 0):
        self._db = db
        self._partition = partition
        self._lookups = asyncio.Lock()
        self._known = 0  # the highest id found in `messages`: ids are gap-free, all below exist too

    async def contains(self, msg_id: int, known: int, committed: Callable[[], Awaitable[int | None]]) -> bool:
        """``known``: an id known to exist; ``committed``: reads MySQL's head (None: cannot say)."""
        try:
            if msg_id <= max(self._known, known, await mongo.newest_id(self._db, self._partition)):
                return True
            async with self._lookups:
                if msg_id <= self._known:  # found while this one waited
                    return True
                head = await committed()
                if head is not None:
                    return msg_id <= head
                if not await mongo.is_stored(self._db, msg_id, self._partition):
                    return False
                self._known = max(self._known, msg_id)
                return True
        except PyMongoError:
            return True
