"""A hole in a daemon's stream is read from MySQL by primary key (db/stream_ranges.py),
against the real MariaDB and FerretDB: the frames are the bytes the collection
would give, and when MySQL cannot say, the `messages` collection still does."""

import asyncio
import contextlib
import uuid

import pytest
from sqlalchemy import create_engine, text

from chat.messages import Message, encode_doc, now_ms, shown_digest_of
from daemon import stream_fills
from db import mongo
from db.sql import make_engine, messages, metadata
from db.stream_ranges import StreamRanges
from tests.e2e.helpers import count_calls
from tests.e2e.test_oplog_tail import _BurstTail, _Recorder, _stream_for_bob, reach
from tests.timing import eventually


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


async def until_position(stream, position):
    await reach(stream, position)  # the stream's own signal: it wakes as the position moves


@pytest.mark.parametrize("page", [5000, 2], ids=["one-read", "paged"])
async def test_a_hole_the_tail_skipped_is_read_from_mysql_not_the_collection(dbs, monkeypatch, page):
    monkeypatch.setattr(stream_fills, "PAGE", page)  # 2: the hole of 4 ids takes two reads
    msgs = [Message(i, "alice", "bob", f"m{i} <b>é</b> 🙂", now_ms(), f"c{i}" if i % 2 else None) for i in range(1, 9)]
    shown = [msgs[0].to_doc(), *(m.to_doc() for m in msgs[5:])]  # the tail shows 1, 6, 7, 8: it skipped 2..5
    tail = _BurstTail(shown, batch=4)
    reads = count_calls(monkeypatch, mongo, "messages_between")  # each a full scan on FerretDB
    with mysql_database(dbs) as engine:
        ranges = StreamRanges(engine)
        async with _stream_for_bob(dbs.ferretdb.url, tail, cache_max=100, gap_check_seconds=30,
                                   ranges=ranges) as (db, stream, _bob):
            bob = _PayloadRecorder("bob", stream.position)
            stream.consumer.hub.register(bob.subscriber)
            bob.subscriber.go_live([])
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
        # stored the way the writer stores them: the documents, then meta.head,
        # the bound a daemon that never heard from MySQL goes by
        await db[mongo.MESSAGES].insert_many(docs)
        await mongo.advance_head(db, 5)
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
    # and the gap check, every 0.05 s here, finds nothing more to read.
    msgs = [Message(i, "alice", "bob", f"m{i}", now_ms()) for i in range(1, 5)]
    kept = [msgs[0], msgs[1], msgs[3]]
    tail = _BurstTail([m.to_doc() for m in kept], batch=3)
    reads = count_calls(monkeypatch, mongo, "messages_between")  # each a full scan on FerretDB
    with mysql_database(dbs) as engine:
        ranges = StreamRanges(engine)
        async with _stream_for_bob(dbs.ferretdb.url, tail, cache_max=100, gap_check_seconds=0.05,
                                   ranges=ranges) as (db, stream, bob):
            store_in_mysql(engine, kept)
            await db[mongo.MESSAGES].insert_many([m.to_doc() for m in kept])
            reads.clear()
            tail.go.set()
            await until_position(stream, 4)
            assert bob.got == [1, 2, 4]
            # Each gap check reads MySQL's committed head; a read of the truth that
            # any of the first five asked for would have run by the sixth.
            checks = count_calls(monkeypatch, ranges, "committed_head")
            newest = count_calls(monkeypatch, mongo, "newest_id")
            await eventually(lambda: len(checks) >= 6, "six gap checks")
            assert len(reads) == 1
            assert newest == []  # MySQL has nothing past the position: the fast store is not asked
            assert stream.position == 4
        ranges.close()


async def test_mysql_digests_its_rows_as_the_daemon_digests_the_documents(dbs):
    # The daemon trusts the oplog's documents of a range when MySQL's count and
    # digest of its rows match theirs: the two must be built alike, whatever the text.
    at = now_ms()
    msgs = [Message(1, "alice", "bob", "plain", at),
            Message(2, "ålice\x1f", "bøb 🙂", "m <b>é</b> 🙂\x00\n\x1f end", at, "c.1:x-Y_"),
            Message(3, "a", "b", "", at),
            Message(4, "a", "b", "x" * 5000, at)]
    with mysql_database(dbs) as engine:
        store_in_mysql(engine, msgs)
        ranges = StreamRanges(engine)
        try:
            for after, upto in [(0, 4), (1, 3), (0, 0), (4, 9)]:
                want = [m.to_doc() for m in msgs if after < m.id <= upto]
                assert await ranges.confirm(after, upto) == (4, len(want), shown_digest_of(want))
        finally:
            ranges.close()


async def test_a_stray_at_the_next_id_is_never_released_and_mysql_s_row_takes_its_place(dbs, monkeypatch, caplog):
    # Someone put documents in the fast store at ids the writer was about to use.
    # Whether MySQL committed the id meanwhile (2) or not (4), what goes out is
    # MySQL's, read by primary key, never the fast store's.
    msgs = [Message(i, "alice", "bob", f"m{i}", now_ms()) for i in range(1, 4)]
    forged = {**msgs[1].to_doc(), "from": "mallory", "body": "forged"}
    past_head = Message(4, "mallory", "bob", "forged", now_ms()).to_doc()
    tail = _BurstTail([msgs[0].to_doc(), forged, msgs[2].to_doc(), past_head], batch=4)
    reads = count_calls(monkeypatch, mongo, "messages_between")  # each a full scan on FerretDB
    with mysql_database(dbs) as engine:
        ranges = StreamRanges(engine)
        async with _stream_for_bob(dbs.ferretdb.url, tail, cache_max=100, gap_check_seconds=30,
                                   ranges=ranges) as (_db, stream, _bob):
            bob = _PayloadRecorder("bob", stream.position)
            stream.consumer.hub.register(bob.subscriber)
            bob.subscriber.go_live([])
            store_in_mysql(engine, msgs)
            reads.clear()
            tail.go.set()
            await until_position(stream, 3)
            assert bob.got == [1, 2, 3]
            assert bob.payloads == {m.id: encode_doc(m.to_doc())[4] for m in msgs}
            assert b"forged" not in b"".join(p for *_, p in stream.cache.between(0, 3))
            assert "reason=differs_from_mysql source=oplog count=1 ids=[2]" in caplog.text
            assert "reason=past_committed_head source=oplog count=1 ids=[4]" in caplog.text
            assert reads == []
            assert stream.position == 3
        ranges.close()


async def test_in_order_documents_are_checked_with_one_read_per_batch_and_released_as_they_came(dbs, monkeypatch):
    # The steady state: each batch of the oplog past what MySQL confirmed costs
    # one read of MySQL (the head, a count and a digest), not one per message,
    # and no row is read back.
    msgs = [Message(i, "alice", "bob", f"m{i}", now_ms()) for i in range(1, 101)]
    tail = _BurstTail([m.to_doc() for m in msgs], batch=10)
    with mysql_database(dbs) as engine:
        ranges = StreamRanges(engine)
        confirms = count_calls(monkeypatch, ranges, "confirm")
        rows = count_calls(monkeypatch, ranges, "between")
        async with _stream_for_bob(dbs.ferretdb.url, tail, cache_max=1000, gap_check_seconds=30,
                                   ranges=ranges) as (_db, stream, bob):
            store_in_mysql(engine, msgs)
            confirms.clear()  # the start-up's
            tail.go.set()
            await until_position(stream, 100)
            assert bob.got == list(range(1, 101))
            assert 1 <= len(confirms) <= 10  # batches that came while a read ran share the next one
            assert rows == []
        ranges.close()


async def test_users_ranges_asked_while_a_read_is_in_flight_are_read_together_each_as_alone(dbs, monkeypatch):
    # A restarted daemon's clients come back at once, each first socket with a catch-up by the user.
    users = [f"back{n}" for n in range(12)]
    msgs = [Message(i, users[i % 12], users[(i * 5 + 1) % 12], f"m{i}", now_ms(), None) for i in range(1, 301)]
    asks = [(user, 10 * n, 250 + n, 3 if n == 4 else 5000) for n, user in enumerate(users)]
    asks += [("nobody", 0, 300, 50), (users[1], 200, 300, 5000)]  # one with no rows; one user asked twice
    reads: list[int] = []
    real = StreamRanges._read_users

    def counted(self, asked):
        reads.append(len(asked))
        return real(self, asked)

    monkeypatch.setattr(StreamRanges, "_read_users", counted)
    with mysql_database(dbs) as engine:
        store_in_mysql(engine, msgs)
        ranges = StreamRanges(engine)  # one pooled connection: one read in flight
        try:
            alone = [await ranges.of_user(*ask) for ask in asks]
            assert reads == [1] * len(asks)
            for (user, after, upto, limit), docs in zip(asks, alone, strict=True):
                assert [d["_id"] for d in docs] == [m.id for m in msgs if user in (m.sender, m.recipient)
                                                    and after < m.id <= upto][:limit]
            reads.clear()
            together = await asyncio.gather(*(ranges.of_user(*ask) for ask in asks))
            assert together == alone
            assert reads == [1, len(asks) - 1]  # the first alone, every other in the next read
        finally:
            ranges.close()
