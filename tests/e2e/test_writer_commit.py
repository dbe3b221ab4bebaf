"""A COMMIT that fails is answered by what MySQL holds, never by a guess.

The failure is injected at the batch's COMMIT (``MessageWriter._commit``), against the real MariaDB and
FerretDB: once after the commit took (its answer lost on the way back, as
with a read time-out on a slow MySQL), once before it was sent.
"""

import asyncio
import threading
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from api.app import read_threads
from chat.drafts import Draft
from chat.write_errors import ClientIdConflict, WriteOutcomeUnknown
from db import mongo
from db.sql import make_engine
from tests.e2e.helpers import running_writer
from tests.system import databases
from writer.message_writer import MessageWriter


class _LosesOneCommit(MessageWriter):
    def __init__(self, *args, took: bool | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.took, self.armed = took, took is not None  # None: loses nothing

    def _commit(self, conn):
        if self.armed:
            self.armed = False
            if self.took:
                super()._commit(conn)  # committed; the answer is what goes missing
            raise OperationalError("COMMIT", {}, Exception("Lost connection to server during query"))
        return super()._commit(conn)


@pytest.fixture(scope="module")
def own_dbs(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("commit")) as d:
        yield d


def _bodies(engine, sender):
    with engine.connect() as conn:
        return [r.body for r in conn.execute(text("SELECT body FROM messages WHERE sender = :s ORDER BY id"),
                                             {"s": sender})]


async def test_a_commit_that_took_but_lost_its_answer_is_answered_201_and_still_reaches_mongo(own_dbs):
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _LosesOneCommit, took=True) as (writer, engine, db):
        msgs = await asyncio.gather(*(writer.submit(Draft(sender, "r", f"m{i}", f"c{i}")) for i in range(5)))
        assert all(created for _msg, created in msgs)  # stored, and told so (was: 503 "nothing stored")
        assert _bodies(engine, sender) == [f"m{i}" for i in range(5)]
        ids = sorted(msg.id for msg, _ in msgs)
        async with asyncio.timeout(10):  # the outbox: the next session copies the batch to Mongo
            while len([d async for d in db[mongo.MESSAGES].find({"from": sender})]) < 5:
                await asyncio.sleep(0.1)
        assert sorted([d["_id"] async for d in db[mongo.MESSAGES].find({"from": sender})]) == ids


async def test_a_commit_that_failed_says_the_outcome_is_unknown_and_a_retry_stores_it_once(own_dbs):
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _LosesOneCommit, took=False) as (writer, engine, _db):
        with pytest.raises(WriteOutcomeUnknown):
            await writer.submit(Draft(sender, "r", "once", "c1"))
        assert _bodies(engine, sender) == []  # rolled back, never committed later by accident
        msg, created = await writer.submit(Draft(sender, "r", "once", "c1"))  # the client's retry
        assert created and _bodies(engine, sender) == ["once"]
        again, created = await writer.submit(Draft(sender, "r", "once", "c1"))
        assert not created and again.id == msg.id


async def test_slow_reads_leave_the_writer_free_to_reach_both_stores(own_dbs):
    """The API's history reads, sweeper and /readyz run on threads of their own
    (api.app.read_threads; tests/e2e/test_api_ops.py shows they keep out of
    asyncio's default executor). With every one of them stuck, a message is
    still stored in MySQL and inserted into Mongo, by a writer that opens its
    first Mongo connection meanwhile."""
    sender = f"s{uuid.uuid4().hex[:8]}"
    reads_engine = make_engine(own_dbs.settings().mysql_url.get_secret_value(), 5)
    reads = read_threads(reads_engine)
    release = threading.Event()
    stuck = asyncio.gather(*(reads.run(release.wait, 30) for _ in range(reads.count)))
    try:
        await asyncio.sleep(0.1)
        async with running_writer(own_dbs, _LosesOneCommit, took=None) as (writer, engine, db):
            msg, created = await asyncio.wait_for(writer.submit(Draft(sender, "r", "not held back")), 10)
            assert created and _bodies(engine, sender) == ["not held back"]
            async with asyncio.timeout(10):
                while await db[mongo.MESSAGES].find_one({"_id": msg.id}) is None:
                    await asyncio.sleep(0.05)
            assert not stuck.done()  # all of that while every read thread was still stuck
    finally:
        release.set()
        await stuck
        reads.close()
        reads_engine.dispose()


async def test_a_batch_with_retries_of_stored_messages_answers_them_with_originals_and_stores_the_rest_once(own_dbs):
    # The batch goes in without a look-up first; the unique (sender,
    # client_msg_id) refuses it, and only then are the retries looked up:
    # the originals answer them (created False, or a conflict for another
    # body), the new messages get the next ids, and nothing is stored twice.
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, window_ms=20) as (writer, engine, db):
        first, created = await writer.submit(Draft(sender, "r", "one", "c1"))
        assert created
        # one batch (queued within the writer's window): a retry, a reused id, two new, a new one twice
        drafts = [Draft(sender, "r", "one", "c1"), Draft(sender, "r", "other body", "c1"),
                  Draft(sender, "r", "two", "c2"), Draft(sender, "r", "three", "c3"), Draft(sender, "r", "two", "c2")]
        answers = await asyncio.gather(*(writer.submit(d) for d in drafts), return_exceptions=True)
        retry, conflict, two, three, two_again = answers
        assert retry == (first, False)
        assert isinstance(conflict, ClientIdConflict) and conflict.original == first
        assert two[1] and three[1] and (two[0].id, three[0].id) == (first.id + 1, first.id + 2)
        assert two_again == (two[0], False)
        assert _bodies(engine, sender) == ["one", "two", "three"]
        async with asyncio.timeout(10):
            while len([d["_id"] async for d in db[mongo.MESSAGES].find({"from": sender})]) < 3:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert sorted([d["_id"] async for d in db[mongo.MESSAGES].find({"from": sender})]) == \
            [first.id, first.id + 1, first.id + 2]


async def test_a_session_numbers_on_from_the_highest_stored_id_when_stream_state_lags_behind(own_dbs):
    # The batches do not move stream_state.last_id (one round trip fewer each):
    # it is recorded at checkpoints and at a session's end, so after a writer
    # killed mid-session it is behind what `messages` holds. The next session
    # must number on from the highest stored id, never reuse one.
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs) as (writer, _engine, _db):
        before, _ = await writer.submit(Draft(sender, "r", "before"))
    # that writer is gone (its task cancelled, as by a kill): nothing moves stream_state now
    engine = make_engine(own_dbs.settings().mysql_url.get_secret_value(), 1)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE stream_state SET last_id = :stale"), {"stale": before.id - 1})
    finally:
        engine.dispose()
    async with running_writer(own_dbs) as (writer, engine, db):
        after, created = await writer.submit(Draft(sender, "r", "after"))
        assert created and after.id == before.id + 1
        assert _bodies(engine, sender) == ["before", "after"]
        async with asyncio.timeout(10):  # in Mongo, and last_id recorded once the session ends
            while await db[mongo.MESSAGES].find_one({"_id": after.id}) is None:
                await asyncio.sleep(0.05)
            while True:
                with engine.connect() as conn:
                    if conn.execute(text("SELECT last_id FROM stream_state")).scalar() == after.id:
                        break
                await asyncio.sleep(0.05)


async def test_a_writer_cancelled_mid_call_releases_its_lock_after_that_call_and_the_next_writer_writes(
        own_dbs, caplog):
    # A shutdown cancels the writer's task while a call on its session's
    # connection is under way: here the session's first read, held up by a
    # table lock. The release must run after that call, on the same connection,
    # not beside it (that failed with "connection in use from another thread"
    # and left the writer lock held by a pooled connection: every later session
    # timed out), and the cancel must end the task (a shutdown waits for it).
    url = own_dbs.settings().mysql_url.get_secret_value()
    locker = make_engine(url, 10)
    try:
        with locker.connect() as conn:
            conn.execute(text("LOCK TABLES messages WRITE"))
            try:
                async with asyncio.timeout(15):
                    async with running_writer(own_dbs):
                        await asyncio.sleep(0.6)  # its idle session (every 0.2 s) now waits on `messages`
            finally:
                conn.execute(text("UNLOCK TABLES"))
        async with asyncio.timeout(10):
            while True:
                with locker.connect() as conn:
                    if conn.execute(text("SELECT IS_USED_LOCK('chat.writer')")).scalar() is None:
                        break
                await asyncio.sleep(0.05)
    finally:
        locker.dispose()
    assert not [r for r in caplog.records if "release_failed" in r.getMessage()]
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs) as (writer, engine, _db):
        msg, created = await asyncio.wait_for(writer.submit(Draft(sender, "r", "after the shutdown")), 10)
        assert created and _bodies(engine, sender) == ["after the shutdown"]
