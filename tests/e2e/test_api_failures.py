"""Failure semantics of the write API, against real servers that the test
stops, blocks and kills: MySQL down or slow, Mongo down after the MySQL
commit, and the API process killed mid-request."""

import asyncio
import signal
import time

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.e2e.helpers import connect, mongo_docs, mongo_docs_soon, mysql_rows, post, receive
from tests.system import private_system


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    """Databases of this module alone: the tests stop and restart them."""
    with private_system(tmp_path_factory.mktemp("faults"), CHAT_DB_TIMEOUT_SECONDS=1,
                        CHAT_RATE_LIMIT_PER_SECOND=0) as system:
        yield system


async def test_mysql_down_is_a_fast_503_and_nothing_reaches_mongo(private, users):
    alice, bob = users("alice"), users("bob")
    private.dbs.mariadb.stop()
    try:
        started = time.monotonic()
        r = await post(private, alice, bob, "while mysql is down")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert time.monotonic() - started < 3
        assert r.json()["error"] == "mysql_unavailable"
        assert mongo_docs(private, {"from": alice}) == []
        ready = httpx.get(f"{private.api_url}/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["mysql"].startswith("down")
    finally:
        private.dbs.mariadb.start()
    # recovers by itself
    deadline = time.monotonic() + 15
    while (r := await post(private, alice, bob, "back")).status_code != 201:
        assert time.monotonic() < deadline, r.text
        await asyncio.sleep(0.2)
    assert [row.body for row in mysql_rows(private, "sender = :s", s=alice)] == ["back"]


async def test_mysql_slow_is_a_503_not_a_hang(private, users):
    """A writer lock held elsewhere (a stuck transaction) stands in for a slow MySQL."""
    alice, bob = users("alice"), users("bob")
    engine = create_engine(private.dbs.mariadb.url())
    with engine.connect() as blocker:
        assert blocker.execute(text("SELECT GET_LOCK('chat.writer', 5)")).scalar() == 1
        started = time.monotonic()
        r = await post(private, alice, bob, "blocked")
        assert r.status_code == 503 and time.monotonic() - started < 4
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
        frames = await receive(ws, 2, timeout=30)
        assert [f["body"] for f in frames] == ["during the outage", "after the outage"]
        assert len(mongo_docs(private, {"from": alice})) == 2
    finally:
        await ws.close()


async def test_a_hung_mongo_does_not_hold_the_next_answer(private, users):
    """The 201 waits for the MySQL commit, not for Mongo: with FerretDB hung
    (SIGSTOP), a message is answered while the one before it is still being
    inserted (that insert's timeout is 1 s here), and the messages after it,
    in later writer sessions, wait at most one such timeout (the outbox
    repair's read used to wait out the 5 s socket timeout in every session,
    under the lock all API processes share). All reach Mongo, in order, once
    it is back (the outbox repair)."""
    alice, bob = users("alice"), users("bob")
    ferretdb = private.dbs.ferretdb.proc
    bodies = ["first while hung", "second while hung", *(f"later {i}" for i in range(5))]
    answered = []
    ferretdb.send_signal(signal.SIGSTOP)
    try:
        for body in bodies:
            started = time.monotonic()
            r = await post(private, alice, bob, body)
            answered.append((r.status_code, round(time.monotonic() - started, 3)))
            await asyncio.sleep(0.5 if body.startswith("later") else 0)  # each one a session of its own
    finally:
        ferretdb.send_signal(signal.SIGCONT)
    assert [code for code, _ in answered] == [201] * len(bodies), answered
    assert answered[1][1] < 0.5, answered  # it did not wait out the first insert
    assert max(seconds for _, seconds in answered) < 1.8, answered  # one 1 s timeout at most
    docs = await mongo_docs_soon(private, {"from": alice}, len(bodies), timeout=20)
    assert [d["body"] for d in docs] == bodies
    assert [r.body for r in mysql_rows(private, "sender = :s", s=alice)] == [d["body"] for d in docs]


async def test_api_killed_mid_request_then_retried_stores_each_message_once(private, users):
    alice, bob = users("alice"), users("bob")
    ids = [f"k{i}" for i in range(60)]
    async with httpx.AsyncClient(timeout=5) as client:
        inflight = [asyncio.create_task(post(private, alice, bob, f"body {k}", k, client=client)) for k in ids]
        await asyncio.sleep(0.02)
        private.stop("api_0", signal.SIGKILL)
        await asyncio.gather(*inflight, return_exceptions=True)
    private.start("api_0")
    async with httpx.AsyncClient(timeout=10) as client:
        replies = await asyncio.gather(*[post(private, alice, bob, f"body {k}", k, client=client) for k in ids])
    assert all(r.status_code in (200, 201) for r in replies)
    rows = mysql_rows(private, "sender = :s", s=alice)
    assert sorted(r.client_msg_id for r in rows) == sorted(ids)
    deadline = time.monotonic() + 10  # the outbox repair copies anything the kill cut off
    while len(docs := mongo_docs(private, {"from": alice})) < len(ids):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    assert sorted(d["client_msg_id"] for d in docs) == sorted(ids)
