"""A range of one partition's message stream, read from MySQL, the permanent store.

A daemon whose oplog tail skipped ids (it fell off the oplog, or FerretDB
stored a document without its oplog entry) holds what came after them and
reads the hole back. A hole is always below an id the oplog has shown, and
ids reach Mongo in id order (writer/message_writer.py), so every id in it is committed
in MySQL and in Mongo alike: either store can fill it.

MySQL is asked first because it answers from its primary key. FerretDB 1.24
pushes no integer ``_id`` condition down to SQLite, so its answer decodes the
whole `messages` collection: under 3,000 POST/s the daemons fell off its small
oplog about twice a second each, and those scans took most of its CPU
(docs/decisions/holes-from-mysql.md). On MongoDB both are index reads; MySQL's is still the
one that never competes with the tail for the same server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import func, or_, select, text
from sqlalchemy.engine import Engine

from chat.messages import Message
from db.batched_reads import BatchedReads
from db.partition_map import tables_of
from db.sql import pool_size_of, read_retrying
from db.threads import Threads


class Confirmation(NamedTuple):
    """MySQL's answer for a range of ids a daemon holds documents of."""

    head: int  # the highest id committed (0 if none)
    rows: int  # rows in the range
    digest: int  # chat.messages.shown_digest_of those rows


class UserRange(NamedTuple):
    """A user's messages (either side) with after < id <= upto, the oldest ``limit``."""

    user: str
    after: int
    upto: int
    limit: int


# One read answers the users' ranges asked for meanwhile when together they span at most this
# many ids (so it returns at most this many rows), up to READ_USERS_MOST of them.
READ_SPAN_MOST = 5000
READ_USERS_MOST = 500


def one_read(asked: Sequence[UserRange], span: int = READ_SPAN_MOST, most: int = READ_USERS_MOST) -> list[int]:
    """Which of ``asked`` (oldest first; their indexes) one read answers: the oldest, and
    every later one that keeps the read within ``span`` ids, up to ``most``. A range longer
    than ``span`` is read alone. Pure."""
    low, high = asked[0].after, asked[0].upto
    chosen = [0]
    if high - low > span:
        return chosen
    for i in range(1, len(asked)):
        if len(chosen) >= most:
            break
        lo, hi = min(low, asked[i].after), max(high, asked[i].upto)
        if hi - lo <= span:
            chosen.append(i)
            low, high = lo, hi
    return chosen


def answers(docs: Sequence[dict], asked: Sequence[UserRange]) -> list[list[dict]]:
    """Each range's documents out of one read's (oldest first, every row of the users
    and of the ids asked): its user's, within its ids, at most its ``limit``. Pure."""
    by_user: dict[str, list[dict]] = {ask.user: [] for ask in asked}
    for doc in docs:
        for user in (doc["from"], doc["to"]) if doc["from"] != doc["to"] else (doc["from"],):
            if user in by_user:
                by_user[user].append(doc)
    found = []
    for ask in asked:
        mine = [doc for doc in by_user[ask.user] if ask.after < doc["_id"] <= ask.upto]
        found.append(mine[:ask.limit])
    return found


class StreamRanges:
    """Reads ``after < id <= upto`` of ``partition``'s table as the documents its collection holds for them.
    ``engine``: made ``reads_only`` (``db.sql.make_engine``), each read one round trip."""

    def __init__(self, engine: Engine, partition: int = 0):
        self._engine = engine
        self.partition = partition
        self._messages = tables_of(partition).messages  # the partition's table: `messages` for 0
        self._threads = Threads(pool_size_of(engine), "ranges")
        self._user_ranges: BatchedReads[UserRange, list[dict]] = BatchedReads(
            self._threads, self._read_users, one_read, in_flight=self._threads.count)
        self._head_sql = select(func.coalesce(func.max(self._messages.c.id), 0))
        # chat.messages.shown_digest, row by row, combined by XOR: the same text,
        # hashed the same way (utf8mb4 is UTF-8; CHAR_LENGTH counts code points, as len() does)
        table = self._messages.name
        self._confirm_sql = text(
            f"SELECT (SELECT COALESCE(MAX(id), 0) FROM {table}), COUNT(*), COALESCE(BIT_XOR(CAST(CONV(LEFT(SHA2("
            f"CONCAT_WS(CHAR(31 USING utf8mb4), id, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) DIV 1000, "
            f"IFNULL(client_msg_id, ''), CHAR_LENGTH(sender), sender, CHAR_LENGTH(recipient), recipient, body, "
            # an event's kind and ref; NULL for a message, which CONCAT_WS leaves out
            f"IF(kind = 0, NULL, kind), IF(kind = 0, NULL, ref_id)), "
            f"256), 16), 16, 10) AS UNSIGNED)), 0) FROM {table} WHERE id > :after AND id <= :upto")

    async def between(self, after: int, upto: int, limit: int) -> list[dict]:
        """Oldest first, at most ``limit``; raises SQLAlchemyError when MySQL fails."""
        return await self._threads.run(self._read, after, upto, limit)

    async def of_user(self, user: str, after: int, upto: int, limit: int) -> list[dict]:
        """The user's messages (either side) with after < id <= upto, oldest first, at most
        ``limit``: a range of the primary key, the user picked by MySQL, so only the user's
        rows cross the wire. For short ranges (a catch-up's last few seconds): every row of
        the range is looked at. Raises SQLAlchemyError when MySQL fails.

        The users asked for while every thread reads are read together once one is free
        (``one_read``, ``db.batched_reads``): a restarted daemon's clients come back all at once, each first
        socket with such a catch-up, and each read of its own looked at the same rows."""
        return await self._user_ranges.ask(UserRange(user, after, upto, limit))

    def _read_users(self, asked: list[UserRange]) -> list[list[dict]]:
        if len(asked) == 1:
            ask = asked[0]
            return [self._read(ask.after, ask.upto, ask.limit, ask.user)]
        messages, users = self._messages, sorted({ask.user for ask in asked})
        query = select(messages).where(
            messages.c.id > min(ask.after for ask in asked), messages.c.id <= max(ask.upto for ask in asked),
            or_(messages.c.sender.in_(users), messages.c.recipient.in_(users))).order_by(messages.c.id)
        docs = read_retrying(self._engine, lambda conn: [Message.from_row(row).to_doc() for row in conn.execute(query)])
        return answers(docs, asked)

    async def committed_head(self) -> int:
        """The highest id committed to MySQL (0 if none): one look-up of the
        primary key's last entry. Ids are given in commit order under the
        writer lock, so every id up to it is committed too. Raises
        SQLAlchemyError when MySQL fails."""
        return await self._threads.run(self._head)

    async def confirm(self, after: int, upto: int) -> Confirmation:
        """The committed head, and the rows ``after < id <= upto`` as a count
        and a digest, in one statement: a daemon checks the oplog's documents
        of that range against it without reading the rows (their bodies) back.
        Raises SQLAlchemyError when MySQL fails."""
        return await self._threads.run(self._confirm, after, upto)

    def _confirm(self, after: int, upto: int) -> Confirmation:
        head, rows, digest = read_retrying(
            self._engine, lambda conn: conn.execute(self._confirm_sql, {"after": after, "upto": upto}).one())
        return Confirmation(int(head), int(rows), int(digest))

    def _head(self) -> int:
        return int(read_retrying(self._engine, lambda conn: conn.execute(self._head_sql).scalar_one()))

    def _read(self, after: int, upto: int, limit: int, user: str | None = None) -> list[dict]:
        messages = self._messages
        query = select(messages).where(messages.c.id > after, messages.c.id <= upto)
        if user is not None:
            query = query.where(or_(messages.c.sender == user, messages.c.recipient == user))
        query = query.order_by(messages.c.id).limit(limit)
        return read_retrying(self._engine, lambda conn: [Message.from_row(row).to_doc() for row in conn.execute(query)])

    def close(self) -> None:
        self._threads.close()
        self._engine.dispose()
