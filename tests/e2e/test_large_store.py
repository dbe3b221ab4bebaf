"""The fast store grown large, on the real MariaDB and FerretDB: the writer's
outbox repair and the retention sweep each finish in bounded steps, whatever
the size of `messages`. On FerretDB every query of `messages` scans the whole
collection (2.4-2.8 s at 110,000 documents here) and a delete of more than
32,766 documents is refused; on MongoDB both are indexed and bounded anyway,
which FerretDB cannot show."""

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from chat.messages import Message, now_ms
from db import mongo, retention
from db.sql import make_engine
from db.threads import Threads
from tests.e2e.helpers import running_writer
from tests.system import databases

LARGE = 110_000


@pytest.fixture
def own_dbs(tmp_path):
    with databases(tmp_path) as d:
        yield d


async def _fill(dbs, first: int, last: int, created_at: datetime) -> None:
    """Messages first..last in both stores, as the writer leaves them, and
    stream_state saying that Mongo holds them all."""
    engine = make_engine(dbs.mariadb.url(), 30)
    with engine.begin() as conn:
        # MariaDB's sequence engine: one statement for the lot.
        conn.execute(text(f"INSERT INTO messages (id, sender, recipient, conversation, body, created_at) "
                          f"SELECT seq, 'filler', 'other', 'filler\\0other', 'x', :at "
                          f"FROM seq_{first}_to_{last}"), {"at": created_at.replace(tzinfo=None)})
        conn.execute(text("UPDATE stream_state SET last_id = :n, mirrored_upto = :n"), {"n": last})
    engine.dispose()
    client = mongo.make_client(dbs.ferretdb.url, 30)
    for lo in range(first, last + 1, 10_000):
        await client.chat[mongo.MESSAGES].insert_many([
            Message(i, "filler", "other", "x", created_at).to_doc() for i in range(lo, min(lo + 10_000, last + 1))])
    await client.close()


def _outbox_rows(dbs, msgs: list[Message]) -> None:
    """Committed to MySQL, never mirrored: what a writer that died after its commit leaves."""
    engine = make_engine(dbs.mariadb.url(), 30)
    with engine.begin() as conn:
        for m in msgs:
            conn.execute(text("INSERT INTO messages (id, sender, recipient, conversation, body, created_at) "
                              "VALUES (:id, :s, :r, :c, :b, :at)"),
                         {"id": m.id, "s": m.sender, "r": m.recipient, "c": f"{m.sender}\x00{m.recipient}",
                          "b": m.body, "at": m.created_at.replace(tzinfo=None)})
    engine.dispose()


async def test_the_outbox_drains_in_bounded_steps_however_large_the_fast_store(own_dbs):
    await _fill(own_dbs, 1, LARGE, now_ms())
    sender = f"s-{uuid.uuid4().hex[:8]}"
    outbox = [Message(LARGE + i, sender, "r", f"outbox {i}", now_ms()) for i in range(1, 51)]
    _outbox_rows(own_dbs, outbox)
    client = mongo.make_client(own_dbs.ferretdb.url, 30)
    db = client.chat
    # A crash mid-insert: the first half reached Mongo already.
    await db[mongo.MESSAGES].insert_many([m.to_doc() for m in outbox[:25]])
    seen: list[tuple[int, float]] = []
    started = time.monotonic()
    # A 1 s deadline per Mongo call: a read of what `messages` holds (a scan
    # of 110,000 documents) cannot finish within it, an insert can.
    async with running_writer(own_dbs, timeout_seconds=1,
                              observe_outbox=lambda n, age: seen.append((n, age))) as (_writer, engine, _db):
        deadline = time.monotonic() + 30
        while True:
            with engine.connect() as conn:
                mirrored = conn.execute(text("SELECT mirrored_upto FROM stream_state")).scalar()
            if mirrored == LARGE + 50:
                break
            assert time.monotonic() < deadline, f"the outbox did not drain: mirrored_upto={mirrored}"
            await asyncio.sleep(0.2)
    took = time.monotonic() - started
    ids = sorted([d["_id"] async for d in db[mongo.MESSAGES].find({"from": sender}, {"_id": 1})])
    assert ids == [m.id for m in outbox]  # each exactly once: a duplicate _id counted as there
    assert seen[0][0] == 50 and seen[-1] == (0, 0.0)  # reported while it lasted, then as empty
    assert took < 15, took
    await client.close()


async def test_an_outbox_larger_than_a_page_is_copied_page_by_page_each_message_once(own_dbs, monkeypatch):
    from writer import mysql_steps

    monkeypatch.setattr(mysql_steps, "REPAIR_PAGE", 10)  # 35 rows: 4 pages
    await _fill(own_dbs, 1, 100, now_ms())
    sender = f"s-{uuid.uuid4().hex[:8]}"
    outbox = [Message(100 + i, sender, "r", f"outbox {i}", now_ms()) for i in range(1, 36)]
    _outbox_rows(own_dbs, outbox)
    client = mongo.make_client(own_dbs.ferretdb.url, 30)
    db = client.chat
    await db[mongo.MESSAGES].insert_many([m.to_doc() for m in outbox[5:18]])  # part of it there already
    seen: list[int] = []
    async with running_writer(own_dbs, observe_outbox=lambda n, age: seen.append(n)) as (_writer, engine, _db):
        deadline = time.monotonic() + 30
        while True:
            # drained, and reported so: the empty report comes after the last page's commit
            with engine.connect() as conn:
                drained = conn.execute(text("SELECT mirrored_upto FROM stream_state")).scalar() == 135
            if drained and seen and seen[-1] == 0:
                break
            assert time.monotonic() < deadline, f"the outbox did not drain: reported {seen}"
            await asyncio.sleep(0.1)
    ids = sorted([d["_id"] async for d in db[mongo.MESSAGES].find({"from": sender}, {"_id": 1})])
    assert ids == [m.id for m in outbox]
    assert seen[:4] == [35, 25, 15, 5] and seen[-1] == 0  # one report per page, then empty
    await client.close()


async def test_a_sweep_of_100k_expired_messages_deletes_them_all_in_pieces(own_dbs):
    expired_at = datetime.now(UTC) - timedelta(days=2)
    await _fill(own_dbs, 1, 100_000, expired_at)
    fresh = [Message(100_000 + i, "fresh", "other", "kept", now_ms()) for i in range(1, 11)]
    _outbox_rows(own_dbs, fresh)
    client = mongo.make_client(own_dbs.ferretdb.url, 60)
    db = client.chat
    await db[mongo.MESSAGES].insert_many([m.to_doc() for m in fresh])
    engine = make_engine(own_dbs.mariadb.url(), 30)
    threads = Threads(1, "sweep-test")
    try:
        deleted = await retention.sweep_once(db, engine, threads, retention_seconds=86_400)
        assert deleted == 100_000
        assert await mongo.retention_floor(db) == 100_000
        left = sorted([d["_id"] async for d in db[mongo.MESSAGES].find({}, {"_id": 1})])
        assert left == [m.id for m in fresh]
        assert await retention.sweep_once(db, engine, threads, retention_seconds=86_400) == 0
    finally:
        threads.close()
        engine.dispose()
        await client.close()


def test_delete_steps_cover_the_expired_range_in_pieces():
    assert retention.delete_steps(0, 100_000, 25_000) == [25_000, 50_000, 75_000, 100_000]
    assert retention.delete_steps(10, 60_000, 25_000) == [25_010, 50_010, 60_000]
    assert retention.delete_steps(5, 6, 25_000) == [6]
    assert retention.delete_steps(7, 7, 25_000) == []
