"""Partitioned writes (CHAT_PARTITIONS=4) against real MariaDB and FerretDB, through the writer process.

Each partition is a cell: its own gap-free ids, lock, tables and collection. A
message is written in its sender's partition and copied, once, into its
recipient's; a partition whose writer is stalled holds back no other.
"""

import asyncio
import re

import httpx
import pymongo
import pytest
from sqlalchemy import create_engine, event, text

from chat.drafts import Draft
from chat.partitions import SlotMap, lock_name, suffix
from tests.e2e.helpers import partition_docs, partition_rows, post, running_writer, user_in
from harness.system import databases, running_system
from tests.timing import PATIENCE, eventually
from writer import commit_trip
from writer.message_writer import MessageWriter
from writer.mysql_steps import MySQLSteps, next_lock_name

FOUR = SlotMap.even(4)


def echoes(dbs) -> list:
    engine = create_engine(dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT * FROM echoes")).all()
    finally:
        engine.dispose()


async def soon(check, what: str):
    """``check()``'s first truthy value, looked at in a thread (it queries a database)."""
    return await eventually(lambda: asyncio.to_thread(check), what)


def waiting_for_lock(dbs, name: str) -> bool:
    """Some connection waits in GET_LOCK(``name``) (MariaDB shows the statement in its process list)."""
    engine = create_engine(dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                                     "WHERE INFO LIKE '%SELECT GET_LOCK(%' AND INFO LIKE :n"),
                                {"n": f"%{name}%"}).scalar() > 0
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("parts"), partitions=4) as dbs:
        yield dbs


@pytest.fixture(scope="module")
def hosted(four):
    with running_system(four, daemons=0, apis=1, writer=True, CHAT_RATE_LIMIT_PER_SECOND="0") as system:
        yield system


def test_db_init_lays_out_four_partitions_each_with_its_tables_and_collection(four):
    engine = create_engine(four.mariadb.url())
    try:
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT slot_map FROM partition_map")).scalar()
            states = [conn.execute(text(f"SELECT last_id, mirrored_upto FROM stream_state{suffix(k)}")).all()
                      for k in range(4)]
    finally:
        engine.dispose()
    assert SlotMap.decode(stored) == FOUR
    assert all(len(state) == 1 for state in states)
    client = pymongo.MongoClient(four.ferretdb.url)
    try:
        assert {"messages", "messages_p1", "messages_p2", "messages_p3"} <= set(client["chat"].list_collection_names())
    finally:
        client.close()


async def test_each_partition_numbers_its_own_messages_without_gaps(hosted):
    senders = {k: user_in(k, "s", FOUR) for k in range(4)}
    async with httpx.AsyncClient(timeout=PATIENCE) as c:
        replies = await asyncio.gather(*(post(hosted, senders[k], user_in(k, "r", FOUR), f"m{i}", client=c)
                                         for k in range(4) for i in range(6)))
    assert [r.status_code for r in replies] == [201] * 24
    for k in range(4):
        table = partition_rows(hosted.dbs, k)
        assert [r.id for r in table] == list(range(1, len(table) + 1))  # gap-free, from 1, in each partition
        mine = [r for r in table if r.sender == senders[k]]
        assert len(mine) == 6 and all(r.origin_part is None for r in mine)
        answered = {int(r.json()["id"]) for r in replies if r.json()["from"] == senders[k]}
        assert {r.id for r in mine} == answered
        others = [partition_rows(hosted.dbs, j, "sender = :s", s=senders[k]) for j in range(4) if j != k]
        assert others == [[], [], []]  # no copy: every recipient was in the sender's partition
        stored = await soon(lambda k=k: len(got := partition_docs(hosted.dbs, k, {"from": senders[k]})) == 6 and got,
                            f"partition {k}'s messages in its collection")
        assert sorted(d["_id"] for d in stored) == sorted(answered)


async def test_a_message_to_another_partition_is_stored_once_in_each_even_when_retried(hosted):
    alice, bob = user_in(1, "alice", FOUR), user_in(2, "bob", FOUR)
    first = await post(hosted, alice, bob, "hello bob", "k1")
    again = await post(hosted, alice, bob, "hello bob", "k1")
    assert (first.status_code, again.status_code) == (201, 200) and again.json() == first.json()
    original_id = int(first.json()["id"])

    originals = partition_rows(hosted.dbs, 1, "sender = :s", s=alice)
    assert [(r.id, r.recipient, r.body, r.origin_part, r.origin_id) for r in originals] == \
        [(original_id, bob, "hello bob", None, None)]
    copies = await soon(lambda: partition_rows(hosted.dbs, 2, "sender = :s", s=alice), "the copy in bob's partition")
    assert [(r.recipient, r.body, r.client_msg_id, r.origin_part, r.origin_id) for r in copies] == \
        [(bob, "hello bob", "k1", 1, original_id)]
    assert copies[0].created_at == originals[0].created_at  # one message, one time, on both sides
    assert partition_rows(hosted.dbs, 0, "sender = :s", s=alice) == []
    assert partition_rows(hosted.dbs, 3, "sender = :s", s=alice) == []

    in_home = await soon(lambda: partition_docs(hosted.dbs, 1, {"from": alice}), "the original in its collection")
    in_theirs = await soon(lambda: partition_docs(hosted.dbs, 2, {"from": alice}), "the copy in its collection")
    assert [d["_id"] for d in in_home] == [original_id] and "origin_part" not in in_home[0]
    assert [(d["_id"], d["origin_part"], d["origin_id"]) for d in in_theirs] == [(copies[0].id, 1, original_id)]
    assert not [e for e in echoes(hosted.dbs) if (e.from_part, e.from_id) == (1, original_id)]

    # Each side reads its own partition: the same message, each with its partition's id.
    async with httpx.AsyncClient(timeout=PATIENCE) as c:
        seen_by_bob = (await c.get(f"{hosted.api_url}/v1/messages", params={"with": alice},
                                   headers={"Authorization": f"Bearer {hosted.token(bob)}"})).json()["messages"]
        seen_by_alice = (await c.get(f"{hosted.api_url}/v1/messages", params={"with": bob},
                                     headers={"Authorization": f"Bearer {hosted.token(alice)}"})).json()["messages"]
        bobs_list = (await c.get(f"{hosted.api_url}/v1/conversations",
                                 headers={"Authorization": f"Bearer {hosted.token(bob)}"})).json()["conversations"]
    assert [(m["id"], m["body"]) for m in seen_by_bob] == [(str(copies[0].id), "hello bob")]
    assert [(m["id"], m["body"]) for m in seen_by_alice] == [(str(original_id), "hello bob")]
    assert [(c["with"], c["last"]["id"]) for c in bobs_list] == [(alice, str(copies[0].id))]


async def test_a_leftover_echo_becomes_exactly_one_copy(hosted):
    # A writer of partition 1 on another host whose hand-over never happens, as
    # when it is killed between its commit and the copy's: its commit leaves
    # the original and the echo row, and partition 2's writer, in the writer
    # process, drains the echo into one copy.
    alice, bob = user_in(1, "alice", FOUR), user_in(2, "bob", FOUR)
    async with running_writer(hosted.dbs, partition=1, slot_map=FOUR) as (writer, _engine, _db):
        original, created = await writer.submit(Draft(alice, bob, "left over", "k9"))
    assert created
    copies = await soon(lambda: partition_rows(hosted.dbs, 2, "sender = :s", s=alice), "the echo made into a copy")
    assert [(r.origin_part, r.origin_id, r.body) for r in copies] == [(1, original.id, "left over")]
    # Every turn of partition 2's writer drains what echoes are left before its
    # batch: once this message is answered, a turn has drained after the copy.
    assert (await post(hosted, user_in(2, "carl", FOUR), bob, "a later turn")).status_code == 201
    assert len(partition_rows(hosted.dbs, 2, "sender = :s", s=alice)) == 1  # still one copy
    assert not [e for e in echoes(hosted.dbs) if (e.from_part, e.from_id) == (1, original.id)]
    in_theirs = await soon(lambda: partition_docs(hosted.dbs, 2, {"from": alice}), "the copy in its collection")
    assert [d["_id"] for d in in_theirs] == [copies[0].id]


class _CountedLookUps(MySQLSteps):
    """Counts the look-ups a batch makes once its INSERT was refused (a retry or a copy stored already)."""
    look_ups = 0

    def _existing(self, conn, batch):
        type(self).look_ups += 1
        return super()._existing(conn, batch)


class _LookUpsCounted(MessageWriter):
    mysql_steps = _CountedLookUps


async def test_a_copy_handed_over_after_another_host_s_writer_made_it_is_not_written_again(hosted):
    # This host's writer of partition 1 commits alice -> bob and hands the copy to
    # this host's writer of partition 2. Before that one's turn, another host's
    # writer of partition 2 (the writer process) drains the echo into the copy.
    alice, bob, carl = user_in(1, "alice", FOUR), user_in(2, "bob", FOUR), user_in(2, "carl", FOUR)
    handed = []
    async with running_writer(hosted.dbs, partition=1, slot_map=FOUR,
                              hand_over=lambda part, copy: handed.append((part, copy))) as (home, _engine, _db):
        original, _ = await home.submit(Draft(alice, bob, "made elsewhere", "k7"))
    assert [(part, copy.origin) for part, copy in handed] == [(2, (1, original.id))]
    await soon(lambda: partition_rows(hosted.dbs, 2, "sender = :s", s=alice),
               "the copy, made by the other host's writer")

    _CountedLookUps.look_ups = 0
    async with running_writer(hosted.dbs, _LookUpsCounted, partition=2, slot_map=FOUR) as (theirs, _engine, _db):
        theirs.offer_copy(handed[0][1])
        later, created = await theirs.submit(Draft(carl, bob, "after it", "k8"))
    assert created
    assert [(r.origin_id, r.body) for r in partition_rows(hosted.dbs, 2, "sender = :s", s=alice)] == \
        [(original.id, "made elsewhere")]
    table = partition_rows(hosted.dbs, 2)
    assert [r.id for r in table] == list(range(1, len(table) + 1)) and later.id in {r.id for r in table}
    # The copy was dropped before the batch: no INSERT of it was refused and looked up.
    assert _CountedLookUps.look_ups == 0


def _statement_kind(statement: str) -> str:
    s = statement.lower()
    if "get_lock(" in s:
        return "get_lock"
    if "stream_state" in s and "release_lock(" in s:
        return "state and next-lock let go"
    if s.startswith("insert into messages"):
        return "insert"
    if "from echoes" in s:
        return "echoes"
    if s.startswith("select") and "from messages" in s:
        # the outbox's repair reads a page after mirrored_upto; any other read is of originals
        return "outbox page" if re.search(r"\.id > ", s) else "originals"
    return s.split()[0]


async def test_a_turn_takes_the_lock_and_reads_its_start_in_one_commit(four, monkeypatch):
    # Every statement a turn runs between the lock and its first INSERT is one more
    # round trip that each other host's writer of the partition waits for.
    said: list[str] = []
    alice, carl, bob = user_in(1, "alice", FOUR), user_in(2, "carl", FOUR), user_in(2, "bob", FOUR)
    # a copy owed to partition 2 (its writer is not running, and nothing hands it over): the
    # first turn there drains it, and reads the echo and its original in the drain's one statement
    async with running_writer(four, partition=1, slot_map=FOUR) as (home, _engine, _db):
        await home.submit(Draft(alice, bob, "owed to partition 2", None))
    async with running_writer(four, partition=2, slot_map=FOUR) as (writer, engine, _db):
        event.listen(engine, "before_cursor_execute", lambda _c, _cur, statement, *_: said.append(statement))
        event.listen(engine, "commit", lambda _c: said.append("COMMIT"))
        sending = commit_trip.send
        # a batch's trip (its statements and COMMIT, one query) goes to the driver past SQLAlchemy
        monkeypatch.setattr(commit_trip, "send", lambda conn, trip: (said.append(trip.sql), sending(conn, trip))[1])
        await writer.submit(Draft(carl, bob, "one turn", None))
    kinds = [_statement_kind(s) for s in said]
    insert = kinds.index("insert")
    start = max(i for i, kind in enumerate(kinds[:insert]) if kind == "get_lock") - 1
    # An outbox an earlier test's writer left is repaired page by page (each read committed) before the INSERT.
    turn = [kind for i, kind in enumerate(kinds[:insert + 1]) if i >= start and kind != "outbox page" and not (
        kind == "commit" and kinds[i - 1] == "outbox page")]
    assert turn == ["get_lock", "get_lock", "state and next-lock let go", "echoes", "commit", "insert"], said[start:]
    # and the first batch, with the drained copy in it, is one query: its rows, the copy's echo
    # paid, and its COMMIT (and the question whether another process is queued, when due)
    assert [part.split()[0].lower() for part in said[insert].split(";\n") if "IS_USED_LOCK" not in part] == \
        ["insert", "delete", "commit"], said[insert]


async def test_a_stalled_partition_holds_back_no_other_and_loses_nothing(hosted):
    senders = {k: user_in(k, "s", FOUR) for k in range(4)}
    engine = create_engine(hosted.dbs.mariadb.url())
    holder = engine.connect()
    try:
        # Another connection takes partition 3's writer lock, queued as a writer queues (the
        # next-lock first: the writer holding the lock hands it over when it sees that), and
        # holds it: partition 3's writer waits, the others go on.
        assert holder.execute(text("SELECT GET_LOCK(:n, 10)"), {"n": next_lock_name(3)}).scalar() == 1
        assert holder.execute(text("SELECT GET_LOCK(:n, 10)"), {"n": lock_name(3)}).scalar() == 1
        holder.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": next_lock_name(3)})
        async with httpx.AsyncClient(timeout=PATIENCE) as c:
            stalled = asyncio.create_task(post(hosted, senders[3], user_in(3, "r", FOUR), "stalled", "st1", client=c))
            # partition 3's writer is in its turn's GET_LOCK, behind the holder
            await soon(lambda: waiting_for_lock(hosted.dbs, lock_name(3)), "partition 3's writer waiting for its lock")
            for k in (0, 1, 2):
                reply = await post(hosted, senders[k], user_in(k, "r", FOUR), "free", client=c)
                # answered while partition 3's message still waits (it is refused only at the lock timeout)
                assert reply.status_code == 201 and not stalled.done()
            refused = await stalled
        # at the lock timeout (CHAT_DB_TIMEOUT_SECONDS), named for what it waited for
        assert (refused.status_code, refused.json()["error"]) == (503, "partition_busy"), refused.text
        assert partition_rows(hosted.dbs, 3, "sender = :s", s=senders[3]) == []
    finally:
        holder.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": lock_name(3)})
        holder.close()
        engine.dispose()
    retried = await post(hosted, senders[3], user_in(3, "r", FOUR), "stalled", "st1")  # the client's retry
    assert retried.status_code == 201
    assert [r.body for r in partition_rows(hosted.dbs, 3, "sender = :s", s=senders[3])] == ["stalled"]
    for k in (0, 1, 2):
        assert [r.body for r in partition_rows(hosted.dbs, k, "sender = :s", s=senders[k])] == ["free"]


@pytest.fixture
def mongo_stops(tmp_path_factory):
    """A system of four partitions on databases of its own: its test stops FerretDB."""
    with databases(tmp_path_factory.mktemp("parts-outbox"), partitions=4) as dbs, \
            running_system(dbs, daemons=0, apis=1, writer=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                           CHAT_DB_TIMEOUT_SECONDS="1") as system:
        yield system


async def test_one_partition_s_outbox_is_repaired_into_its_own_collection(mongo_stops):
    system, dbs = mongo_stops, mongo_stops.dbs
    carol, dave, erin = user_in(2, "carol", FOUR), user_in(2, "dave", FOUR), user_in(0, "erin", FOUR)
    dbs.ferretdb.stop()
    try:
        local = await post(system, carol, dave, "while mongo was down")
        across = await post(system, carol, erin, "to partition 0 while mongo was down")
        assert (local.status_code, across.status_code) == (201, 201)  # stored: MySQL is the permanent store
    finally:
        dbs.ferretdb.start()
    ids = sorted(int(r.json()["id"]) for r in (local, across))
    repaired = await soon(lambda: len(got := partition_docs(dbs, 2, {"from": carol})) == 2 and got,
                          "the outbox repaired")
    assert sorted(d["_id"] for d in repaired) == ids
    copy = await soon(lambda: partition_docs(dbs, 0, {"from": carol}), "the copy in partition 0's collection")
    assert [(d["to"], d["origin_part"], d["origin_id"]) for d in copy] == [(erin, 2, int(across.json()["id"]))]
    assert partition_docs(dbs, 1, {"from": carol}) == [] and partition_docs(dbs, 3, {"from": carol}) == []
    engine = create_engine(dbs.mariadb.url())

    def mirrored_upto() -> int:
        with engine.connect() as conn:
            return conn.execute(text("SELECT mirrored_upto FROM stream_state_p2")).scalar()

    try:
        await soon(lambda: mirrored_upto() >= ids[-1], "partition 2's mirrored_upto past the outbox")
    finally:
        engine.dispose()


async def test_an_api_process_that_writes_for_itself_writes_partitioned_too(four):
    # No writer process (CHAT_WRITER_SOCKET empty): the API process runs a writer
    # per partition itself, beside the writer process of the other test system.
    with running_system(four, daemons=0, apis=1, CHAT_RATE_LIMIT_PER_SECOND="0") as alone:
        fred, gina = user_in(3, "fred", FOUR), user_in(0, "gina", FOUR)
        reply = await post(alone, fred, gina, "from a self-writing API")
        assert reply.status_code == 201
        assert [r.id for r in partition_rows(four, 3, "sender = :s", s=fred)] == [int(reply.json()["id"])]
        copies = await soon(lambda: partition_rows(four, 0, "sender = :s", s=fred), "the copy in gina's partition")
        assert [(r.origin_part, r.origin_id) for r in copies] == [(3, int(reply.json()["id"]))]
