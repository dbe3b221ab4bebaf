"""The daemon's unread totals, read at every hello, on their read-only engine (MariaDB's own
session counters): one SELECT per read, no ROLLBACK and no ping (MariaDB counts a COM_PING in
``Com_admin_commands``), and each read sees what was committed before it (autocommit: no
snapshot is kept from one read to the next)."""

import datetime

import pytest
from sqlalchemy import create_engine

from db.conversation_state import UnreadTotals
from db.partition_map import tables_of
from db.sql import conversation_key, make_engine
from harness.system import databases

COUNTERS = ("Com_select", "Com_rollback", "Com_admin_commands")


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("unread-reads")) as dbs:
        yield dbs


def message(msg_id: int, sender: str, recipient: str) -> dict:
    return {"id": msg_id, "sender": sender, "recipient": recipient, "conversation": conversation_key(sender, recipient),
            "body": "hi", "created_at": datetime.datetime(2026, 1, 1)}


def session_counters(engine) -> dict[str, int]:
    """The counters of the pool's one connection (``pool_size=1``, used one read at a time)."""
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute(f"SHOW SESSION STATUS WHERE Variable_name IN {COUNTERS!r}")
        return {name: int(value) for name, value in cursor.fetchall()}
    finally:
        raw.close()


async def test_each_read_is_one_select_with_no_rollback_nor_ping_and_sees_what_was_committed_before_it(dbs):
    engine = make_engine(dbs.mariadb.url(), 5.0, pool_size=1, reads_only=True)
    unread = UnreadTotals(engine)
    writes = create_engine(dbs.mariadb.url())
    try:
        assert await unread.total("reads-bob", 0, 5.0) == 0
        before = session_counters(engine)
        for n in (1, 2, 3):
            with writes.begin() as conn:
                conn.execute(tables_of(0).messages.insert(), [message(9_000 + n, "reads-alice", "reads-bob")])
            assert await unread.total("reads-bob", 0, 5.0) == n  # the same pooled connection, a fresh read
        after = session_counters(engine)
        assert {k: after[k] - before[k] for k in COUNTERS} == {"Com_select": 3, "Com_rollback": 0,
                                                               "Com_admin_commands": 0}
    finally:
        unread.close()
        writes.dispose()


async def test_a_read_whose_pooled_connection_was_killed_connects_again_and_is_answered(dbs):
    engine = make_engine(dbs.mariadb.url(), 5.0, pool_size=1, reads_only=True)
    unread = UnreadTotals(engine)
    try:
        assert await unread.total("reads-carol", 0, 5.0) == 0
        raw = engine.raw_connection()
        try:  # the pool's connection is killed from its own session: the next read finds it gone
            cursor = raw.cursor()
            cursor.execute("SELECT CONNECTION_ID()")
            (own,) = cursor.fetchone()
        finally:
            raw.close()
        killer = create_engine(dbs.mariadb.url())
        with killer.connect() as conn:
            conn.exec_driver_sql(f"KILL CONNECTION {int(own)}")
        killer.dispose()
        # the read finds it dead, and is made again on a new connection: answered
        assert await unread.total("reads-carol", 0, 5.0) == 0
    finally:
        unread.close()
