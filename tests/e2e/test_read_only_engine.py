"""Reads on a read-only engine (``db.sql.make_engine(reads_only=True)``), measured by MariaDB's own
session counters: the daemon's unread totals, read at every hello, and its once-a-second look-ups
(the committed head of each partition, the slot map's epoch). Each read is one SELECT, with no
ROLLBACK and no ping (MariaDB counts a COM_PING in ``Com_admin_commands``); each sees what was
committed before it (autocommit: no snapshot is kept from one read to the next); and a read whose
pooled connection was killed is answered on a new one."""

import asyncio
import datetime
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

from db.conversation_state import UnreadTotals
from db.partition_map import newer_slot_map, read_slot_map, tables_of, write_slot_map
from db.sql import conversation_key, make_engine, read_retrying
from db.stream_ranges import StreamRanges
from harness.system import databases

COUNTERS = ("Com_select", "Com_rollback", "Com_admin_commands")


@pytest.fixture(scope="module")
def dbs(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("unread-reads")) as dbs:
        yield dbs


@pytest.fixture
def reads(dbs) -> Iterator[Engine]:
    """A read-only engine of one pooled connection, as the daemon's look-ups and unread reads use."""
    engine = make_engine(dbs.mariadb.url(), 5.0, pool_size=1, reads_only=True)
    yield engine
    engine.dispose()


@pytest.fixture
def writes(dbs) -> Iterator[Engine]:
    """Commits from another session, as the writer's."""
    engine = create_engine(dbs.mariadb.url())
    yield engine
    engine.dispose()


def commit_message(writes: Engine, msg_id: int, sender: str, recipient: str) -> None:
    with writes.begin() as conn:
        conn.execute(tables_of(0).messages.insert(), [{
            "id": msg_id, "sender": sender, "recipient": recipient, "conversation": conversation_key(sender, recipient),
            "body": "hi", "created_at": datetime.datetime(2026, 1, 1)}])


def session_counters(engine: Engine) -> dict[str, int]:
    """The counters of the pool's one connection (``pool_size=1``, used one read at a time)."""
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute(f"SHOW SESSION STATUS WHERE Variable_name IN {COUNTERS!r}")
        return {name: int(value) for name, value in cursor.fetchall()}
    finally:
        raw.close()


def counted_since(engine: Engine, before: dict[str, int]) -> dict[str, int]:
    after = session_counters(engine)
    return {k: after[k] - before[k] for k in COUNTERS}


def kill_pooled_connection(dbs, engine: Engine) -> None:
    """Kills the pool's one connection from another session, as a MySQL restart or a
    ``wait_timeout`` would: the pool still holds it, and only a read finds it dead."""
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        cursor.execute("SELECT CONNECTION_ID()")
        (own,) = cursor.fetchone()
    finally:
        raw.close()
    killer = create_engine(dbs.mariadb.url())
    with killer.connect() as conn:
        conn.exec_driver_sql(f"KILL CONNECTION {int(own)}")
    killer.dispose()


async def test_each_read_is_one_select_with_no_rollback_nor_ping_and_sees_what_was_committed_before_it(reads, writes):
    unread = UnreadTotals(reads)
    try:
        assert await unread.total("reads-bob", 0, 5.0) == 0
        before = session_counters(reads)
        for n in (1, 2, 3):
            commit_message(writes, 9_000 + n, "reads-alice", "reads-bob")
            assert await unread.total("reads-bob", 0, 5.0) == n  # the same pooled connection, a fresh read
        assert counted_since(reads, before) == {"Com_select": 3, "Com_rollback": 0, "Com_admin_commands": 0}
    finally:
        unread.close()


async def test_users_asked_for_while_a_read_is_in_flight_are_answered_together_each_with_their_own_total(
        reads, writes):
    unread = UnreadTotals(reads)
    users = [f"burst-{n}" for n in range(40)] + ["burst-o'brien"]  # a quote: the list is the driver's to escape
    for n, user in enumerate(users[:5]):
        for k in range(n + 1):
            commit_message(writes, 9_100 + 10 * n + k, "burst-alice", user)
    try:
        before = session_counters(reads)
        # a connect burst: the first is read alone, every other one joins the next read; one user
        # asked for twice shares the answer
        answers = await asyncio.gather(*(unread.total(u, 0, 5.0) for u in users + users[:2]))
        assert answers == [1, 2, 3, 4, 5] + [0] * (len(users) - 5) + [1, 2]
        assert counted_since(reads, before) == {"Com_select": 2, "Com_rollback": 0, "Com_admin_commands": 0}
    finally:
        unread.close()


async def test_past_read_most_users_the_ones_waiting_are_read_in_statements_of_at_most_that_many(
        reads, writes, monkeypatch):
    monkeypatch.setattr(UnreadTotals, "READ_MOST", 10)
    unread = UnreadTotals(reads)
    users = [f"most-{n}" for n in range(25)]
    commit_message(writes, 9_300, "most-alice", users[-1])
    try:
        before = session_counters(reads)
        answers = await asyncio.gather(*(unread.total(u, 0, 5.0) for u in users))
        assert answers == [0] * 24 + [1]
        # the first alone, then the 24 waiting in reads of 10, 10 and 4
        assert counted_since(reads, before) == {"Com_select": 4, "Com_rollback": 0, "Com_admin_commands": 0}
    finally:
        unread.close()


async def test_a_read_whose_pooled_connection_was_killed_connects_again_and_is_answered(dbs, reads):
    unread = UnreadTotals(reads)
    try:
        assert await unread.total("reads-carol", 0, 5.0) == 0
        kill_pooled_connection(dbs, reads)  # the next read finds it gone
        # the read finds it dead, and is made again on a new connection: answered
        assert await unread.total("reads-carol", 0, 5.0) == 0
    finally:
        unread.close()


async def test_the_daemon_s_periodic_look_ups_are_one_select_each_with_no_rollback_nor_ping(reads, writes):
    ranges = StreamRanges(reads)
    original = read_retrying(reads, read_slot_map)
    assert original is not None
    try:
        first = await ranges.committed_head()
        before = session_counters(reads)
        commit_message(writes, first + 1, "look-alice", "look-bob")
        assert await ranges.committed_head() == first + 1  # a fresh read: what was committed before it
        assert read_retrying(reads, lambda conn: newer_slot_map(conn, original.epoch)) is None  # nothing moved
        assert counted_since(reads, before) == {"Com_select": 2, "Com_rollback": 0, "Com_admin_commands": 0}
        moved = original.move([], 0)  # the same map at the next epoch, as a cutover writes it
        with writes.begin() as conn:
            write_slot_map(conn, moved)
        # the next look-up, on the same connection, sees the map of the next epoch
        assert read_retrying(reads, lambda conn: newer_slot_map(conn, original.epoch)) == moved
    finally:
        with writes.begin() as conn:  # the map as it was, for the module's other tests
            write_slot_map(conn, original)
        ranges.close()


async def test_a_look_up_whose_pooled_connection_was_killed_connects_again_and_is_answered(dbs, reads):
    ranges = StreamRanges(reads)
    try:
        head = await ranges.committed_head()
        kill_pooled_connection(dbs, reads)
        assert await ranges.committed_head() == head  # found dead, and read again on a new connection
    finally:
        ranges.close()
