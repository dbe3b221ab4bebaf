"""A writer whose Mongo hangs holds no other writer's messages hostage (writer/turn_waits.py).

Two writers of the same partition, on the same MariaDB and FerretDB, each
with its own engine and Mongo client, as the writer processes of two hosts.
Writer A reaches FerretDB through a link the test cuts (``Link``): what A
sends is held, and delivered once the link is restored, late, as a stalled
network delivers it. A's insert in flight then waits out nothing less than
A's Mongo timeout, far longer than B's lock wait: a turn that waited on it
under the lock made B's POSTs fail at B's lock timeout. A queued writer now
gets the lock after A's grace (HANDOVER_GRACE_SECONDS), copies A's outbox
through its own Mongo, and commits; and once A's held insert lands, after
B's copy and B's newer ids, Mongo holds every committed id once, in id order.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from pymongo import AsyncMongoClient, monitoring
from sqlalchemy import bindparam, create_engine, text

from chat.drafts import Draft
from chat.partitions import MOVER_MARK
from chat.write_errors import Outcome, PartitionBusy, answer_for
from db import mongo
from db.mongo import DUPLICATE_KEY
from db.sql import make_engine
from tests.e2e.helpers import running_writer
from harness.system import databases
from tests.timing import PATIENCE, S, eventually
from writer.message_writer import MessageWriter
from writer.mysql_steps import LOCK_NAME
from writer.server import outcome_of

B_LOCK_WAIT_SECONDS = 5 * S  # B's CHAT_DB_TIMEOUT_SECONDS: its lock wait (and its Mongo timeout)
# A's: its Mongo calls wait this long before they are cut off, so that the held insert
# is still in flight for the whole test, far past B's lock wait.
A_TIMEOUT_SECONDS = 12 * B_LOCK_WAIT_SECONDS


class Link:
    """A TCP relay to a server, which the test can cut: while cut, the bytes
    the client sends are held, and sent on once restored, even if the client
    has hung up meanwhile (a stalled network delivers late; it does not drop)."""

    def __init__(self, port: int):
        self._upstream = port
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._pipes: set[asyncio.Task] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Link:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.restore()
        assert self._server is not None
        self._server.close()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def cut(self) -> None:
        self._flowing.clear()

    def restore(self) -> None:
        self._flowing.set()

    async def _relay(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        server_in, server_out = await asyncio.open_connection("127.0.0.1", self._upstream)
        for pipe in (self._pipe(client_in, server_out, held=True), self._pipe(server_in, client_out, held=False)):
            task = asyncio.create_task(pipe)
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, held: bool) -> None:
        try:
            while data := await source.read(1 << 16):
                if held:
                    await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass
        finally:
            sink.close()


class Inserts(monitoring.CommandListener):
    """The insert commands a Mongo client sent (their ids, by request), which were
    answered, and the ids the server refused as duplicates."""

    def __init__(self) -> None:
        self.sent: dict[int, list[int]] = {}
        self.answered: set[int] = set()
        self.duplicates: set[int] = set()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "insert":
            self.sent[event.request_id] = [d["_id"] for d in event.command.get("documents", [])]

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "insert":
            self.answered.add(event.request_id)
            ids = self.sent.get(event.request_id, [])
            self.duplicates.update(ids[e["index"]] for e in event.reply.get("writeErrors", [])
                                   if e.get("code") == DUPLICATE_KEY)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        if event.command_name == "insert":
            self.answered.add(event.request_id)

    def all_answered(self) -> bool:
        return set(self.sent) <= self.answered


@pytest.fixture(scope="module")
def own_dbs(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("mongo-away")) as d:
        yield d


def _writer(dbs, mongo_client: AsyncMongoClient, timeout_seconds: float) -> MessageWriter:
    settings = dbs.settings()
    engine = make_engine(settings.stores.mysql_url.get_secret_value(), 5)
    return MessageWriter(engine, mongo_client[settings.stores.mongo_db], batch_max=50, window_ms=2, queue_max=100,
                         timeout_seconds=timeout_seconds, retention_seconds=86_400)


def _ids_in_mysql(dbs, senders: list[str]) -> list[int]:
    engine = create_engine(dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            query = text("SELECT id FROM messages WHERE sender IN :s ORDER BY id")
            return list(conn.execute(query.bindparams(bindparam("s", expanding=True)), {"s": senders}).scalars())
    finally:
        engine.dispose()


async def _ids_in_mongo(db, senders: list[str]) -> list[int]:
    """The ids in `messages`, in its natural (insertion) order."""
    return [d["_id"] async for d in db[mongo.MESSAGES].find({"from": {"$in": senders}}, {"_id": 1})]


async def _ids_in_oplog(client: AsyncMongoClient, db_name: str, ids: list[int]) -> list[int]:
    """The ids of the inserts into `messages` the oplog shows, in its order: what the daemons follow."""
    entries = client["local"]["oplog.rs"].find({"op": "i", "ns": f"{db_name}.{mongo.MESSAGES}"})
    return [e["o"]["_id"] async for e in entries if e["o"]["_id"] in ids]


async def test_a_writer_whose_mongo_hangs_hands_the_lock_to_a_queued_one(own_dbs, caplog):
    tag = uuid.uuid4().hex[:8]
    a_sender, b_sender = f"a{tag}", f"b{tag}"
    settings = own_dbs.settings()
    inserts = Inserts()
    async with Link(own_dbs.ferretdb.port) as link:
        a_ms = int(A_TIMEOUT_SECONDS * 1000)
        a_client = AsyncMongoClient(f"mongodb://127.0.0.1:{link.port}/?directConnection=true", tz_aware=True,
                                    serverSelectionTimeoutMS=a_ms, connectTimeoutMS=a_ms, socketTimeoutMS=a_ms,
                                    event_listeners=[inserts])
        b_client = mongo.make_client(settings.stores.mongo_url.get_secret_value(), B_LOCK_WAIT_SECONDS)
        a = _writer(own_dbs, a_client, A_TIMEOUT_SECONDS)
        b = _writer(own_dbs, b_client, B_LOCK_WAIT_SECONDS)
        tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
        try:
            # both in step, each with its Mongo client connected
            before = [await asyncio.wait_for(w.submit(Draft(s, "r", "before")), PATIENCE)
                      for w, s in ((a, a_sender), (b, b_sender))]
            async def both_in_mongo() -> bool:
                return len(await _ids_in_mongo(b_client[settings.stores.mongo_db], [a_sender, b_sender])) == 2

            await eventually(both_in_mongo, "the first two messages in Mongo")

            link.cut()
            # Answered at its commit (MySQL is the truth); its insert hangs, and A's
            # turn waits on it, holding the lock.
            held, created = await asyncio.wait_for(a.submit(Draft(a_sender, "r", "while cut")), PATIENCE)
            assert created
            # B, whose Mongo answers, queues for the lock: it gets it within its lock
            # wait, copies A's outbox first, and commits.
            caplog.clear()
            copied, created = await asyncio.wait_for(b.submit(Draft(b_sender, "r", "b while a hangs")), PATIENCE)
            assert created and copied.id > held.id
            assert "event=mongo_left_in_flight" in caplog.text
            # A still stores while its Mongo is away, and B copies that too before its next message
            later, _ = await asyncio.wait_for(a.submit(Draft(a_sender, "r", "a still cut")), PATIENCE)
            last, _ = await asyncio.wait_for(b.submit(Draft(b_sender, "r", "b last")), PATIENCE)
            ids = _ids_in_mysql(own_dbs, [a_sender, b_sender])
            assert ids == sorted({m.id for m, _ in before} | {held.id, copied.id, later.id, last.id})

            async def all_in_mongo() -> bool:
                return sorted(await _ids_in_mongo(b_client[settings.stores.mongo_db], [a_sender, b_sender])) == ids

            await eventually(all_in_mongo, "every committed message copied to Mongo by B, with A's link cut")

            # A's insert, held on the wire all along, lands now: after B's copy of
            # the same id and B's newer ids. A duplicate: refused, nothing moves.
            link.restore()
            await eventually(lambda: not a._waits._left and inserts.all_answered(), "A's work left in flight ended")
            assert held.id in inserts.duplicates  # it did land, after B's copy
            natural = await _ids_in_mongo(b_client[settings.stores.mongo_db], [a_sender, b_sender])
            assert natural == ids  # each committed id once, inserted in id order
            # and the daemons see each once, in id order: the late duplicate left no entry
            assert await _ids_in_oplog(b_client, settings.stores.mongo_db, ids) == ids
        finally:
            link.restore()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for w in (a, b):
                w.close()
                w._sql.engine.dispose()
            await a_client.close()
            await b_client.close()


async def test_a_lock_held_for_the_whole_wait_is_partition_busy_not_mysql_unavailable(own_dbs):
    """MySQL answers; another writer (here a connection standing in for one)
    holds the partition's lock past the wait: the answer says so, and the
    client's retry stores the message once the lock is free."""
    sender = f"busy{uuid.uuid4().hex[:8]}"
    engine = create_engine(own_dbs.mariadb.url())
    try:
        with engine.connect() as holder:
            assert holder.execute(text("SELECT GET_LOCK(:n, 5)"), {"n": LOCK_NAME}).scalar() == 1
            async with running_writer(own_dbs, timeout_seconds=1) as (writer, _engine, _db):
                with pytest.raises(PartitionBusy) as refused:
                    await asyncio.wait_for(writer.submit(Draft(sender, "r", "busy", "c1")), PATIENCE)
                answer = answer_for(refused.value)
                assert (answer.status, answer.code) == (503, "partition_busy")
                future = asyncio.get_running_loop().create_future()
                future.set_exception(refused.value)
                assert outcome_of(future) == (Outcome.BUSY, None)  # what the writer process answers
                assert _ids_in_mysql(own_dbs, [sender]) == []
                holder.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": LOCK_NAME})
                msg, created = await asyncio.wait_for(writer.submit(Draft(sender, "r", "busy", "c1")), PATIENCE)
                assert created
        assert _ids_in_mysql(own_dbs, [sender]) == [msg.id]
    finally:
        engine.dispose()


async def test_a_lock_held_by_a_move_past_the_wait_is_waited_for_not_refused(own_dbs, caplog):
    """A move's session (it holds its ``chat.mover.<connection id>`` mark) holds the lock past the
    wait, as a cutover may: the writer sees whose hold it is, waits once more, and stores the
    message when the move lets go, instead of refusing a user whose slot does not move."""
    sender = f"mv{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.INFO, logger="chat.writer")
    engine = create_engine(own_dbs.mariadb.url())
    try:
        with engine.connect() as mover:
            mover.execute(text("SELECT GET_LOCK(CONCAT(:m, CONNECTION_ID()), 0)"), {"m": MOVER_MARK})
            assert mover.execute(text("SELECT GET_LOCK(:n, 5)"), {"n": LOCK_NAME}).scalar() == 1
            async with running_writer(own_dbs, timeout_seconds=1) as (writer, _engine, _db):
                submitted = asyncio.ensure_future(writer.submit(Draft(sender, "r", "during a cutover", "c1")))
                await eventually(lambda: "event=writer_waits_for_move" in caplog.text,
                                 "the writer's first wait ran out and it saw the move's hold")
                assert not submitted.done() and _ids_in_mysql(own_dbs, [sender]) == []
                mover.execute(text("SELECT RELEASE_ALL_LOCKS()"))
                msg, created = await asyncio.wait_for(submitted, PATIENCE)
                assert created
        assert _ids_in_mysql(own_dbs, [sender]) == [msg.id]
    finally:
        engine.dispose()
