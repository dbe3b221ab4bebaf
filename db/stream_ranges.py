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

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from db.partition_map import tables_of
from db.sql import pool_size_of, row_to_message
from db.threads import Threads


class StreamRanges:
    """Reads ``after < id <= upto`` of ``partition``'s table as the documents its collection holds for them."""

    def __init__(self, engine: Engine, partition: int = 0):
        self._engine = engine
        self.partition = partition
        self._messages = tables_of(partition).messages  # the partition's table: `messages` for 0
        self._threads = Threads(pool_size_of(engine), "ranges")

    async def between(self, after: int, upto: int, limit: int) -> list[dict]:
        """Oldest first, at most ``limit``; raises SQLAlchemyError when MySQL fails."""
        return await self._threads.run(self._read, after, upto, limit)

    async def committed_head(self) -> int:
        """The highest id committed to MySQL (0 if none): one look-up of the
        primary key's last entry. Ids are given in commit order under the
        writer lock, so every id up to it is committed too. Raises
        SQLAlchemyError when MySQL fails."""
        return await self._threads.run(self._head)

    def _head(self) -> int:
        with self._engine.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.max(self._messages.c.id), 0))).scalar_one())

    def _read(self, after: int, upto: int, limit: int) -> list[dict]:
        messages = self._messages
        query = (select(messages).where(messages.c.id > after, messages.c.id <= upto)
                 .order_by(messages.c.id).limit(limit))
        with self._engine.connect() as conn:
            return [row_to_message(row).to_doc() for row in conn.execute(query)]

    def close(self) -> None:
        self._threads.close()
        self._engine.dispose()
