"""The writer's Mongo side (writer/mirror.py ``Mirror``), against the real MariaDB
and FerretDB: commits and their answers do not wait for a Mongo insert, and
Mongo still gets every id once, in id order; and a turn that requests keep
busy records its progress without giving up the lock.

The mirror's own rules (the bound on unsent messages, when the next insert
starts, what a failed or hung insert does, how each message's wait is
measured) are tests/core/test_mirror.py's, with a fake insert and clock."""

import asyncio
import uuid

import pytest
from sqlalchemy import text

from chat.drafts import Draft
from db import mongo
from tests.e2e.helpers import running_writer
from harness.system import databases
from tests.timing import PATIENCE, eventually
from writer.core import Timing
from writer.message_writer import MessageWriter
from writer.mongo_steps import MongoSteps
from writer.mysql_steps import MySQLSteps


class _GatedMongo(MongoSteps):
    """Each Mongo insert waits for ``gate``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.gate.set()

    async def insert(self, docs: list[dict], ordered: bool = True) -> bool:
        await self.gate.wait()
        return await super().insert(docs, ordered)


class _CountedReleases(MySQLSteps):
    """Counts the turns it ends (each releases the lock)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.released = 0

    def _mark_and_release(self, conn, mirrored, last_id):
        try:
            return super()._mark_and_release(conn, mirrored, last_id)
        finally:
            self.released += 1


class _GatedWriter(MessageWriter):
    mongo_steps = _GatedMongo
    mysql_steps = _CountedReleases

    @property
    def gate(self) -> asyncio.Event:
        return self._mongo.gate

    @property
    def released(self) -> int:
        return self._sql.released

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


async def _in_mongo_in_order(db, sender: str, count: int) -> list[int]:
    """Ids of ``sender``'s messages in `messages`' natural (insertion) order, once all are there."""
    async def ids() -> list[int] | None:
        found = [d["_id"] async for d in db[mongo.MESSAGES].find({"from": sender}, {"_id": 1})]
        return found if len(found) >= count else None

    return await eventually(ids, f"{count} messages of {sender} in Mongo")


async def test_a_commit_is_answered_while_the_previous_insert_is_still_running(own_dbs):
    sender = f"s-{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _GatedWriter, queue_max=1000, timeout_seconds=30) as (writer, engine, db):
        first, _ = await writer.submit(Draft(sender, "r", "one"))
        await _in_mongo_in_order(db, sender, 1)
        writer.gate.clear()  # from here on, every Mongo insert hangs until released
        # "two" starts an insert that hangs; the rest are committed and answered
        # meanwhile (a writer that waited for that insert would answer none of
        # them before the gate opens, and the gate opens only after them)
        later = [(await asyncio.wait_for(writer.submit(Draft(sender, "r", body)), PATIENCE))[0].id
                 for body in ("two", "three", "four", "five")]
        assert later == [first.id + 1, first.id + 2, first.id + 3, first.id + 4]
        assert await db[mongo.MESSAGES].count_documents({"from": sender}) == 1
        writer.gate.set()
        assert await _in_mongo_in_order(db, sender, 5) == [first.id, *later]


async def test_a_busy_turn_records_its_progress_and_keeps_the_lock(own_dbs):
    sender = f"s-{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _GatedWriter, queue_max=1000, timeout_seconds=30,
                              timing=Timing(checkpoint_seconds=0.2)) as (writer, engine, db):
        stop = asyncio.Event()
        answered: list[int] = []

        async def client(i):
            n = 0
            while not stop.is_set():
                msg, _ = await writer.submit(Draft(sender, "r", f"c{i}-{n}"))
                answered.append(msg.id)
                n += 1

        clients = [asyncio.create_task(client(i)) for i in range(10)]
        try:
            await eventually(lambda: len(answered) >= 10, "the clients' first answers")  # a turn is under way
            released = writer.released
            _last, mirrored_before = await asyncio.to_thread(_state, engine)

            async def recorded() -> bool:
                return (await asyncio.to_thread(_state, engine))[1] > mirrored_before

            await eventually(recorded, "mirrored_upto recorded past its value while requests keep coming")
            assert writer.released == released  # recorded by a checkpoint: the lock was never given up
            assert len(answered) > 10 and not any(c.done() for c in clients)
        finally:
            stop.set()
            await asyncio.gather(*clients)

        async def settled() -> bool:
            last, mirrored = await asyncio.to_thread(_state, engine)
            # meta.head follows, at the latest in the next idle turn
            return last == mirrored and (await db[mongo.META].find_one({"_id": "head"}))["id"] == last

        await eventually(settled, "mirrored_upto and meta.head at the last id once the requests stop")
