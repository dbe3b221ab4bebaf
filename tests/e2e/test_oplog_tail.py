"""The oplog tail against the real FerretDB, in both of its modes.

On FerretDB the tail polls a tailable cursor (FerretDB re-scans the oplog
every 10 ms for an awaiting cursor); on MongoDB it waits on an awaitData
cursor. Only a real MongoDB shows the server deciding; here the awaitData
path is forced, to show that it reads the same entries.
"""

import asyncio
import logging
import contextlib
import signal
import uuid

import pytest
from bson.errors import InvalidBSON
from pymongo import AsyncMongoClient, monitoring

from chat.messages import Message, now_ms
from daemon.hub import Hub, Subscriber
from daemon import tail_reader
from daemon.stream import Stream
from db import mongo
from oplog.events import ENTRY_FIELDS, Batch, Restarted
from oplog.tail import OplogTail
from tests.e2e.helpers import count_calls
from tests.timing import PATIENCE, eventually


async def _tail_inserts(dbs, namespace: str, force_await: bool) -> tuple[OplogTail, list[int], int, set[str]]:
    client = mongo.make_client(dbs.ferretdb.url, 5)
    db_name, coll_name = namespace.split(".")
    tail = OplogTail(client, namespace, await_ms=200, ferretdb_poll_seconds=0.02)
    if force_await:
        tail.poll_seconds = 0.0
    tail.last_ts = await tail.newest_ts()
    seen: list[int] = []
    fields: set[str] = set()  # of every entry read
    restarts = -1  # the first open is announced too
    opened = asyncio.Event()

    async def read():
        nonlocal restarts
        async for event in tail.batches():
            if isinstance(event, Restarted):
                restarts += 1
                opened.set()
                continue
            seen.extend(e["o"]["_id"] for e in event.entries if e.get("op") == "i" and e.get("ns") == namespace)
            fields.update(field for e in event.entries for field in e)

    reader = asyncio.create_task(read())
    try:
        async with asyncio.timeout(PATIENCE):
            await opened.wait()  # the cursor is open
        coll = client[db_name][coll_name]
        for i in range(3):
            ids = range(i * 10, i * 10 + 10)
            await coll.insert_many([{"_id": k} for k in ids])
            # Each insert read before the next: the cursor's later getMores read too.
            await eventually(lambda ids=ids: set(ids) <= set(seen), f"the tail reads ids {ids.start}..{ids.stop - 1}")
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await client.close()
    return tail, seen, restarts, fields


async def reach(stream: Stream, position: int) -> None:
    """Until the stream has released every id up to ``position``."""
    assert await stream.wait_for(position, PATIENCE), f"the stream never reached {position}"


@pytest.mark.parametrize("force_await", [False, True], ids=["ferretdb-poll", "awaitData"])
async def test_the_tail_reads_every_insert(dbs, force_await):
    namespace = f"tail{uuid.uuid4().hex[:6]}.{'await' if force_await else 'poll'}"
    tail, seen, restarts, fields = await _tail_inserts(dbs, namespace, force_await)
    assert tail.poll_seconds == (0.0 if force_await else 0.02)  # FerretDB was recognised
    assert set(seen) == set(range(30))
    # the server sent what a consumer reads and nothing else (FerretDB's entries also hold
    # an ObjectId _id, wall, t and v)
    assert fields == set(ENTRY_FIELDS)
    if not restarts:
        # One cursor: oplog order. The entry it resumed from may come again
        # (the consumer drops repeats by id). After a re-open FerretDB may show
        # entries out of order (docs/ferretdb.md); the tail says Restarted and
        # the stream's sequencer, not the tail, puts ids back in order.
        assert list(dict.fromkeys(seen)) == list(range(30))


class _SilentTail:
    """A tail that never shows an entry: what FerretDB does for a document it
    stored without writing its oplog entry."""

    namespace = "gapcheck.messages"
    last_ts = None

    async def newest_ts(self):
        return None

    async def batches(self):
        await asyncio.Event().wait()
        yield  # never reached: makes this an async generator


class _BrokenTail(_SilentTail):
    """A tail that fails with an error that is not the driver's (an entry
    that does not decode, say): no retry loop catches it."""

    async def batches(self):
        raise InvalidBSON("an oplog entry that does not decode")
        yield  # never reached: makes this an async generator


class _Recorder:
    __slots__ = ("subscriber", "got")

    def __init__(self, user: str, since: int):
        self.subscriber = Subscriber(self, user, since)
        self.got: list[int] = []

    def send(self, msg_id, payload, frame):
        self.got.append(msg_id)

    def overflow(self):
        raise AssertionError("no overflow expected")


@contextlib.asynccontextmanager
async def _stream_for_bob(url, tail, timeout=5, **settings):
    """A Stream over the real FerretDB store at ``url`` (a database of its
    own) fed by ``tail``, with bob subscribed from its start position."""
    client = mongo.make_client(url, timeout)
    db = client[f"stream_{uuid.uuid4().hex[:8]}"]
    hub = Hub(1 << 20)
    stream = Stream(db, tail, hub, retention_seconds=86_400, **settings)
    task = asyncio.create_task(stream.run())
    try:
        await asyncio.wait_for(stream.ready.wait(), PATIENCE)
        bob = _Recorder("bob", stream.position)
        hub.register(bob.subscriber)
        bob.subscriber.go_live([])
        yield db, stream, bob
    finally:
        task.cancel()
        ended, _ = await asyncio.wait({task}, timeout=PATIENCE)
        await client.drop_database(db.name)
        await client.close()
    # A daemon's shutdown cancels its streams: one that goes on once cancelled holds the shutdown up.
    assert ended, "the stream went on after it was cancelled"


async def test_a_message_whose_oplog_entry_never_comes_is_delivered_by_the_gap_check(dbs):
    stream_for_bob = _stream_for_bob(dbs.ferretdb.url, _SilentTail(), cache_max=100, gap_check_seconds=0.2)
    async with stream_for_bob as (db, stream, bob):
        # stored the way the writer stores it: the document, then meta.head
        await db[mongo.MESSAGES].insert_one(Message(1, "alice", "bob", "hi", now_ms()).to_doc())
        await mongo.advance_head(db, 1)
        await reach(stream, 1)
        assert bob.got == [1]


async def test_catch_up_past_the_cache_reads_the_store_and_can_stop_at_the_oldest_few(dbs, monkeypatch):
    reads = count_calls(monkeypatch, mongo, "messages_for")  # each a full scan of `messages` on FerretDB
    stream_for_bob = _stream_for_bob(dbs.ferretdb.url, _SilentTail(), cache_max=100, gap_check_seconds=30)
    async with stream_for_bob as (db, stream, bob):
        # Stored behind the stream's back: the cache has none of them.
        await db[mongo.MESSAGES].insert_many([Message(i, "alice", "bob" if i % 2 else "cat", f"m{i}", now_ms()).to_doc()
                                              for i in range(1, 41)])
        every = await stream.catch_up("bob", 0, 40)
        assert [i for i, _p, _f in every.frames] == list(range(1, 41, 2)) and every.recovered
        reads.clear()
        first = await stream.catch_up("bob", 6, 40, most=3)
        assert [i for i, _p, _f in first.frames] == [7, 9, 11] and first.more
        assert len(reads) == 1  # a long-poll's answer, and that there is more, in one read
        assert b'"body":"m7"' in first.frames[0][1]
        assert not (await stream.catch_up("bob", 0, 40, most=20)).more  # exactly 20: no more
        assert await _pages(stream, "bob", 0, 40, most=6) == list(range(1, 41, 2))
        assert await _pages(stream, "bob", 0, 40, most=6, max_bytes=100) == list(range(1, 41, 2))


async def test_messages_that_expire_between_pages_mark_the_next_page_not_recovered(dbs):
    # A slow reader pages through a catch-up from the store; meanwhile the
    # sweeper raises the retention floor and deletes what it passed. The
    # page after the gap says so (the WebSocket then closes, and the client's
    # resume from its last id says `recovered: false`): never a silent gap.
    async with _stream_for_bob(dbs.ferretdb.url, _SilentTail(), cache_max=0, gap_check_seconds=30) as (db, stream, bob):
        await db[mongo.MESSAGES].insert_many([Message(i, "alice", "bob", f"m{i}", now_ms()).to_doc()
                                              for i in range(1, 31)])
        pages = stream.pages("bob", 0, 30, most=5)
        first = await anext(pages)
        assert [i for i, _p, _f in first.frames] == [1, 2, 3, 4, 5] and first.recovered and first.more
        # as db.retention.sweep_once does it: the floor first, then the delete
        await db[mongo.META].update_one({"_id": "retention"}, {"$max": {"floor": 20}}, upsert=True)
        await db[mongo.MESSAGES].delete_many({"_id": {"$lte": 20}})
        later = [p async for p in pages]
        # What was read before the delete goes out as it was; the first page
        # after the gap, and only it, says recovered: false.
        ids = [i for p in later for i, _p, _f in p.frames]
        assert ids[-10:] == list(range(21, 31)) and ids[:-10] == list(range(6, 6 + len(ids) - 10))
        after_gap = next(n for n, p in enumerate(later) if p.frames and p.frames[0][0] > 20)
        assert [p.recovered for p in later] == [n != after_gap for n in range(len(later))]


async def _pages(stream, user, since, upto, **page) -> list[int]:
    """Every id of a catch-up read a page at a time, as a WebSocket's is;
    checks that each page is cut where it says and only the last says no more."""
    ids, pages = [], [p async for p in stream.pages(user, since, upto, **page)]
    for catch in pages:
        assert catch.frames and catch.recovered
        if "most" in page:
            assert len(catch.frames) <= page["most"]
        if "max_bytes" in page:
            assert len(catch.frames) == 1 or sum(len(p) for _i, p, _f in catch.frames) <= page["max_bytes"]
        ids += [i for i, _p, _f in catch.frames]
    assert [c.more for c in pages] == [True] * (len(pages) - 1) + [False]
    return ids


class _BurstTail(_SilentTail):
    """A tail that, once told to, shows a burst of entries back to back, with
    no pause in which the consumer could run: more than the queue holds."""

    namespace = "burst.messages"

    def __init__(self, docs: list[dict], batch: int):
        self.go = asyncio.Event()
        self._docs, self._batch = docs, batch

    async def batches(self):
        await self.go.wait()
        for i in range(0, len(self._docs), self._batch):
            yield Batch([{"op": "i", "ns": self.namespace, "o": d, "ts": None} for d in self._docs[i:i + self._batch]])
        await asyncio.Event().wait()


async def test_a_burst_bigger_than_the_tail_queue_waits_for_the_consumer_and_is_read_from_the_oplog(
        dbs, caplog, monkeypatch):
    # The queue between the oplog reader and the consumer is bounded: past the
    # bound the reader waits for the consumer (memory stays bounded) instead of
    # shedding entries to be read back by query. Every message arrives once, in
    # order, each from the oplog: no read of the truth.
    caplog.set_level(logging.INFO, logger="chat.stream")  # a fill would log event=stream_fill
    docs = [Message(i, "alice", "bob", f"m{i}", now_ms()).to_doc() for i in range(1, 101)]
    tail = _BurstTail(docs, batch=10)
    monkeypatch.setattr(tail_reader, "TAIL_QUEUE_MAX", 20)  # small enough to pass
    async with _stream_for_bob(dbs.ferretdb.url, tail, cache_max=1000, gap_check_seconds=30) as (db, stream, bob):
        await db[mongo.MESSAGES].insert_many(docs)  # stored, as the writer stores them
        await mongo.advance_head(db, 100)
        tail.go.set()
        await reach(stream, 100)
        assert bob.got == list(range(1, 101))
        assert "event=tail_backpressure" in caplog.text
        assert "event=stream_fill" not in caplog.text


async def test_a_resync_that_fails_while_ferretdb_is_down_is_retried_and_delivers_once_it_is_back(
        tmp_path, caplog, monkeypatch):
    # A hole (entry 2 never shown) needs a read of `messages`; FerretDB is down,
    # so the read fails at its deadline (60 s in production, 1 s here). It is
    # retried after a backoff, not dropped and not in a tight loop, and once
    # FerretDB is back every message arrives once, in order.
    from daemon import stream_fills
    from harness.servers import FerretDB, free_port

    monkeypatch.setattr(stream_fills, "FILL_TIMEOUT_SECONDS", 1.0)
    ferretdb = FerretDB(tmp_path, free_port())
    ferretdb.start()
    try:
        docs = [Message(i, "alice", "bob", f"m{i}", now_ms()).to_doc() for i in (1, 2, 3)]
        tail = _BurstTail([docs[0], docs[2]], batch=2)
        async with _stream_for_bob(ferretdb.url, tail, timeout=1, cache_max=100,
                                   gap_check_seconds=60) as (db, stream, bob):
            await db[mongo.MESSAGES].insert_many(docs)
            await mongo.advance_head(db, 3)
            ferretdb.stop(signal.SIGKILL)  # down at once: its graceful stop took some 3 s here
            tail.go.set()  # shows 1 and 3: the hole at 2 must be read back
            await eventually(lambda: "event=fill_failed" in caplog.text, "a read of the hole fails")
            assert bob.got == [1]  # 3 is held until 2 is known
            ferretdb.start()
            await reach(stream, 3)
            assert bob.got == [1, 2, 3]
            assert "retry_in_s=" in caplog.text
    finally:
        ferretdb.stop()


async def test_a_since_past_a_lagging_meta_head_is_retried_not_reset(dbs, monkeypatch):
    # A client comes from a daemon further along, with the id of a message
    # that daemon delivered; this one is behind it, and meta.head, which the
    # writer moves about once a second, does not cover the id yet. The
    # message exists, so the client is told to retry (1013 / 503), not
    # `recovered: false`, which would send it to reload history. An id that
    # no message has still gets `recovered: false`, served from here.
    from chat.settings import Settings
    from daemon import server as server_module
    from daemon.server import Behind, Daemon

    monkeypatch.setattr(server_module, "FUTURE_SINCE_WAIT", 0.2)
    async with _stream_for_bob(dbs.ferretdb.url, _SilentTail(), cache_max=100, gap_check_seconds=30) as (db, stream, _):
        await mongo.advance_head(db, 0)
        await db[mongo.MESSAGES].insert_one(Message(1, "alice", "carol", "hi", now_ms()).to_doc())
        daemon = Daemon(Settings(), stream.consumer.hub, stream)
        registered = stream.consumer.hub.count
        with pytest.raises(Behind) as refused:
            await daemon.subscribe(_Recorder("carol", 0).subscriber, 1)
        assert refused.value.reason == "behind"  # chat_daemon_rejects_total's label
        assert stream.consumer.hub.count == registered  # nothing left behind
        pages, cursor = await daemon.subscribe(_Recorder("carol", 0).subscriber, 7)
        assert [(p.recovered, p.frames, p.more) async for p in pages] == [(False, [], False)]
        assert cursor == stream.position == 0


async def test_catch_up_pages_from_the_cache_by_count_and_by_bytes(dbs):
    docs = [Message(i, "alice", "bob" if i % 3 else "cat", f"m{i:03}", now_ms()).to_doc() for i in range(1, 61)]
    tail = _BurstTail(docs, batch=10)
    async with _stream_for_bob(dbs.ferretdb.url, tail, cache_max=100, gap_check_seconds=30) as (db, stream, bob):
        await db[mongo.MESSAGES].insert_many(docs)
        tail.go.set()  # the tail shows them: now they are cached
        await reach(stream, 60)
        mine = [i for i in range(1, 61) if i % 3]
        one = len((await stream.catch_up("bob", 0, 1)).frames[0][1])
        assert await _pages(stream, "bob", 0, 60, most=7) == mine
        assert await _pages(stream, "bob", 0, 60, max_bytes=5 * one) == mine
        assert await _pages(stream, "bob", 0, 60, max_bytes=1) == mine  # a page holds one at least


async def test_a_stream_whose_oplog_reader_dies_ends_instead_of_waiting_forever(dbs):
    """The daemon exits when its stream ends (supervisord starts a fresh one).
    A reader that died quietly left the consumer waiting on an empty queue:
    a daemon that accepts clients and delivers nothing."""
    client = mongo.make_client(dbs.ferretdb.url, 5)
    db = client[f"stream_{uuid.uuid4().hex[:8]}"]
    stream = Stream(db, _BrokenTail(), Hub(1 << 20), retention_seconds=86_400, cache_max=100, gap_check_seconds=60)
    try:
        with pytest.raises(InvalidBSON):
            await asyncio.wait_for(stream.run(), PATIENCE)
    finally:
        await client.drop_database(db.name)
        await client.close()


class _CancelAt(monitoring.CommandListener, monitoring.ConnectionPoolListener):
    """Cancels ``task`` at the ``nth`` event the driver publishes for it (a pool
    or a connection created, a connection checked out or in, a command sent or
    answered). ``soon``: on the loop's next turn instead, as the step the task
    took after the event completes (a command's send, say)."""

    def __init__(self, nth: int, soon: bool):
        self.nth, self.soon = nth, soon
        self.task: asyncio.Task | None = None
        self.events: list[str] = []

    def _event(self, event) -> None:
        if self.task is not None and asyncio.current_task() is self.task:
            self.events.append(type(event).__name__.removesuffix("Event"))
            if len(self.events) == self.nth:
                if self.soon:
                    asyncio.get_running_loop().call_soon(self.task.cancel)
                else:
                    self.task.cancel()

    started = succeeded = failed = _event
    pool_created = pool_ready = pool_cleared = pool_closed = _event
    connection_created = connection_ready = connection_closed = _event
    connection_check_out_started = connection_check_out_failed = _event
    connection_checked_out = connection_checked_in = _event


async def test_a_tail_cancelled_at_any_moment_ends(dbs):
    # A shutdown cancels the tail, and a cancel can be lost in the driver: with
    # a socket timeout PyMongo sends each command through asyncio.wait_for,
    # which on Python 3.11 returns the send's result, and drops the cancel, when
    # the cancel comes as the send completes; PyMongo also reports some cancels
    # as its own errors, which the tail retries. Measured once: 5 of 150 cancels
    # at random moments were lost, and the tail ran on for good (a relay or a
    # daemon then never finished its shutdown). Here the cancel comes at each
    # step of a tail's first moves in turn, a fresh client each time: the pool's
    # first connection and its handshake, each command (buildInfo, the newest
    # entry, the tailable find, the getMores) sent and answered, and the polls
    # between; at the step, and as it completes. Each must end the tail.
    namespace = f"cancel{uuid.uuid4().hex[:6]}.messages"
    db_name, coll_name = namespace.split(".")
    feeder = mongo.make_client(dbs.ferretdb.url, 5)
    stop = asyncio.Event()

    async def insert_on() -> None:  # entries keep coming, so the getMores return some
        i = 0
        while not stop.is_set():
            await feeder[db_name][coll_name].insert_one({"_id": i})
            i += 1
            await asyncio.sleep(0.005)  # pacing: a trickle of entries, not a flood

    async def consume(tail: OplogTail) -> None:
        async for _event in tail.batches():
            pass

    inserting = asyncio.create_task(insert_on())
    try:
        # 30 events: through the third getMore, past every kind of step a tail takes.
        for soon in (False, True):
            for nth in range(1, 31):
                cancel = _CancelAt(nth, soon)
                # The socket timeout as db.mongo.make_client sets it: the wait_for path above.
                client: AsyncMongoClient = AsyncMongoClient(dbs.ferretdb.url, tz_aware=True, socketTimeoutMS=25_000,
                                                            event_listeners=[cancel])
                try:
                    task = asyncio.create_task(consume(OplogTail(client, namespace, ferretdb_poll_seconds=0.02)))
                    cancel.task = task
                    done, _ = await asyncio.wait({task}, timeout=PATIENCE)
                    at = f"{'as' if soon else 'at'} its event {nth} ({cancel.events[nth - 1]})"
                    assert done, f"a tail cancelled {at} went on"
                    assert task.cancelled(), f"a tail cancelled {at} ended with {task.exception()!r}"
                finally:
                    await client.close()
    finally:
        stop.set()
        await inserting
        await feeder.close()
