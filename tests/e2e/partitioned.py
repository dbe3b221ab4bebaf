"""Messages stored where the partitioned writer stores them, for the daemons' tests.

The one place the delivery tests write partitioned messages: a message in
its sender's partition (its *home*), and, for a recipient in another
partition, a copy there with an id of that partition's own sequence. Each as
a row of that partition's MySQL table (``db.partition_map.tables_of``), then
the same document in its Mongo collection (``chat.partitions.collection_name``),
then the partition's ``stream_state`` and meta head moved past it: the order
and the shapes of writer/mirror.py. One writer (this one) per partition, so
ids are gap-free in each.
"""

from __future__ import annotations

from dataclasses import dataclass

import pymongo
from sqlalchemy import func, select
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.engine import Engine

from chat.messages import Message, now_ms
from chat.partitions import SlotMap, collection_name
from db import mongo
from db.partition_map import ensure_tables, tables_of, write_slot_map
from db.sql import conversation_key, make_engine
from tests.system import Databases


@dataclass(frozen=True)
class Stored:
    """A message as stored: its id in the sender's partition, and its copy's in the recipient's (None: same one)."""

    home: int
    home_id: int
    copy: int | None = None
    copy_id: int | None = None


class PartitionedStore:
    def __init__(self, dbs: Databases, slot_map: SlotMap, mongo_db: str = "chat"):
        self.slot_map = slot_map
        self.engine: Engine = make_engine(dbs.mariadb.url(), 5)
        self._client: pymongo.MongoClient = pymongo.MongoClient(dbs.ferretdb.url, tz_aware=True)
        self._db = self._client[mongo_db]

    def lay_out(self) -> None:
        """The partitions' tables and the slot map in MySQL, as `db.init` leaves them."""
        ensure_tables(self.engine, self.slot_map.partitions)
        with self.engine.begin() as conn:
            write_slot_map(conn, self.slot_map)

    def move(self, slots: list[int], to: int) -> SlotMap:
        """Moves slots (the writers are stopped): the map at the next epoch."""
        self.slot_map = self.slot_map.move(slots, to)
        ensure_tables(self.engine, self.slot_map.partitions)
        with self.engine.begin() as conn:
            write_slot_map(conn, self.slot_map)
        return self.slot_map

    def send(self, sender: str, recipient: str, body: str) -> Stored:
        home, other = self.slot_map.partition_of(sender), self.slot_map.partition_of(recipient)
        home_id = self._store(home, sender, recipient, body)
        if other == home:
            return Stored(home, home_id)
        return Stored(home, home_id, other, self._store(other, sender, recipient, body))

    def _store(self, partition: int, sender: str, recipient: str, body: str) -> int:
        tables = tables_of(partition)
        with self.engine.begin() as conn:
            msg_id = int(conn.execute(select(func.coalesce(func.max(tables.messages.c.id), 0))).scalar_one()) + 1
            message = Message(msg_id, sender, recipient, body, now_ms())
            conn.execute(tables.messages.insert().values(
                id=msg_id, sender=sender, recipient=recipient, conversation=conversation_key(sender, recipient),
                body=body, client_msg_id=None, created_at=message.created_at.replace(tzinfo=None)))
        self._db[collection_name(partition)].insert_one(message.to_doc())
        with self.engine.begin() as conn:
            state = tables.stream_state
            conn.execute(mysql_insert(state).values(id=1, last_id=msg_id, mirrored_upto=msg_id)
                         .on_duplicate_key_update(last_id=msg_id, mirrored_upto=msg_id))
        self._db[mongo.META].update_one({"_id": mongo.head_key(partition)}, {"$max": {"id": msg_id}}, upsert=True)
        return msg_id

    def close(self) -> None:
        self.engine.dispose()
        self._client.close()
