"""Failure semantics of the write API, against real servers that the test
stops, blocks and kills: MySQL down or slow, Mongo down after the MySQL
commit, and the API process killed mid-request."""

import asyncio
import signal

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.e2e.helpers import connect, mongo_docs, mongo_docs_soon, mysql_rows, post, receive
from harness.system import System, private_system
from tests.timing import PATIENCE, eventually

DB_TIMEOUT_SECONDS = 1


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    """Databases of this module alone: the tests stop and restart them."""
    with private_system(tmp_path_factory.mktemp("faults"), CHAT_DB_TIMEOUT_SECONDS=DB_TIMEOUT_SECONDS,
                        CHAT_RATE_LIMIT_PER_SECOND=0) as system:
        yield system


def logged(system: System, event: str) -> list[str]:
    """The lines of the API process's log (it writes for itself here) that record ``event``."""
    text = (system.logdir / "api_0.log").read_text(errors="replace")
    return [line for line in text.splitlines() if f"event={event} " in line]


def writer_lock_free(system: System) -> bool:
    """No writer turn is under way (the API process's writer holds `chat.writer` for each)."""
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT IS_USED_LOCK('chat.writer')")).scalar() is None
    finally:
        engine.dispose()


async def test_mysql_down_is_a_fast_503_and_nothing_reaches_mongo(private, users):
    # "Fast" as the client sees it: the answer is a 503 from the API, given
    # while MySQL is still down, not the client giving up (post() waits
    # PATIENCE, far past CHAT_DB_TIMEOUT_SECONDS, and would raise a timeout).
    alice, bob = users("alice"), users("bob")
    private.dbs.mariadb.stop()
    try:
        r = await post(private, alice, bob, "while mysql is down")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"] == "mysql_unavailable"
        assert mongo_docs(private, {"from": alice}) == []
        ready = httpx.get(f"{private.api_url}/readyz", timeout=PATIENCE)
        assert ready.status_code == 503 and ready.json()["checks"]["mysql"].startswith("down")
    finally:
        private.dbs.mariadb.start()

    # recovers by itself: the same message, retried as a client does, is stored once
    async def stored() -> bool:
        return (await post(private, alice, bob, "back", "back-1")).status_code in (200, 201)

    await eventually(stored, "a POST stored once MySQL is back")
    assert [row.body for row in mysql_rows(private, "sender = :s", s=alice)] == ["back"]


async def test_a_writer_lock_held_elsewhere_is_a_503_partition_busy_not_a_hang(private, users):
    """A writer lock held elsewhere (another host's writer, a stuck transaction): the
    answer names the lock, not MySQL, which is fine."""
    alice, bob = users("alice"), users("bob")
    engine = create_engine(private.dbs.mariadb.url())
    with engine.connect() as blocker:
        assert blocker.execute(text("SELECT GET_LOCK('chat.writer', 5)")).scalar() == 1
        r = await post(private, alice, bob, "blocked")
        # answered while the lock is still held (it is released only below): the
        # writer gave up at its lock timeout instead of waiting for the lock
        assert (r.status_code, r.json()["error"]) == (503, "partition_busy"), r.text
        assert r.headers["retry-after"] == "1"
        blocker.execute(text("SELECT RELEASE_LOCK('chat.writer')"))
    engine.dispose()
    assert mysql_rows(private, "sender = :s", s=alice) == []
    assert (await post(private, alice, bob, "unblocked")).status_code == 201


async def test_mongo_down_after_mysql_commit_loses_nothing(private, users):
    alice, bob = users("alice"), users("bob")
    ws, hello = await connect(private, bob)
    try:
        private.dbs.ferretdb.stop()
        try:
            r = await post(private, alice, bob, "during the outage")
            assert r.status_code == 201  # committed to MySQL: the outbox will deliver it
            [row] = mysql_rows(private, "sender = :s", s=alice)
            assert str(row.id) == r.json()["id"]
        finally:
            private.dbs.ferretdb.start()
        after = await post(private, alice, bob, "after the outage")
        assert after.status_code == 201
        frames = await receive(ws, 2)
        assert [f["body"] for f in frames] == ["during the outage", "after the outage"]
        # delivered (from MySQL if need be); the outbox repair copies both to Mongo
        assert len(await mongo_docs_soon(private, {"from": alice}, 2)) == 2
    finally:
        await ws.close()


async def test_a_hung_mongo_does_not_hold_the_next_answer(private, users):
    """The 201 waits for the MySQL commit, not for Mongo: with FerretDB hung
    (SIGSTOP), a message is answered while the one before it is still being
    inserted (that insert's deadline is 1 s here), and the messages after it,
    each in a writer turn of its own, wait through one such deadline at most:
    every Mongo call the writer waits for ends at its own deadline (the outbox
    repair's read used to wait out the driver's 5 s socket timeout, in every
    turn, under the lock all API processes share). All reach Mongo, in order,
    once it is back (the outbox repair). The API process's log says when the
    writer gave up on Mongo: the order of that and the answers is the proof,
    not a stopwatch."""
    alice, bob = users("alice"), users("bob")
    ferretdb = private.dbs.ferretdb.proc
    later = [f"later {i}" for i in range(5)]
    failed_before, repairs_before = len(logged(private, "mongo_write_failed")), len(logged(private, "outbox_repair"))
    ferretdb.send_signal(signal.SIGSTOP)
    try:
        first = await post(private, alice, bob, "first while hung")
        second = await post(private, alice, bob, "second while hung")
        assert (first.status_code, second.status_code) == (201, 201)
        # answered before the writer gave up on the first one's insert: it did not wait for it
        assert len(logged(private, "mongo_write_failed")) == failed_before
        await eventually(lambda: len(logged(private, "mongo_write_failed")) > failed_before,
                         "the writer giving up on the hung insert at its deadline")
        for body in later:
            if body == later[-1]:
                # a turn that retries the outbox, past the retry window: the last message meets it
                await eventually(lambda: len(logged(private, "outbox_repair")) > repairs_before,
                                 "a later turn trying the outbox again")
            else:
                await eventually(lambda: asyncio.to_thread(writer_lock_free, private),
                                 "the last message's writer turn over: the next one has a turn of its own")
            gave_up = len(logged(private, "mongo_write_failed"))
            r = await post(private, alice, bob, body)
            assert r.status_code == 201, r.text
            assert len(logged(private, "mongo_write_failed")) - gave_up <= 1, "it waited through more than one deadline"
    finally:
        ferretdb.send_signal(signal.SIGCONT)
    failures = logged(private, "mongo_write_failed")[failed_before:]
    assert failures and all("error=TimeoutError " in line for line in failures), failures  # the writer's deadline
    bodies = ["first while hung", "second while hung", *later]
    docs = await mongo_docs_soon(private, {"from": alice}, len(bodies))
    assert [d["body"] for d in docs] == bodies
    assert [r.body for r in mysql_rows(private, "sender = :s", s=alice)] == [d["body"] for d in docs]


async def test_api_killed_mid_request_then_retried_stores_each_message_once(private, users):
    alice, bob = users("alice"), users("bob")
    ids = [f"k{i}" for i in range(60)]
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        inflight = []
        for k in ids:
            inflight.append(asyncio.create_task(post(private, alice, bob, f"body {k}", k, client=client)))
            if len(inflight) == 10:
                # the first ones stored: the kill comes with the next ones on their way or still to be sent
                await eventually(lambda: asyncio.to_thread(mysql_rows, private, "sender = :s", s=alice),
                                 "the first messages stored")
                killing = asyncio.create_task(asyncio.to_thread(private.stop, "api_0", signal.SIGKILL))
        await killing
        await asyncio.gather(*inflight, return_exceptions=True)
    private.start("api_0")
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        replies = await asyncio.gather(*[post(private, alice, bob, f"body {k}", k, client=client) for k in ids])
    assert all(r.status_code in (200, 201) for r in replies)
    rows = mysql_rows(private, "sender = :s", s=alice)
    assert sorted(r.client_msg_id for r in rows) == sorted(ids)
    # the outbox repair copies anything the kill cut off
    docs = await mongo_docs_soon(private, {"from": alice}, len(ids))
    assert sorted(d["client_msg_id"] for d in docs) == sorted(ids)
