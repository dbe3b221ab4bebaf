"""The fast store grown large, on the real MariaDB and FerretDB: the writer's
outbox repair and the retention sweep each finish in bounded steps, whatever
the size of `messages`. On FerretDB every query of `messages` scans the whole
collection (2.4-2.8 s at 110,000 documents here) and a delete of more than
32,766 documents is refused; on MongoDB both are indexed and bounded anyway,
which FerretDB cannot show.

Each limit is crossed by the smallest input that crosses it: the sweep
deletes 32,767 expired messages (one more than FerretDB takes in one delete).
The repair is shown to read nothing of `messages` (but the ids an insert
refused) by the commands its client sends, which no size of the store
changes: the store there need not be large."""

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from pymongo import monitoring
from pymongo.errors import OperationFailure
from sqlalchemy import text

from chat.messages import Message, now_ms
from db import mongo, retention
from db.sql import make_engine
from db.threads import Threads
from tests.e2e.helpers import running_writer
from harness.system import databases
from tests.timing import PATIENCE, eventually

FERRETDB_DELETE_MAX = 32_766  # FerretDB 1.24 (SQLite): one SQL variable per document deleted
EXPIRED = FERRETDB_DELETE_MAX + 1  # the fewest expired messages that one delete cannot take


@pytest.fixture
def own_dbs(tmp_path):
    with databases(tmp_path) as d:
        yield d


async def _fill(dbs, first: int, last: int, created_at: datetime) -> None:
    """Messages first..last in both stores, as the writer leaves them, and
    stream_state saying that Mongo holds them all."""
    engine = make_engine(dbs.mariadb.url(), PATIENCE)
    with engine.begin() as conn:
        # MariaDB's sequence engine: one statement for the lot.
        conn.execute(text(f"INSERT INTO messages (id, sender, recipient, conversation, body, created_at) "
                          f"SELECT seq, 'filler', 'other', 'filler\\0other', 'x', :at "
                          f"FROM seq_{first}_to_{last}"), {"at": created_at.replace(tzinfo=None)})
        conn.execute(text("UPDATE stream_state SET last_id = :n, mirrored_upto = :n"), {"n": last})
    engine.dispose()
    client = mongo.make_client(dbs.ferretdb.url, PATIENCE)
    for lo in range(first, last + 1, 10_000):
        await client.chat[mongo.MESSAGES].insert_many([
            Message(i, "filler", "other", "x", created_at).to_doc() for i in range(lo, min(lo + 10_000, last + 1))])
    await client.close()


def _outbox_rows(dbs, msgs: list[Message]) -> None:
    """Committed to MySQL, never mirrored: what a writer that died after its commit leaves."""
    engine = make_engine(dbs.mariadb.url(), PATIENCE)
    with engine.begin() as conn:
        for m in msgs:
            conn.execute(text("INSERT INTO messages (id, sender, recipient, conversation, body, created_at) "
                              "VALUES (:id, :s, :r, :c, :b, :at)"),
                         {"id": m.id, "s": m.sender, "r": m.recipient, "c": f"{m.sender}\x00{m.recipient}",
                          "b": m.body, "at": m.created_at.replace(tzinfo=None)})
    engine.dispose()


class Commands(monitoring.CommandListener):
    """Every command a client sent, as (name, collection, the command document)."""

    def __init__(self):
        self.sent: list[tuple[str, object, dict]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.sent.append((event.command_name, event.command.get(event.command_name), dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def on(self, collection: str) -> list[tuple[str, dict]]:
        return [(name, command) for name, coll, command in self.sent if coll == collection]


def _mirrored_upto(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT mirrored_upto FROM stream_state")).scalar()


async def test_the_outbox_drains_in_bounded_steps_however_large_the_fast_store(own_dbs):
    # A repair that asked FerretDB what `messages` holds would scan the whole
    # collection for each step: past some size no step finishes within the
    # writer's deadline, and the outbox never drains. The repair reads the
    # outbox from MySQL and inserts it into `messages`: the commands its
    # client sends show that whatever the size, so the store here is small
    # (other documents are there, as in any store).
    store = 1_000
    await _fill(own_dbs, 1, store, now_ms())
    sender = f"s-{uuid.uuid4().hex[:8]}"
    outbox = [Message(store + i, sender, "r", f"outbox {i}", now_ms()) for i in range(1, 51)]
    _outbox_rows(own_dbs, outbox)
    client = mongo.make_client(own_dbs.ferretdb.url, PATIENCE)
    db = client.chat
    # A crash mid-insert: the first half reached Mongo already.
    there = [m.to_doc() for m in outbox[:25]]
    await db[mongo.MESSAGES].insert_many(there)
    seen: list[tuple[int, float]] = []
    commands = Commands()
    async with running_writer(own_dbs, event_listeners=[commands],
                              observe_outbox=lambda n, age: seen.append((n, age))) as (_w, engine, _db):
        async def drained() -> bool:  # and reported so: the empty report follows the turn's last commit
            return await asyncio.to_thread(_mirrored_upto, engine) == store + 50 and seen[-1:] == [(0, 0.0)]

        await eventually(drained, "the outbox drained to Mongo and was reported empty")
    ids = sorted([d["_id"] async for d in db[mongo.MESSAGES].find({"from": sender}, {"_id": 1})])
    assert ids == [m.id for m in outbox]  # each exactly once: a duplicate _id counted as there
    assert seen[0][0] == 50  # reported while it lasted
    sent = commands.on(mongo.MESSAGES)
    inserted = [d["_id"] for name, command in sent if name == "insert" for d in command["documents"]]
    assert sorted(set(inserted)) == [m.id for m in outbox]  # one page: every outbox row, and nothing else
    # Nothing else asks `messages` what it holds, but a look at exactly the
    # ids an insert refused as duplicates (under the same deadline).
    refused = {d["_id"] for d in there}
    for name, command in sent:
        if name != "insert":
            assert name == "find" and list(command["filter"]) == ["_id"], command
            assert list(command["filter"]["_id"]) == ["$in"] and set(command["filter"]["_id"]["$in"]) <= refused
    await client.close()


async def test_an_outbox_larger_than_a_page_is_copied_page_by_page_each_message_once(own_dbs, monkeypatch):
    from writer import core

    monkeypatch.setattr(core, "REPAIR_PAGE", 10)  # 35 rows: 4 pages
    await _fill(own_dbs, 1, 100, now_ms())
    sender = f"s-{uuid.uuid4().hex[:8]}"
    outbox = [Message(100 + i, sender, "r", f"outbox {i}", now_ms()) for i in range(1, 36)]
    _outbox_rows(own_dbs, outbox)
    client = mongo.make_client(own_dbs.ferretdb.url, PATIENCE)
    db = client.chat
    await db[mongo.MESSAGES].insert_many([m.to_doc() for m in outbox[5:18]])  # part of it there already
    seen: list[int] = []
    async with running_writer(own_dbs, observe_outbox=lambda n, age: seen.append(n)) as (_writer, engine, _db):
        async def drained() -> bool:  # and reported so: the empty report comes after the last page's commit
            return await asyncio.to_thread(_mirrored_upto, engine) == 135 and seen[-1:] == [0]

        await eventually(drained, f"the outbox drained and was reported empty (reported: {seen})")
    ids = sorted([d["_id"] async for d in db[mongo.MESSAGES].find({"from": sender}, {"_id": 1})])
    assert ids == [m.id for m in outbox]
    assert seen[:4] == [35, 25, 15, 5] and seen[-1] == 0  # one report per page, then empty
    await client.close()


async def test_a_sweep_of_more_expired_messages_than_one_delete_takes_deletes_them_all_in_pieces(own_dbs):
    expired_at = datetime.now(UTC) - timedelta(days=2)
    await _fill(own_dbs, 1, EXPIRED, expired_at)
    fresh = [Message(EXPIRED + i, "fresh", "other", "kept", now_ms()) for i in range(1, 11)]
    _outbox_rows(own_dbs, fresh)
    client = mongo.make_client(own_dbs.ferretdb.url, PATIENCE)
    db = client.chat
    await db[mongo.MESSAGES].insert_many([m.to_doc() for m in fresh])
    # The input crosses the limit: FerretDB refuses them all in one delete.
    with pytest.raises(OperationFailure, match="too many SQL variables"):
        await db[mongo.MESSAGES].delete_many({"_id": {"$lte": EXPIRED}})
    engine = make_engine(own_dbs.mariadb.url(), PATIENCE)
    threads = Threads(1, "sweep-test")
    try:
        deleted = await retention.sweep_once(db, engine, threads, retention_seconds=86_400)
        assert deleted == EXPIRED  # every one, the refused delete having taken none
        assert await mongo.retention_floor(db) == EXPIRED
        left = sorted([d["_id"] async for d in db[mongo.MESSAGES].find({}, {"_id": 1})])
        assert left == [m.id for m in fresh]
        assert await retention.sweep_once(db, engine, threads, retention_seconds=86_400) == 0
    finally:
        threads.close()
        engine.dispose()
        await client.close()
