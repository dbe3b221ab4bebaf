"""The writer's Mongo side (writer/mirror.py ``Mirror``), against the real MariaDB
and FerretDB: commits and their answers do not wait for a Mongo insert, up to
a bound; Mongo still gets every id once, in id order; and a session that
requests keep busy records its progress without giving up the lock."""

import asyncio
import time
import uuid

import pytest
from sqlalchemy import text

from chat.drafts import Draft
from db import mongo
from tests.e2e.helpers import running_writer
from tests.system import databases
from writer.core import UNSENT_BATCHES, Timing
from writer.message_writer import MessageWriter


class _GatedWriter(MessageWriter):
    """Each Mongo insert waits for ``gate``; counts the sessions it opens."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.gate.set()
        self.sessions = 0

    async def _insert(self, docs: list[dict], ordered: bool = True) -> bool:
        await self.gate.wait()
        return await super()._insert(docs, ordered)

    def _lock_and_read_state(self, conn):
        self.sessions += 1
        return super()._lock_and_read_state(conn)

    def close(self):
        self.gate.set()  # no insert left hanging
        super().close()


@pytest.fixture(scope="module")
def own_dbs(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("mirror")) as d:
        yield d


def _state(engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return tuple(conn.execute(text("SELECT last_id, mirrored_upto FROM stream_state")).one())


async def _in_mongo_in_order(db, sender: str, count: int, timeout: float = 10) -> list[int]:
    """Ids of ``sender``'s messages in `messages`' natural (insertion) order, once all are there."""
    async with asyncio.timeout(timeout):
        while True:
            ids = [d["_id"] async for d in db[mongo.MESSAGES].find({"from": sender}, {"_id": 1})]
            if len(ids) >= count:
                return ids
            await asyncio.sleep(0.05)


async def test_a_commit_is_answered_while_the_previous_insert_is_still_running(own_dbs):
    sender = f"s-{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _GatedWriter, queue_max=1000, timeout_seconds=30) as (writer, engine, db):
        first, _ = await writer.submit(Draft(sender, "r", "one"))
        await _in_mongo_in_order(db, sender, 1)
        writer.gate.clear()  # from here on, every Mongo insert hangs until released
        # "two" starts an insert that hangs; the rest are committed and answered
        # meanwhile (a writer that lets one answered batch wait for Mongo
        # would answer one more, then wait for it)
        later = [(await asyncio.wait_for(writer.submit(Draft(sender, "r", body)), 5))[0].id
                 for body in ("two", "three", "four", "five")]
        assert later == [first.id + 1, first.id + 2, first.id + 3, first.id + 4]
        assert await db[mongo.MESSAGES].count_documents({"from": sender}) == 1
        writer.gate.set()
        assert await _in_mongo_in_order(db, sender, 5) == [first.id, *later]


async def test_commits_stop_once_the_unsent_messages_reach_the_bound(own_dbs):
    # batch_max 2: at most UNSENT_BATCHES * 2 committed messages wait for
    # Mongo; past that, commits wait for the insert in flight.
    sender = f"s-{uuid.uuid4().hex[:8]}"
    bound = UNSENT_BATCHES * 2
    gated = running_writer(own_dbs, _GatedWriter, batch_max=2, queue_max=1000, timeout_seconds=30)
    async with gated as (writer, engine, db):
        await writer.submit(Draft(sender, "r", "warm"))  # the session's start and its repair are behind us
        await _in_mongo_in_order(db, sender, 1)
        writer.gate.clear()
        posts = [asyncio.create_task(writer.submit(Draft(sender, "r", f"m{i}"))) for i in range(40)]
        await asyncio.sleep(1.5)  # plenty for 40 commits of 2, were they not bounded
        answered = sum(p.done() for p in posts)
        # the insert in flight (one batch), the bound, and the batch that reached it
        assert bound <= answered <= bound + 2 * 2, answered
        writer.gate.set()
        ids = sorted(msg.id for msg, _ in await asyncio.gather(*posts))
        in_mongo = await _in_mongo_in_order(db, sender, 41)
        assert in_mongo[1:] == ids and ids == list(range(ids[0], ids[0] + 40))


async def test_a_busy_session_records_its_progress_and_keeps_the_lock(own_dbs):
    sender = f"s-{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _GatedWriter, queue_max=1000, timeout_seconds=30,
                              timing=Timing(checkpoint_seconds=0.2)) as (writer, engine, db):
        await writer.submit(Draft(sender, "r", "warm"))
        await asyncio.sleep(0.5)  # that session ends: the busy one below is a new one
        sessions = writer.sessions
        stop = asyncio.Event()

        async def client(i):
            n = 0
            while not stop.is_set():
                await writer.submit(Draft(sender, "r", f"c{i}-{n}"))
                n += 1

        clients = [asyncio.create_task(client(i)) for i in range(10)]
        try:
            await asyncio.sleep(0.3)
            _last, mirrored_before = await asyncio.to_thread(_state, engine)
            await asyncio.sleep(1.0)
            _last, mirrored_during = await asyncio.to_thread(_state, engine)
            assert mirrored_during > mirrored_before  # recorded while the session goes on
            assert writer.sessions == sessions + 1  # one session all along: the lock was never given up
        finally:
            stop.set()
            await asyncio.gather(*clients)
        async with asyncio.timeout(10):
            while (state := await asyncio.to_thread(_state, engine))[1] != state[0]:
                await asyncio.sleep(0.1)
            # meta.head follows, at the latest in the next idle tick
            while (await db[mongo.META].find_one({"_id": "head"}))["id"] != state[0]:
                await asyncio.sleep(0.1)


async def test_each_message_s_way_into_mongo_is_measured_once_from_its_created_at(own_dbs):
    # chat_writer_mongo_lag_seconds: what the writer adds to a delivery. One
    # observation per message, from its created_at stamp (before its MySQL
    # INSERT) to the return of the Mongo insert that holds it.
    lags: list[float] = []
    sender = f"s-{uuid.uuid4().hex[:8]}"
    held = 0.3
    async with running_writer(own_dbs, _GatedWriter, queue_max=1000, timeout_seconds=30,
                              observe_mongo_lag=lambda s, n: lags.extend([s] * n)) as (writer, engine, db):
        await writer.submit(Draft(sender, "r", "warm"))
        await _in_mongo_in_order(db, sender, 1)
        async with asyncio.timeout(5):
            while not lags:
                await asyncio.sleep(0.01)
        lags.clear()
        writer.gate.clear()
        await asyncio.wait_for(asyncio.gather(*(writer.submit(Draft(sender, "r", f"m{i}")) for i in range(5))), 5)
        await asyncio.sleep(held)  # answered (committed), and Mongo still held
        assert lags == []
        writer.gate.set()
        await _in_mongo_in_order(db, sender, 6)
        async with asyncio.timeout(5):
            while len(lags) < 5:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        assert len(lags) == 5 and held <= min(lags) and max(lags) < held + 2, lags


class _SlowCommitWriter(_GatedWriter):
    """Its MySQL commits take ``commit_delay`` seconds more (in the writer's thread)."""

    commit_delay = 0.0

    def _commit_batch(self, conn, batch, last_id):
        time.sleep(self.commit_delay)
        return super()._commit_batch(conn, batch, last_id)


async def test_the_next_insert_starts_when_the_last_one_ends_not_when_the_session_gets_to_it(own_dbs):
    # Were the next insert started by the session loop, an insert that ended
    # during a MySQL commit would be followed by the next only once that commit
    # returned: at 1,000 msg/s, where the writer is nearly always committing,
    # each message would wait for Mongo that much longer. The pump starts it
    # at once.
    sender = f"s-{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _SlowCommitWriter, queue_max=1000, timeout_seconds=30) as (writer, engine, db):
        await writer.submit(Draft(sender, "r", "warm"))
        await _in_mongo_in_order(db, sender, 1)
        writer.gate.clear()
        early = [(await asyncio.wait_for(writer.submit(Draft(sender, "r", b)), 5))[0].id for b in ("m1", "m2", "m3")]
        writer.commit_delay = 1.5
        late = asyncio.create_task(writer.submit(Draft(sender, "r", "m4")))
        await asyncio.sleep(0.3)  # m4's commit is under way
        writer.gate.set()  # m1's insert ends; m2 and m3 are next
        assert (await _in_mongo_in_order(db, sender, 4, timeout=1.0))[1:] == early
        assert not late.done()  # in Mongo while the session was still in m4's commit
        m4, _ = await asyncio.wait_for(late, 5)
        assert (await _in_mongo_in_order(db, sender, 5))[1:] == [*early, m4.id]
