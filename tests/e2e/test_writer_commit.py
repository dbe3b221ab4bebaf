"""A COMMIT that fails is answered by what MySQL holds, never by a guess.

The failure is injected at the batch's trip (its statements and COMMIT in one
round trip, ``MySQLSteps._send``), against the real MariaDB and FerretDB: once
after the commit took (its answer lost on the way back, as with a read
time-out on a slow MySQL), once before it was sent.
"""

import asyncio
import contextlib
import threading
import uuid
from dataclasses import replace

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError

from api.app import read_threads
from chat.drafts import Draft
from chat.write_errors import ClientIdConflict, WriteOutcomeUnknown, WriteUnavailable
from db import mongo
from db.sql import make_engine
from db.threads import Threads
from tests.e2e.helpers import running_writer
from harness.system import databases
from tests.timing import PATIENCE, eventually, eventually_sync
from writer import commit_trip
from writer.commit_trip import CommitUnknown, Trip, send
from writer.message_writer import MessageWriter
from writer.mysql_steps import DEADLOCK_RETRIES, MySQLSteps


class _CommitLost(MySQLSteps):
    """Loses the answer of one batch's trip (its statements and COMMIT, one round trip) once
    armed: ``took`` says whether its COMMIT took, or only the statements before it ran."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.took, self.armed = None, False

    def _send(self, conn, trip):
        if self.armed and trip.commits:
            self.armed = False
            if not self.took:  # the rows went in, in a transaction the lost COMMIT would have ended
                trip = replace(trip, statements=trip.statements[:-1], commits=False)
            super()._send(conn, trip)
            raise CommitUnknown("Lost connection to server during query")
        return super()._send(conn, trip)


class _LosesOneCommit(MessageWriter):
    mysql_steps = _CommitLost

    def __init__(self, *args, took: bool | None, **kwargs):
        super().__init__(*args, **kwargs)
        self._sql.took, self._sql.armed = took, took is not None  # None: loses nothing


@pytest.fixture(scope="module")
def own_dbs(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("commit")) as d:
        yield d


def _bodies(engine, sender):
    with engine.connect() as conn:
        return [r.body for r in conn.execute(text("SELECT body FROM messages WHERE sender = :s ORDER BY id"),
                                             {"s": sender})]


async def _ids_in_mongo(db, sender: str, count: int) -> list[int]:
    """The ids of ``sender``'s documents, sorted, once there are ``count`` of them."""
    async def ids() -> list[int] | None:
        found = sorted([d["_id"] async for d in db[mongo.MESSAGES].find({"from": sender}, {"_id": 1})])
        return found if len(found) >= count else None

    return await eventually(ids, f"{count} messages of {sender} in Mongo")


async def test_a_commit_that_took_but_lost_its_answer_is_answered_201_and_still_reaches_mongo(own_dbs):
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _LosesOneCommit, took=True) as (writer, engine, db):
        msgs = await asyncio.gather(*(writer.submit(Draft(sender, "r", f"m{i}", f"c{i}")) for i in range(5)))
        assert all(created for _msg, created in msgs)  # stored, and told so (was: 503 "nothing stored")
        assert _bodies(engine, sender) == [f"m{i}" for i in range(5)]
        ids = sorted(msg.id for msg, _ in msgs)
        # the outbox: the next turn copies the batch to Mongo
        assert await _ids_in_mongo(db, sender, 5) == ids


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
    reads_engine = make_engine(own_dbs.settings().stores.mysql_url.get_secret_value(), 5)
    reads = read_threads(reads_engine)
    release = threading.Event()
    entered = threading.Semaphore(0)

    def stick() -> None:
        entered.release()
        release.wait(PATIENCE)

    stuck = asyncio.gather(*(reads.run(stick) for _ in range(reads.count)))
    try:
        for _ in range(reads.count):  # every read thread is in its stuck call
            assert await asyncio.to_thread(entered.acquire, timeout=PATIENCE)
        async with running_writer(own_dbs, _LosesOneCommit, took=None) as (writer, engine, db):
            msg, created = await asyncio.wait_for(writer.submit(Draft(sender, "r", "not held back")), PATIENCE)
            assert created and _bodies(engine, sender) == ["not held back"]
            await eventually(lambda: db[mongo.MESSAGES].find_one({"_id": msg.id}), "the message in Mongo")
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
        # Mongo holds only what MySQL committed, each _id once: with these three
        # there, nothing more of this sender can come.
        assert await _ids_in_mongo(db, sender, 3) == [first.id, first.id + 1, first.id + 2]


async def test_a_turn_numbers_on_from_the_highest_stored_id_when_stream_state_lags_behind(own_dbs):
    # The batches do not move stream_state.last_id (one round trip fewer each):
    # it is recorded at checkpoints and at a turn's end, so after a writer
    # killed mid-turn it is behind what `messages` holds. The next turn
    # must number on from the highest stored id, never reuse one.
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs) as (writer, _engine, _db):
        before, _ = await writer.submit(Draft(sender, "r", "before"))
    # that writer is gone (its task cancelled, as by a kill): nothing moves stream_state now
    engine = make_engine(own_dbs.settings().stores.mysql_url.get_secret_value(), 1)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE stream_state SET last_id = :stale"), {"stale": before.id - 1})
    finally:
        engine.dispose()
    async with running_writer(own_dbs) as (writer, engine, db):
        after, created = await writer.submit(Draft(sender, "r", "after"))
        assert created and after.id == before.id + 1
        assert _bodies(engine, sender) == ["before", "after"]
        # in Mongo, and last_id recorded once the turn ends
        await eventually(lambda: db[mongo.MESSAGES].find_one({"_id": after.id}), "the message in Mongo")

        def last_id() -> int:
            with engine.connect() as conn:
                return conn.execute(text("SELECT last_id FROM stream_state")).scalar()

        async def recorded() -> bool:
            return await asyncio.to_thread(last_id) == after.id

        await eventually(recorded, "stream_state.last_id recorded")


class _QueuesItsCalls(MessageWriter):
    """Names each MySQL call as it is queued for the writer's one thread."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._sql._threads.close()
        self._sql._threads = _Recording()

    @property
    def queued(self) -> list[str]:
        return self._sql._threads.queued


class _Recording(Threads):
    def __init__(self):
        super().__init__(1, "writer")
        self.queued: list[str] = []

    def run(self, fn, *args):
        self.queued.append(getattr(fn, "__name__", repr(fn)))
        return super().run(fn, *args)


def _waiting_for_a_table_lock(engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(text("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                                 "WHERE STATE LIKE 'Waiting for table%'")).scalar() > 0


async def test_a_writer_cancelled_mid_call_releases_its_lock_after_that_call_and_the_next_writer_writes(
        own_dbs, caplog):
    # A shutdown cancels the writer's task while a call on its turn's
    # connection is under way: here the turn's first read, held up by a
    # table lock. The release must run after that call, on the same connection,
    # not beside it (that failed with "connection in use from another thread"
    # and left the writer lock held by a pooled connection: every later turn
    # timed out), and the cancel must end the task (a shutdown waits for it).
    url = own_dbs.settings().stores.mysql_url.get_secret_value()
    locker = make_engine(url, 10)
    try:
        with locker.connect() as conn:
            conn.execute(text("LOCK TABLES messages WRITE"))
            try:
                async with asyncio.timeout(PATIENCE), running_writer(own_dbs, _QueuesItsCalls) as (writer, _e, _db):
                    # its idle turn now waits on `messages`
                    await eventually(lambda: asyncio.to_thread(_waiting_for_a_table_lock, locker),
                                     "the writer's read waiting for the table lock")

                    async def unlock_once_the_release_is_queued() -> None:
                        await eventually(lambda: "_mark_and_release" in writer.queued,
                                         "the cancelled turn's release queued behind its read")
                        await asyncio.to_thread(conn.execute, text("UNLOCK TABLES"))

                    unlocking = asyncio.create_task(unlock_once_the_release_is_queued())
                # the writer is cancelled (the context's end) and its task ended
                await unlocking
            finally:
                conn.execute(text("UNLOCK TABLES"))

        def writer_lock_free() -> bool:
            with locker.connect() as conn:
                return conn.execute(text("SELECT IS_USED_LOCK('chat.writer')")).scalar() is None

        await eventually(lambda: asyncio.to_thread(writer_lock_free), "the writer lock released")
    finally:
        locker.dispose()
    assert not [r for r in caplog.records if "release_failed" in r.getMessage()]
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs) as (writer, engine, _db):
        msg, created = await asyncio.wait_for(writer.submit(Draft(sender, "r", "after the shutdown")), PATIENCE)
        assert created and _bodies(engine, sender) == ["after the shutdown"]


class _DeadlockVictim(MySQLSteps):
    """Its batch's transaction is chosen as a deadlock's victim ``times`` times, as InnoDB does it: the
    statements ran, then the server rolled the whole transaction back and answered 1213."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.times = 0

    def _write_batch(self, conn, batch, last_id, started, known, ask_others):
        if self.times:
            self.times -= 1
            conn.execute(text("SELECT 1"))
            conn.rollback()
            raise OperationalError("INSERT", {}, Exception(1213, "Deadlock found when trying to get lock"))
        return super()._write_batch(conn, batch, last_id, started, known, ask_others)


class _LosesDeadlocks(MessageWriter):
    mysql_steps = _DeadlockVictim

    def __init__(self, *args, times: int, **kwargs):
        super().__init__(*args, **kwargs)
        self._sql.times = times


async def test_a_deadlock_s_victim_is_written_again_and_answered_once(own_dbs):
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _LosesDeadlocks, times=2) as (writer, engine, _db):
        msgs = await asyncio.gather(*(writer.submit(Draft(sender, "r", f"m{i}", f"c{i}")) for i in range(3)))
        assert all(created for _msg, created in msgs)
        assert _bodies(engine, sender) == ["m0", "m1", "m2"]  # once each, in order


async def test_a_deadlock_past_the_retries_is_a_503_and_nothing_is_stored(own_dbs):
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _LosesDeadlocks, times=DEADLOCK_RETRIES + 1) as (writer, engine, _db):
        with pytest.raises(WriteUnavailable, match="1213"):
            await writer.submit(Draft(sender, "r", "lost to deadlocks", "c1"))
        assert _bodies(engine, sender) == []
        msg, created = await writer.submit(Draft(sender, "r", "lost to deadlocks", "c1"))  # the client's retry
        assert created and _bodies(engine, sender) == ["lost to deadlocks"]


class _StatementFails(MySQLSteps):
    """One batch's trip gets a statement that the server refuses, last before its COMMIT (a turn
    that read through SQLAlchemy first has SQLAlchemy commit, after the trip)."""

    def _send(self, conn, trip):
        if any("refused-once" in str(p) for p in trip.params):
            ending = trip.statements[-1:] if trip.commits else []
            kept = trip.statements[:len(trip.statements) - len(ending)]
            trip = replace(trip, statements=[*kept, "SELECT no_such_column FROM messages", *ending])
        return super()._send(conn, trip)


class _RefusesOneStatement(MessageWriter):
    mysql_steps = _StatementFails


async def test_a_statement_the_server_refuses_stops_the_trip_before_its_commit_and_nothing_is_stored(own_dbs):
    # The batch's rows, echoes and COMMIT go as one query; MySQL stops at the first
    # statement that fails, so the COMMIT after it never runs, and the rows before
    # it are rolled back rather than left for the next commit on that connection.
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _RefusesOneStatement) as (writer, engine, _db):
        with pytest.raises(WriteUnavailable, match="OperationalError 1054"):  # unknown column
            await writer.submit(Draft(sender, "r", "refused-once", "c1"))
        assert _bodies(engine, sender) == []
        after, created = await writer.submit(Draft(sender, "r", "next", "c2"))
        assert created and _bodies(engine, sender) == ["next"]  # and not the refused one with it


@contextlib.contextmanager
def _scratch_table(dbs):
    """(an engine, the name of a table of its own: an INT primary key ``id``), dropped after."""
    engine = make_engine(dbs.settings().stores.mysql_url.get_secret_value(), 5)
    table = f"trip_{uuid.uuid4().hex[:8]}"
    try:
        with engine.connect() as conn:
            conn.execute(text(f"CREATE TABLE {table} (id INT PRIMARY KEY)"))
        yield engine, table
    finally:
        with engine.connect() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()


def test_a_trip_answers_its_question_and_commits_only_if_every_statement_ran(own_dbs):
    with _scratch_table(own_dbs) as (engine, table):
        with engine.connect() as conn:
            ok = Trip()
            ok.add(f"INSERT INTO {table} (id) VALUES (%s), (%s)", (1, 2))
            ok.ask(f"SELECT COUNT(*) FROM {table}")
            ok.commit()
            assert send(conn, ok).asked == 2
            refused = Trip()
            refused.add(f"INSERT INTO {table} (id) VALUES (%s)", (3,))
            refused.add(f"INSERT INTO {table} (id) VALUES (%s)", (1,))  # the primary key refuses it
            refused.commit()
            with pytest.raises(IntegrityError):
                send(conn, refused)
            # neither committed by the trip nor left open for the next commit on the session
            conn.execute(text("COMMIT"))
        with engine.connect() as other:
            assert [r[0] for r in other.execute(text(f"SELECT id FROM {table} ORDER BY id"))] == [1, 2]


async def test_a_batch_too_large_for_one_query_goes_in_several_all_committed_by_the_last(own_dbs, monkeypatch):
    # A turn's first batch may carry CHAT_BATCH_MAX drained copies besides CHAT_BATCH_MAX
    # requests: 1,000 bodies of CHAT_BODY_MAX_CHARS four-byte characters, 16 MB of values,
    # past MariaDB's max_allowed_packet (16 MiB) in one query. The rows go in runs under
    # TRIP_VALUES_MAX_BYTES, in one transaction; each value is escaped by the driver, so a
    # body that reads as SQL or as a format string is stored as it was sent.
    longest = own_dbs.settings().api.body_max_chars
    rows = 2 * own_dbs.settings().writer.batch_max
    hostile = "%s %% %(x)s '; DELETE FROM messages; -- \\' \" ;\n COMMIT"
    bodies = [hostile if i % 100 == 0 else chr(0x1F600 + i % 50) * longest for i in range(rows)]
    sender = f"s{uuid.uuid4().hex[:8]}"
    trips: list[tuple[int, int]] = []  # (the sender's rows, the values' weight) of each query sent
    sending = commit_trip.send

    def counted(conn, trip):
        trips.append((sum(1 for p in trip.params if p == sender),
                      sum(4 * len(p) if isinstance(p, str) else 8 for p in trip.params)))
        return sending(conn, trip)

    monkeypatch.setattr(commit_trip, "send", counted)
    async with running_writer(own_dbs, batch_max=rows, queue_max=2 * rows) as (writer, engine, db):
        stored = await asyncio.gather(*(writer.submit(Draft(sender, "r", body, f"c{i}"))
                                        for i, body in enumerate(bodies)))
        assert all(created for _msg, created in stored)
        assert _bodies(engine, sender) == bodies
        assert await _ids_in_mongo(db, sender, rows) == sorted(msg.id for msg, _ in stored)
    mine = [t for t in trips if t[0]]
    assert sum(n for n, _ in mine) == rows and len(mine) >= 2
    assert max(weight for _, weight in mine) <= commit_trip.TRIP_VALUES_MAX_BYTES


async def test_the_rows_sent_ahead_of_a_refused_last_query_are_not_stored(own_dbs):
    # The same batch, its last query refused by the server: the rows that went ahead
    # in the batch's transaction are rolled back with it.
    longest = own_dbs.settings().api.body_max_chars
    rows = 2 * own_dbs.settings().writer.batch_max
    bodies = [chr(0x1F600 + i % 50) * longest for i in range(rows - 1)] + ["refused-once"]
    sender = f"s{uuid.uuid4().hex[:8]}"
    async with running_writer(own_dbs, _RefusesOneStatement, batch_max=rows, queue_max=2 * rows) as (
            writer, engine, _db):
        answers = await asyncio.gather(*(writer.submit(Draft(sender, "r", body, f"c{i}"))
                                         for i, body in enumerate(bodies)), return_exceptions=True)
        assert all(isinstance(a, WriteUnavailable) for a in answers), {type(a) for a in answers}
        assert _bodies(engine, sender) == []


def test_a_trip_whose_session_is_lost_before_its_commit_may_have_taken_and_stored_nothing(own_dbs):
    # The link lost while the trip runs (its session killed during a statement before the
    # COMMIT): the client cannot know how far the server got, so the outcome is unknown
    # (the writer then looks for the rows on a fresh connection), the connection is
    # dropped from the pool, and MySQL rolled the transaction back with the session.
    with _scratch_table(own_dbs) as (engine, table):
        with engine.connect() as killer:
            with engine.connect() as conn:
                session = conn.execute(text("SELECT CONNECTION_ID()")).scalar()
                conn.commit()
                trip = Trip()
                trip.add(f"INSERT INTO {table} (id) VALUES (%s)", (1,))
                trip.add("SET STATEMENT max_statement_time=0 FOR SELECT SLEEP(%s)", (10 * PATIENCE,))
                trip.commit()
                outcome: list = []
                sending = threading.Thread(target=lambda: outcome.append(_raised(send, conn, trip)))
                sending.start()

                def sleeping():
                    killer.commit()  # a fresh snapshot of the process list
                    return killer.execute(text("SELECT 1 FROM information_schema.processlist WHERE id = :id "
                                               "AND info LIKE 'SET STATEMENT%SLEEP%'"), {"id": session}).first()

                eventually_sync(sleeping, "the trip's session in its SLEEP")
                killer.execute(text(f"KILL {session}"))
                sending.join()
                assert isinstance(outcome[0], CommitUnknown), outcome
                assert conn.invalidated
            killer.commit()
            assert killer.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar() == 0


def _raised(fn, *args) -> BaseException | None:
    try:
        fn(*args)
    except BaseException as exc:  # the test's thread hands back what it raised
        return exc
    return None
