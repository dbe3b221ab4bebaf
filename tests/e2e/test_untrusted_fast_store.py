"""The fast store is not the truth, as deployed (a writer process, a relay,
two daemons) on the real MariaDB and FerretDB:
- a document that the writer did not write (a script, a restore, another
  app) is logged, counted and skipped by every daemon: no crash, no move of
  the stream position, no message lost after it;
- one at the id the writer is about to use reaches no device: they all get
  MySQL's message, and the writer puts it in the stray's place;
- while the fast store is down, the daemons deliver what MySQL has
  committed, and nothing twice once it is back and the outbox is copied."""

from datetime import datetime

import httpx
import pymongo
import pytest
from sqlalchemy import create_engine, text

from chat.messages import now_ms
from db import mongo
from tests.e2e.helpers import connect, mongo_docs, mongo_docs_soon, mysql_rows, nothing_more, post, receive
from harness.system import private_system
from tests.timing import eventually


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    with private_system(tmp_path_factory.mktemp("untrusted"), daemons=2, writer=True, relay=True,
                        CHAT_DB_TIMEOUT_SECONDS=1, CHAT_RATE_LIMIT_PER_SECOND=0) as system:
        yield system


def _insert_directly(system, *docs: dict) -> None:
    client = pymongo.MongoClient(system.dbs.ferretdb.url, tz_aware=True)
    try:
        client.chat[mongo.MESSAGES].insert_many(list(docs))
    finally:
        client.close()


def _committed_head(system) -> int:
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT COALESCE(MAX(id), 0) FROM messages")).scalar_one())
    finally:
        engine.dispose()


def _daemon_logs(system) -> str:
    return "".join((system.logdir / f"daemon_{i}.log").read_text() for i in range(2))


async def _both_daemons_healthy(system) -> None:
    assert all(system.procs[f"daemon_{i}"].poll() is None for i in range(2)), "a daemon exited"
    pids = set()
    async with httpx.AsyncClient() as client:
        for _ in range(40):  # any daemon may answer on the shared port
            r = await client.get(f"{system.poll_url.rsplit('/v1', 1)[0]}/healthz", headers={"connection": "close"})
            assert r.status_code == 200 and r.json()["status"] == "ok"
            pids.add(r.json()["pid"])
    assert len(pids) == 2


async def test_a_stray_document_with_a_far_id_moves_no_position_and_loses_nothing(deployed, users):
    alice, bob = users("alice"), users("bob")
    ws, _hello = await connect(deployed, bob)
    try:
        first = await post(deployed, alice, bob, "before the stray")
        assert [f["body"] for f in await receive(ws, 1)] == ["before the stray"]
        created = first.json()["created_at"].replace("Z", "+00:00")
        _insert_directly(deployed, {"_id": 10**12, "from": alice, "to": bob, "body": "not the writer's",
                                    "created_at": datetime.fromisoformat(created)})
        bodies = [f"after the stray {i}" for i in range(30)]
        for body in bodies:
            assert (await post(deployed, alice, bob, body)).status_code == 201
        got = await receive(ws, len(bodies))
        assert [f["body"] for f in got] == bodies
        assert await nothing_more(deployed, ws, bob) == []  # the stray is never pushed
        assert "event=stray_document reason=past_committed_head" in _daemon_logs(deployed)
        # the position is the committed head, not 10**12
        async with httpx.AsyncClient() as client:
            r = await client.get(f"{deployed.poll_url.rsplit('/v1', 1)[0]}/healthz")
        assert int(r.json()["position"]) <= _committed_head(deployed)
    finally:
        await ws.close()
    await _both_daemons_healthy(deployed)


async def test_a_stray_document_at_the_writer_s_next_id_reaches_no_device_and_is_replaced(deployed, users):
    alice, bob = users("alice"), users("bob")
    devices = [(await connect(deployed, user))[0] for user in (bob, bob, alice, alice)]
    try:
        head = _committed_head(deployed)
        _insert_directly(deployed, {"_id": head + 1, "from": "mallory", "to": bob, "body": "forged by mallory",
                                    "created_at": now_ms(), "client_msg_id": None})
        answer = await post(deployed, alice, bob, "the real message")
        assert answer.status_code == 201
        assert int(answer.json()["id"]) == head + 1  # the id the stray took
        real = [(str(head + 1), alice, bob, "the real message")]
        for ws in devices:  # the recipient's two and the sender's two
            assert [(f["id"], f["from"], f["to"], f["body"]) for f in await receive(ws, 1)] == real
        resumed, hello = await connect(deployed, bob, since=str(head))
        devices.append(resumed)
        assert hello["recovered"] is True
        assert [(f["id"], f["from"], f["to"], f["body"]) for f in await receive(resumed, 1)] == real
        rows = mysql_rows(deployed, "id = :id", id=head + 1)
        assert [(r.sender, r.recipient, r.body) for r in rows] == [(alice, bob, "the real message")]
        # the writer met the stray at its insert and put MySQL's message in its place, loudly
        await eventually(lambda: [(d["from"], d["body"]) for d in mongo_docs(deployed, {"_id": head + 1})]
                         == [(alice, "the real message")], "the fast store holding the real message")
        logged = f"event=stray_document reason=differs_from_mysql source=writer partition=0 count=1 ids=[{head + 1}]"
        await eventually(lambda: logged in (deployed.logdir / "writer.log").read_text(), "the writer's stray_document")
    finally:
        for ws in devices:
            await ws.close()
    await _both_daemons_healthy(deployed)


async def test_the_writer_s_own_messages_pass_the_check_as_they_came(deployed, users):
    # Every batch a daemon takes from the oplog is checked against MySQL's rows
    # before it goes out: the writer's own messages, whatever their text, are
    # never taken for strays.
    alice, bob = users("alice"), users("bob")
    ws, _hello = await connect(deployed, bob)
    ids = set()
    try:
        sent = [("plain", None), ("é 🙂 <b>\u202e</b> \x1f\n\t\\", "c.1:x-Y_"), ("x" * 3000, None)]
        for body, client_msg_id in sent:
            r = await post(deployed, alice, bob, body, client_msg_id)
            assert r.status_code == 201
            ids.add(int(r.json()["id"]))
        assert [(f["body"], f["client_msg_id"]) for f in await receive(ws, len(sent))] == sent
    finally:
        await ws.close()
    # None of these ids was taken for a stray (the test before this one plants a stray at an id of
    # the writer's, which a daemon may log as it passes, at a moment of its own: only ids say whose).
    flagged = set()
    for line in _daemon_logs(deployed).splitlines():
        if "reason=differs_from_mysql" in line:
            flagged |= {int(i) for i in line.split("ids=[", 1)[1].split("]", 1)[0].split(",") if i.strip()}
    assert not flagged & ids


async def test_documents_not_in_the_writer_s_shape_crash_no_daemon(deployed, users):
    alice, bob = users("alice"), users("bob")
    ws, _hello = await connect(deployed, bob)
    try:
        _insert_directly(deployed, {"_id": "not-a-number", "from": alice, "to": bob, "body": "x"},
                         {"_id": 2.5, "from": alice, "to": bob, "body": "x"},
                         {"_id": 10**11, "from": alice, "to": bob})  # no body, no created_at
        bodies = [f"after the odd documents {i}" for i in range(10)]
        for body in bodies:
            assert (await post(deployed, alice, bob, body)).status_code == 201
        assert [f["body"] for f in await receive(ws, len(bodies))] == bodies
        assert await nothing_more(deployed, ws, bob) == []
        assert "event=stray_document reason=shape" in _daemon_logs(deployed)
    finally:
        await ws.close()
    await _both_daemons_healthy(deployed)
    # a client resuming over the odd documents gets exactly its messages
    ws, hello = await connect(deployed, bob, since="0")
    try:
        assert hello["recovered"] is True
        assert [f["body"] for f in await receive(ws, len(bodies))] == bodies
        # bob's own marker from the barrier above, and nothing else, comes before the next one
        assert [f["body"] for f in await nothing_more(deployed, ws, bob)] == ["marker"]
    finally:
        await ws.close()


async def test_while_the_fast_store_is_down_committed_messages_are_delivered_from_mysql(deployed, users):
    alice, bob = users("alice"), users("bob")
    ws, _hello = await connect(deployed, bob)
    try:
        deployed.dbs.ferretdb.stop()
        try:
            bodies = [f"while the fast store is down {i}" for i in range(5)]
            for body in bodies:
                assert (await post(deployed, alice, bob, body)).status_code == 201  # committed to MySQL
            # delivered while the fast store is still down: from MySQL, not after the outage
            got = await receive(ws, len(bodies))
            assert [f["body"] for f in got] == bodies
        finally:
            deployed.dbs.ferretdb.start()
        after = await post(deployed, alice, bob, "after the outage")
        assert after.status_code == 201
        assert [f["body"] for f in await receive(ws, 1)] == ["after the outage"]
        # the writer copies the outbox into the fast store; the daemons see it
        # in the oplog and drop it as repeats
        docs = await mongo_docs_soon(deployed, {"from": alice}, len(bodies) + 1)
        assert [d["body"] for d in docs] == [*bodies, "after the outage"]
        # the marker's oplog entry comes after the copies': any repeat delivered would come first
        assert await nothing_more(deployed, ws, bob) == []
    finally:
        await ws.close()
