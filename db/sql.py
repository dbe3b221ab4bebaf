"""The permanent store's schema (MySQL/MariaDB) as SQLAlchemy Core tables.

Migrations in db/migrations create exactly these tables; a test compares them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    create_engine,
    false,
)
from sqlalchemy.dialects.mysql import DATETIME
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.pool import QueuePool

if TYPE_CHECKING:
    from chat.messages import Message

T = TypeVar("T")

metadata = MetaData()

# Ids are assigned by the writer under one lock (writer/message_writer.py), not by
# AUTO_INCREMENT: they must be gap-free and in commit order so that the
# daemons can tell a missed message from one that was never written.
messages = Table(
    "messages",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("sender", String(64, collation="utf8mb4_bin"), nullable=False),
    Column("recipient", String(64, collation="utf8mb4_bin"), nullable=False),
    # "a\x00b" with a <= b: one key per one-to-one conversation, for history.
    Column("conversation", String(129, collation="utf8mb4_bin"), nullable=False),
    Column("body", Text(collation="utf8mb4_bin"), nullable=False),
    Column("client_msg_id", String(64, collation="utf8mb4_bin"), nullable=True),
    Column("created_at", DATETIME(fsp=3), nullable=False),
    # A copy (chat.partitions: the recipient's partition holds every message the
    # recipient got) names its original: the sender's partition and the id there.
    # NULL on originals. Unique, so that a copy is made at most once.
    Column("origin_part", SmallInteger, nullable=True),
    Column("origin_id", BigInteger, nullable=True),
    # A row is a message (kind 0) or an event of the conversation (chat.messages.Kind,
    # docs/receipts.md): ref_id names its message, an id of this same table.
    Column("kind", SmallInteger, nullable=False, server_default="0"),
    Column("ref_id", BigInteger, nullable=True),
    # A message's latest edit, and its deletion (body ""): the row holds its latest version.
    Column("edited_at", DATETIME(fsp=3), nullable=True),
    Column("deleted", Boolean, nullable=False, server_default="0"),
    UniqueConstraint("sender", "client_msg_id", name="uq_messages_sender_client_msg_id"),
    UniqueConstraint("origin_part", "origin_id", name="uq_messages_origin"),
    Index("ix_messages_conversation_id", "conversation", "id"),
    # GET /v1/conversations: the newest id per peer, from either side.
    Index("ix_messages_sender_recipient_id", "sender", "recipient", "id"),
    Index("ix_messages_recipient_sender_id", "recipient", "sender", "id"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
    mysql_collate="utf8mb4_bin",
)

# One row. last_id: highest id written to MySQL as of the writer's last
# checkpoint (each second, and each session's end; the writer itself takes the
# greater of it and MAX(messages.id)). mirrored_upto: highest id known to be in
# MongoDB; every id past it is the outbox that the repair step copies before
# any newer message (writer/message_writer.py).
stream_state = Table(
    "stream_state",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("last_id", BigInteger, nullable=False),
    Column("mirrored_upto", BigInteger, nullable=False),
    mysql_engine="InnoDB",
)


# One row (id 1): the slot map of chat.partitions, as SlotMap.encode() writes it.
# Written by `db.init` once (CHAT_PARTITIONS) and by moves of slots; every
# writer and daemon reads it when it starts (db/partition_map.py).
partition_map = Table(
    "partition_map",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),
    Column("slot_map", Text, nullable=False),
    mysql_engine="InnoDB",
)


# Copies owed: a message committed in partition from_part whose recipient is in
# to_part. The original's commit inserts the row, the copy's commit deletes it,
# each in its own transaction: a writer that dies between the two leaves the
# row, and the next writer of to_part makes the copy (writer/copies.py).
echoes = Table(
    "echoes",
    metadata,
    Column("to_part", SmallInteger, primary_key=True, autoincrement=False),
    Column("from_part", SmallInteger, primary_key=True, autoincrement=False),
    Column("from_id", BigInteger, primary_key=True, autoincrement=False),
    mysql_engine="InnoDB",
)


# Read markers: ``upto`` is the newest message of ``peer``'s that ``reader`` has read,
# an id of the reader's partition (the partition that holds every message the
# reader got). Only ever raised (the writer's read step: GREATEST).
read_markers = Table(
    "read_markers",
    metadata,
    Column("reader", String(64, collation="utf8mb4_bin"), primary_key=True),
    Column("peer", String(64, collation="utf8mb4_bin"), primary_key=True),
    Column("upto", BigInteger, nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
    mysql_collate="utf8mb4_bin",
)

# Each device's acknowledged position in its user's partition's stream: what
# the device has received. Only ever raised. Delivery receipts are written
# from it, and offline push reads it ("no device of this user has it").
device_acks = Table(
    "device_acks",
    metadata,
    Column("user", String(64, collation="utf8mb4_bin"), primary_key=True),
    Column("device", String(64, collation="utf8mb4_bin"), primary_key=True),
    Column("upto", BigInteger, nullable=False),
    Column("acked_at", DATETIME(fsp=3), nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
    mysql_collate="utf8mb4_bin",
)


# A user's registered push devices (POST /v1/devices): a device id the client
# picks, and what the push gateway needs to reach it (docs/push.md).
devices = Table(
    "devices",
    metadata,
    Column("user", String(64, collation="utf8mb4_bin"), primary_key=True),
    Column("device", String(64, collation="utf8mb4_bin"), primary_key=True),
    Column("platform", String(16, collation="utf8mb4_bin"), nullable=False),
    Column("app_id", String(128, collation="utf8mb4_bin"), nullable=False),
    Column("pushkey", String(512, collation="utf8mb4_bin"), nullable=False),
    Column("data", Text(collation="utf8mb4_bin"), nullable=False),  # JSON object, passed to the gateway
    Column("created_at", DATETIME(fsp=3), nullable=False),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
    mysql_collate="utf8mb4_bin",
)

# Each user's last seen (the end of their last connection anywhere, after
# the grace) and whether they hide their presence (docs/presence.md). Online
# itself lives in Redis, never here.
presence = Table(
    "presence",
    metadata,
    Column("user", String(64, collation="utf8mb4_bin"), primary_key=True),
    Column("last_seen", DATETIME(fsp=3), nullable=True),
    Column("hidden", Boolean, nullable=False, server_default=false()),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
    mysql_collate="utf8mb4_bin",
)

# The pusher's progress per partition: every row up to ``upto`` is decided
# (its notifications are in push_outbox, or it needs none).
push_state = Table(
    "push_state",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False),  # the partition
    Column("upto", BigInteger, nullable=False),
    mysql_engine="InnoDB",
)

# Notifications decided and not yet accepted by the gateway: written in the
# transaction that moves push_state, deleted once the gateway answers, so that
# a pusher killed in between sends them after its restart (with the same key).
push_outbox = Table(
    "push_outbox",
    metadata,
    Column("key", String(160, collation="utf8mb4_bin"), primary_key=True),  # the idempotency key
    Column("partition", SmallInteger, nullable=False),
    Column("user", String(64, collation="utf8mb4_bin"), nullable=False),
    Column("device", String(64, collation="utf8mb4_bin"), nullable=False),
    Column("notification", Text(collation="utf8mb4_bin"), nullable=False),  # the gateway request's JSON
    Column("created_at", DATETIME(fsp=3), nullable=False),
    Column("attempts", SmallInteger, nullable=False, server_default="0"),
    Column("next_at", DATETIME(fsp=3), nullable=False),
    Index("ix_push_outbox_partition_next_at", "partition", "next_at"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
    mysql_collate="utf8mb4_bin",
)


def conversation_key(a: str, b: str) -> str:
    return f"{a}\x00{b}" if a <= b else f"{b}\x00{a}"


MESSAGE_COLUMNS = tuple(c.name for c in messages.columns)  # every partition's table has these, in this order


def message_values(m: Message) -> tuple:
    """A message as a row of a partition's `messages` table, in ``MESSAGE_COLUMNS``' order
    (``Message.from_row`` reads one back); times in UTC without a zone. A tuple: the writer
    sends it as one row of its batch's INSERT, once per message."""
    return (m.id, m.sender, m.recipient, conversation_key(m.sender, m.recipient), m.body, m.client_msg_id,
            m.created_at.replace(tzinfo=None), m.origin_part, m.origin_id, int(m.kind), m.ref_id,
            None if m.edited_at is None else m.edited_at.replace(tzinfo=None), m.deleted)


def message_row(m: Message) -> dict:
    """The same row by column name, for SQLAlchemy's inserts (the mover's copies)."""
    return dict(zip(MESSAGE_COLUMNS, message_values(m), strict=True))


MAX_OVERFLOW = 2  # connections an engine may open past its pool_size, under a burst


def make_engine(url: str, timeout_seconds: float, pool_size: int = 4, reads_only: bool = False) -> Engine:
    """``reads_only``: every statement is its own transaction (autocommit), no ROLLBACK is sent when
    a connection is closed or goes back to the pool, and none is pinged when it is taken from the
    pool: a read is one round trip. Its callers read through ``read_retrying`` (or, on raw
    connections, as ``UnreadTotals`` does), which reads again on a fresh connection when one turns
    out dead: a ping and a rollback per read were two more round trips per hello, and most of what
    an idle daemon's once-a-second look-ups cost."""
    # connect_timeout keeps "MySQL down" a fast 503 rather than a hang;
    # max_statement_time (MariaDB) does the same for "MySQL slow".
    timeout = max(1, int(round(timeout_seconds)))
    reads: dict = {"isolation_level": "AUTOCOMMIT", "pool_reset_on_return": None,
                   "skip_autocommit_rollback": True} if reads_only else {}
    return create_engine(
        url,
        **reads,
        pool_size=pool_size,
        max_overflow=MAX_OVERFLOW,
        pool_timeout=timeout_seconds,
        pool_pre_ping=not reads_only,
        pool_recycle=3600,
        connect_args={
            "connect_timeout": timeout,
            "read_timeout": timeout + 1,
            "write_timeout": timeout + 1,
            "init_command": f"SET SESSION max_statement_time={timeout_seconds:g}",
        },
    )


def retrying_dead_connections(engine: Engine, attempt: Callable[[], T]) -> T:
    """``attempt()``, made again when the connection it took from ``engine``'s pool turns out dead,
    at most pool size + 1 times in all: an engine made ``reads_only`` pings none (SQLAlchemy calls
    this optimistic disconnect handling). After a MySQL restart every pooled connection is dead,
    then a new one connects (or fails to: the answer). A dead connection shows as SQLAlchemy's
    invalidated ``DBAPIError`` through a ``Connection``, or as the driver's own error on a raw one
    (whose ``attempt`` invalidates it)."""
    dialect = engine.dialect
    driver_error = dialect.loaded_dbapi.Error  # the driver's own class, as the dialect expects it
    for _ in range(pool_size_of(engine)):
        try:
            return attempt()
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
        except driver_error as exc:
            if not dialect.is_disconnect(exc, None, None):
                raise
    return attempt()


def read_retrying(engine: Engine, read: Callable[[Connection], T]) -> T:
    """``read(conn)`` on a connection of ``engine`` (``retrying_dead_connections``). Raises
    SQLAlchemyError as ``read`` does."""

    def attempt() -> T:
        with engine.connect() as conn:
            return read(conn)

    return retrying_dead_connections(engine, attempt)


def pool_size_of(engine: Engine) -> int:
    """The connections ``engine`` keeps open: ``make_engine``'s ``pool_size``
    (a QueuePool's), else 1: one connection at a time is always safe."""
    pool = engine.pool
    return pool.size() if isinstance(pool, QueuePool) else 1


_ER_LOCK_DEADLOCK = 1213


def is_deadlock(exc: OperationalError) -> bool:
    """InnoDB chose this statement's transaction as a deadlock's victim and rolled it back whole."""
    args: tuple = getattr(exc.orig, "args", ())
    return bool(args) and args[0] == _ER_LOCK_DEADLOCK
