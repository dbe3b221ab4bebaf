"""A user's conversations' state, read from their partition's table: unread
counts, their read markers, and how far each peer has received and read
(docs/receipts.md). The API's conversation list and a daemon's hello read it.

Exact by construction: a user's partition holds every message they sent or
received, each read marker is an id of that same sequence, and a deleted
message is not unread.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.sql.expression import TextClause

from chat.messages import Kind
from chat.partitions import suffix
from db.batched_reads import BatchedReads
from db.sql import retrying_dead_connections
from db.threads import Threads

log = logging.getLogger("chat.unread")


@functools.cache
def _unread_sql(partition: int) -> TextClause:
    return text(
        f"SELECT m.sender AS peer, COUNT(*) AS n FROM messages{suffix(partition)} m "
        "LEFT JOIN read_markers r ON r.reader = m.recipient AND r.peer = m.sender "
        f"WHERE m.recipient = :user AND m.sender <> :user AND m.kind = {int(Kind.MESSAGE)} AND m.deleted = 0 "
        "AND m.id > COALESCE(r.upto, 0) GROUP BY m.sender")


def _unread_totals_text(partition: int) -> TextClause:
    return text(
        f"SELECT m.recipient AS user, COUNT(*) AS n FROM messages{suffix(partition)} m "
        "LEFT JOIN read_markers r ON r.reader = m.recipient AND r.peer = m.sender "
        f"WHERE m.recipient IN :users AND m.sender <> m.recipient AND m.kind = {int(Kind.MESSAGE)} "
        "AND m.deleted = 0 AND m.id > COALESCE(r.upto, 0) GROUP BY m.recipient")


@functools.cache
def _unread_totals_sql(partition: int) -> TextClause:
    return _unread_totals_text(partition).bindparams(bindparam("users", expanding=True))


@functools.cache
def _peer_markers_sql(partition: int) -> TextClause:
    return text(
        f"SELECT sender AS peer, kind, MAX(ref_id) AS upto FROM messages{suffix(partition)} "
        f"WHERE recipient = :user AND sender <> :user AND kind IN ({int(Kind.READ)}, {int(Kind.DELIVERED)}) "
        "GROUP BY sender, kind")


_MARKERS_SQL = text("SELECT peer, upto FROM read_markers WHERE reader = :user")


def unread_by_peer(conn: Connection, partition: int, user: str) -> dict[str, int]:
    """Per peer: their messages to ``user`` above ``user``'s read marker, deleted ones aside."""
    return {row.peer: int(row.n) for row in conn.execute(_unread_sql(partition), {"user": user})}


def unread_totals(conn: Connection, partition: int, users: set[str]) -> dict[str, int]:
    """Each user's unread total over every conversation, in one statement (the pusher's badges)."""
    if not users:
        return {}
    found = {row.user: int(row.n) for row in conn.execute(_unread_totals_sql(partition), {"users": sorted(users)})}
    return {user: found.get(user, 0) for user in users}


def read_markers_of(conn: Connection, user: str) -> dict[str, int]:
    """Per peer: the newest of their messages ``user`` has read (an id of ``user``'s partition)."""
    return {row.peer: int(row.upto) for row in conn.execute(_MARKERS_SQL, {"user": user})}


def peer_markers(conn: Connection, partition: int, user: str) -> dict[str, dict[str, int]]:
    """Per peer: {"read": id, "delivered": id}, the newest of ``user``'s messages
    the peer has read and received, as the events in ``user``'s stream say (ids of it)."""
    found: dict[str, dict[str, int]] = {}
    for row in conn.execute(_peer_markers_sql(partition), {"user": user}):
        name = "read" if row.kind == Kind.READ else "delivered"
        found.setdefault(row.peer, {})[name] = int(row.upto)
    return found


class UnreadTotals:
    """A daemon's reads of its users' unread totals (the hello's and a poll
    answer's ``unread``), on threads and an engine of their own: a slow count
    never holds a read of the stream's truth back.

    One read per partition is in flight at a time, and it answers every user
    asked for meanwhile (up to ``READ_MOST``) in one statement (``db.batched_reads``): a burst of
    connects, as after a daemon's restart, costs one round trip and one
    thread hand-off per read, not per socket. A user alone waits for no one.

    A read is one statement on a pooled DBAPI connection of an engine made with
    ``reads_only`` (``db.sql.make_engine``): autocommit, so each read sees what
    was committed before it, and nothing to roll back on return. Through a
    SQLAlchemy ``Connection`` each read also cost a ROLLBACK round trip (it
    rolls back on close, and mysqlclient sends that in autocommit too), on
    the path of every hello. Nor is a connection pinged when it is taken from
    the pool (another round trip per read): a read that finds its connection
    dead (MySQL restarted, or the connection killed) is made once more on a
    new one (``db.sql.retrying_dead_connections``). It stays on the raw
    connection: through a ``Connection`` with neither round trip, a read still
    cost 1.3-1.45x its client CPU (3,000 reads, three rounds)."""

    READ_MOST = 500  # users in one statement

    def __init__(self, engine: Engine, threads: int = 2):
        self._engine = engine
        self._threads = Threads(threads, "unread")
        self._dbapi_error: Any = engine.dialect.loaded_dbapi.Error  # the driver's own class, as the dialect expects it
        self._reads: dict[int, BatchedReads[str, int | None]] = {}  # per partition: one read in flight

    async def total(self, user: str, partition: int, timeout: float) -> int | None:
        """The user's unread messages over every conversation; None if MySQL did not answer within ``timeout``."""
        reads = self._reads.get(partition)
        if reads is None:
            reads = self._reads[partition] = BatchedReads(
                self._threads, functools.partial(self._read, self._statement(partition)), self._choose, in_flight=1)
        try:
            # shielded: a waiter that gives up leaves the read to the others it answers
            return await asyncio.wait_for(asyncio.shield(reads.ask(user)), timeout)
        except TimeoutError:
            return None

    def _choose(self, waiting: Sequence[str]) -> list[int]:
        return list(range(min(len(waiting), self.READ_MOST)))

    def _statement(self, partition: int) -> str:
        # mysqlclient renders a tuple parameter as a parenthesised list: one %s for ``IN``
        return _unread_totals_text(partition).compile(dialect=self._engine.dialect).string

    def _read(self, sql: str, users: list[str]) -> list[int | None]:
        """Each user's total, in one statement; None for each if MySQL failed (the hello goes without)."""
        try:
            found = retrying_dead_connections(self._engine, functools.partial(self._select, sql, tuple(set(users))))
        except Exception as exc:  # whatever stopped the read, the hellos go out, saying they do not know
            log.warning("event=unread_read_failed users=%d error=%s detail=%s", len(users), exc.__class__.__name__, exc)
            return [None] * len(users)
        return [found.get(user, 0) for user in users]

    def _select(self, sql: str, users: tuple[str, ...]) -> dict[str, int]:
        raw = self._engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute(sql, (users,))
            found = {user: int(n) for user, n in cursor.fetchall()}
            cursor.close()
            return found
        except self._dbapi_error:
            raw.invalidate()  # not handed to the next read
            raise
        finally:
            raw.close()

    def close(self) -> None:
        self._threads.close()
        self._engine.dispose()
