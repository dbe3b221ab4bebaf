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
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.expression import TextClause

from chat.messages import Kind
from chat.partitions import suffix
from db.sql import retrying_dead_connections
from db.threads import Threads


@functools.cache
def _unread_sql(partition: int) -> TextClause:
    return text(
        f"SELECT m.sender AS peer, COUNT(*) AS n FROM messages{suffix(partition)} m "
        "LEFT JOIN read_markers r ON r.reader = m.recipient AND r.peer = m.sender "
        f"WHERE m.recipient = :user AND m.sender <> :user AND m.kind = {int(Kind.MESSAGE)} AND m.deleted = 0 "
        "AND m.id > COALESCE(r.upto, 0) GROUP BY m.sender")


@functools.cache
def _unread_totals_sql(partition: int) -> TextClause:
    return text(
        f"SELECT m.recipient AS user, COUNT(*) AS n FROM messages{suffix(partition)} m "
        "LEFT JOIN read_markers r ON r.reader = m.recipient AND r.peer = m.sender "
        f"WHERE m.recipient IN :users AND m.sender <> m.recipient AND m.kind = {int(Kind.MESSAGE)} "
        "AND m.deleted = 0 AND m.id > COALESCE(r.upto, 0) GROUP BY m.recipient"
    ).bindparams(bindparam("users", expanding=True))


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

    def __init__(self, engine: Engine, threads: int = 2):
        self._engine = engine
        self._threads = Threads(threads, "unread")
        self._dbapi_error: Any = engine.dialect.loaded_dbapi.Error  # the driver's own class, as the dialect expects it
        self._statements: dict[int, tuple[str, tuple[str, ...]]] = {}  # per partition: driver SQL, its parameters

    def _statement(self, partition: int) -> tuple[str, tuple[str, ...]]:
        if partition not in self._statements:
            compiled = _unread_sql(partition).compile(dialect=self._engine.dialect)
            self._statements[partition] = (compiled.string, tuple(compiled.positiontup or ()))
        return self._statements[partition]

    async def total(self, user: str, partition: int, timeout: float) -> int | None:
        """The user's unread messages over every conversation; None if MySQL did not answer within ``timeout``."""
        sql, names = self._statement(partition)
        params = tuple({"user": user}[name] for name in names)

        def read() -> int:
            raw = self._engine.raw_connection()
            try:
                cursor = raw.cursor()
                cursor.execute(sql, params)
                found = sum(int(n) for _peer, n in cursor.fetchall())
                cursor.close()
                return found
            except self._dbapi_error:
                raw.invalidate()  # not handed to the next read
                raise
            finally:
                raw.close()

        try:
            return await asyncio.wait_for(self._threads.run(retrying_dead_connections, self._engine, read), timeout)
        except (SQLAlchemyError, self._dbapi_error, TimeoutError):
            return None

    def close(self) -> None:
        self._threads.close()
        self._engine.dispose()
