"""The fast store is not the truth, as deployed (a writer process, a relay,
two daemons) on the real MariaDB and FerretDB:
- a document that the writer did not write (a script, a restore, another
  app) is logged, counted and skipped by every daemon: no crash, no move of
  the stream position, no message lost after it;
- while the fast store is down, the daemons deliver what MySQL has
  committed, and nothing twice once it is back and the outbox is copied."""

import asyncio
import time
from datetime import datetime

import httpx
import pymongo
import pytest

from db import mongo
from tests.e2e.helpers import connect, mongo_docs_soon, nothing_more, post, receive
from tests.system import private_system


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
        got = await receive(ws, len(bodies), timeout=20)
        assert [f["body"] for f in got] == bodies
        assert await nothing_more(ws, 1.5)  # the stray is never pushed
        assert "event=stray_document reason=past_committed_head" in _daemon_logs(deployed)
        # the position is the committed head, not 10**12
        async with httpx.AsyncClient() as client:
            r = await client.get(f"{deployed.poll_url.rsplit('/v1', 1)[0]}/healthz")
        assert int(r.json()["position"]) == int(got[-1]["id"])
    finally:
        await ws.close()
    await _both_daemons_healthy(deployed)


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
        assert [f["body"] for f in await receive(ws, len(bodies), timeout=20)] == bodies
        assert await nothing_more(ws, 1.0)
        assert "event=stray_document reason=shape" in _daemon_logs(deployed)
    finally:
        await ws.close()
    await _both_daemons_healthy(deployed)
    # a client resuming over the odd documents gets exactly its messages
    ws, hello = await connect(deployed, bob, since="0")
    try:
        assert hello["recovered"] is True
        assert [f["body"] for f in await receive(ws, len(bodies))] == bodies
        assert await nothing_more(ws, 0.5)
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
            started = time.monotonic()
            got = await receive(ws, len(bodies), timeout=15)
            assert [f["body"] for f in got] == bodies
            waited = time.monotonic() - started
        finally:
            deployed.dbs.ferretdb.start()
        assert waited < 10, waited  # two gap-check periods and a MySQL read, not the outage
        after = await post(deployed, alice, bob, "after the outage")
        assert after.status_code == 201
        assert [f["body"] for f in await receive(ws, 1, timeout=20)] == ["after the outage"]
        # the writer copies the outbox into the fast store; the daemons see it
        # in the oplog and drop it as repeats
        docs = await mongo_docs_soon(deployed, {"from": alice}, len(bodies) + 1, timeout=30)
        assert [d["body"] for d in docs] == [*bodies, "after the outage"]
        await asyncio.sleep(1.5)
        assert await nothing_more(ws, 1.0)
    finally:
        await ws.close()
