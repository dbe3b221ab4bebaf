"""A hole in a daemon's stream is read from MySQL by primary key (db/stream_ranges.py),
against the real MariaDB and FerretDB: the frames are the bytes the collection
would give, and when MySQL cannot say, the `messages` collection still does."""

import asyncio
import contextlib
import uuid

import pytest
from sqlalchemy import create_engine, text

from chat.messages import Message, encode_doc, now_ms
from daemon import stream as stream_module
from db import mongo
from db.sql import make_engine, messages, metadata
from db.stream_ranges import StreamRanges
from tests.e2e.helpers import count_calls
from tests.e2e.test_oplog_tail import _BurstTail, _Recorder, _stream_for_bob


@contextlib.contextmanager
def mysql_database(dbs):
    """A MySQL database of its own with the real schema: ids chosen here
    collide with nobody's."""
    name = f"ranges_{uuid.uuid4().hex[:8]}"
    admin = create_engine(dbs.mariadb.url(""))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    engine = make_engine(dbs.mariadb.url(name), 5, pool_size=1)
    metadata.create_all(engine)
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP DATABASE {name}"))
        admin.dispose()


def store_in_mysql(engine, msgs: list[Message]) -> None:
    with engine.begin() as conn:
        conn.execute(messages.insert(), [
            {"id": m.id, "sender": m.sender, "recipient": m.recipient, "conversation": f"{m.sender}\x00{m.recipient}",
             "body": m.body, "client_msg_id": m.client_msg_id, "created_at": m.created_at.replace(tzinfo=None)}
            for m in msgs])


class _PayloadRecorder(_Recorder):
    __slots__ = ("payloads",)

    def __init__(self, user, since):
        super().__init__(user, since)
        self.payloads: dict[int, bytes] = {}

    def send(self, msg_id, payload, frame):
        super().send(msg_id, payload, frame)
        self.payloads[msg_id] = payload


async def until_position(stream, position, timeout=10):
    async with asyncio.timeout(timeout):
        while stream.position < position:
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("page", [5000, 2], ids=["one-read", "paged"])
async def test_a_hole_the_tail_skipped_is_read_from_mysql_not_the_collection(dbs, monkeypatch, page):
    monkeypatch.setattr(stream_module, "PAGE", page)  # 2: the hole of 4 ids takes two reads
    msgs = [Message(i, "alice", "bob", f"m{i} <b>é</b> 🙂", now_ms(), f"c{i}" if i % 2 else None) for i in range(1, 9)]
    shown = [msgs[0].to_doc(), *(m.to_doc() for m in msgs[5:])]  # the tail shows 1, 6, 7, 8: it skipped 2..5
    tail = _BurstTail(shown, batch=4)
    reads = count_calls(monkeypatch, mongo, "messages_between")  # each a full scan on FerretDB
    with mysql_database(dbs) as engine:
        ranges = StreamRanges(engine)
        async with _stream_for_bob(dbs.ferretdb.url, tail, cache_max=100, gap_check_seconds=30,
                                   ranges=ranges) as (db, stream, _bob):
            bob = _PayloadRecorder("bob", stream.position)
            stream._hub.register(bob)
            bob.go_live([])
            store_in_mysql(engine, msgs)  # as the writer stores them: MySQL, then Mongo
            await db[mongo.MESSAGES].insert_many([m.to_doc() for m in msgs])
            reads.clear()  # the start-up read is the collection's
            tail.go.set()
            await until_position(stream, 8)
            assert bob.got == list(range(1, 9))
            assert reads == []  # the hole came from MySQL
            # byte for byte what the collection's document gives
            from_collection = {d["_id"]: encode_doc(d)[4] async for d in db[mongo.MESSAGES].find({})}
            assert bob.payloads == from_collection
        ranges.close()


async def test_a_hole_mysql_cannot_fill_is_read_from_the_collection(dbs, monkeypatch, caplog):
    # MySQL unreachable (a socket that is not there): the hole is filled from
    # `messages` as before, and every message arrives once, in order.
    docs = [Message(i, "alice", "bob", f"m{i}", now_ms()).to_doc() for i in range(1, 6)]
    tail = _BurstTail([docs[0], docs[4]], batch=2)
    reads = count_calls(monkeypatch, mongo, "messages_between")  # each a full scan on FerretDB
    broken = make_engine("mysql+mysqldb://root@localhost/chat?unix_socket=/nonexistent/mysqld.sock", 1, pool_size=1)
    ranges = StreamRanges(broken)
    async with _stream_for_bob(dbs.ferretdb.url, tail, cache_max=100, gap_check_seconds=30,
                               ranges=ranges) as (db, stream, bob):
        await db[mongo.MESSAGES].insert_many(docs)
        reads.clear()
        tail.go.set()
        await until_position(stream, 5)
        assert bob.got == [1, 2, 3, 4, 5]
        assert "event=committed_head_failed" in caplog.text  # MySQL cannot say what is committed
        assert len(reads) >= 1
    ranges.close()


async def test_rows_mysql_does_not_have_in_order_leave_the_hole_to_the_collection(dbs, monkeypatch):
    # MySQL holds 2 and 5 but not 3 and 4 (rows it should have, lost to a
    # restore, say): what MySQL gives is not the next ids in order, so the
    # collection decides, up to the head MySQL has committed.
    msgs = [Message(i, "alice", "bob", f"m{i}", now_ms()) for i in range(1, 6)]
    tail = _BurstTail([msgs[0].to_doc(), msgs[4].to_doc()], batch=2)
    reads = count_calls(monkeypatch, mongo, "messages_between")  # each a full scan on FerretDB
    with mysql_database(dbs) as engine:
        ranges = StreamRanges(engine)
        async with _stream_for_bob(dbs.ferretdb.url, tail, cache_max=100, gap_check_seconds=30,
                                   ranges=ranges) as (db, stream, bob):
            store_in_mysql(engine, [msgs[1], msgs[4]])
            await db[mongo.MESSAGES].insert_many([m.to_doc() for m in msgs])
            reads.clear()
            tail.go.set()
            await until_position(stream, 5)
            assert bob.got == [1, 2, 3, 4, 5]
            assert len(reads) >= 1
        ranges.close()


async def test_an_id_gone_from_both_stores_is_passed_over_once_not_read_for_ever(dbs, monkeypatch):
    # Message 3 was deleted from MySQL and from the collection (an operator
    # removing it): the fill reads the collection for it once, passes over it,
    # and the gap check, every 0.2 s here, finds nothing more to read.
    msgs = [Message(i, "alice", "bob", f"m{i}", now_ms()) for i in range(1, 5)]
    kept = [msgs[0], msgs[1], msgs[3]]
    tail = _BurstTail([m.to_doc() for m in kept], batch=3)
    reads = count_calls(monkeypatch, mongo, "messages_between")  # each a full scan on FerretDB
    with mysql_database(dbs) as engine:
        ranges = StreamRanges(engine)
        async with _stream_for_bob(dbs.ferretdb.url, tail, cache_max=100, gap_check_seconds=0.2,
                                   ranges=ranges) as (db, stream, bob):
            store_in_mysql(engine, kept)
            await db[mongo.MESSAGES].insert_many([m.to_doc() for m in kept])
            reads.clear()
            tail.go.set()
            await until_position(stream, 4)
            assert bob.got == [1, 2, 4]
            await asyncio.sleep(1.0)  # five gap checks
            assert len(reads) == 1
            assert stream.position == 4
        ranges.close()
