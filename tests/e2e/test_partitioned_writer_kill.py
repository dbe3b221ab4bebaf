"""A writer process killed (SIGKILL) between a message's home commit and its copy,
end to end with two partitions: POST /v1/messages, the writer process, MariaDB,
FerretDB, the relay and a daemon serving both partitions.

The home commit leaves an ``echoes`` row for the copy it owes; the restarted
writer drains it into one copy. The recipient's devices get every message
exactly once, the sender's too.
"""

import asyncio
import signal
import uuid

import httpx
import pytest
from sqlalchemy import create_engine, text

from chat.partitions import lock_name
from tests.e2e.helpers import connect, nothing_more, post, receive
from tests.e2e.test_partitioned_delivery import daemon_serving, rows_of, user_in, writing_system
from tests.system import System, databases


def echoes_owed_to(system: System, partition: int) -> list:
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT from_part, from_id FROM echoes WHERE to_part = :p ORDER BY from_id"),
                                {"p": partition}).all()
    finally:
        engine.dispose()


@pytest.fixture
def two_partitions(tmp_path):
    with databases(tmp_path, partitions=2) as dbs:
        yield dbs


@pytest.fixture
def hosted(two_partitions):
    """The write path and one daemon of both partitions behind the relay."""
    dbs = two_partitions
    with writing_system(dbs) as front, \
            daemon_serving(dbs, "", CHAT_OPLOG_RELAY_SOCKET=front.env["CHAT_OPLOG_RELAY_SOCKET"]) as daemon:
        yield front, daemon


async def test_copies_owed_by_a_killed_writer_reach_the_recipient_s_devices_once(hosted):
    front, daemon = hosted
    ann, ben = user_in(0, "ann"), user_in(1, "ben")
    anns = [(await connect(daemon, ann))[0] for _ in range(2)]
    bens = [(await connect(daemon, ben))[0] for _ in range(2)]
    engine = create_engine(front.dbs.mariadb.url())
    holder = engine.connect()
    try:
        # Partition 1's writer cannot take a turn: each home commit in
        # partition 0 is answered, and its copy waits in the writer process.
        assert holder.execute(text("SELECT GET_LOCK(:n, 0)"), {"n": lock_name(1)}).scalar() == 1
        replies = [await post(front, ann, ben, f"m{n}", f"k{n}") for n in range(3)]
        assert [r.status_code for r in replies] == [201] * 3
        home_ids = [int(r.json()["id"]) for r in replies]
        for ws in anns:
            assert [f["body"] for f in await receive(ws, 3)] == ["m0", "m1", "m2"]
        front.stop("writer", signal.SIGKILL)  # between the home commits and their copies
    finally:
        holder.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": lock_name(1)})
        holder.close()
        engine.dispose()
    assert [tuple(e) for e in echoes_owed_to(front, 1)] == [(0, i) for i in home_ids]  # what the kill left
    assert rows_of(front, 1, ann) == []

    front.start("writer")  # supervisord's restart: partition 1's writer drains the echoes
    for ws in bens:
        frames = await receive(ws, 3)
        assert [f["body"] for f in frames] == ["m0", "m1", "m2"]
        assert all(f["cursor"] == f"1.0.{f['id']}" for f in frames)
    copies = rows_of(front, 1, ann)
    assert [(r.origin_part, r.origin_id) for r in copies] == [(0, i) for i in home_ids]
    assert echoes_owed_to(front, 1) == []
    later = await post(front, ann, ben, "after the restart")
    assert later.status_code == 201
    for ws in anns + bens:
        assert [f["body"] for f in await receive(ws, 1)] == ["after the restart"]
        assert await nothing_more(ws, 1.5)  # idle drains come and go: still once
        await ws.close()


async def post_until_stored(system: System, sender: str, to: str, body: str, client: httpx.AsyncClient) -> dict:
    """As a client does: the same client_msg_id again until the API answers 201 or 200."""
    key = uuid.uuid4().hex
    for _ in range(200):
        try:
            reply = await post(system, sender, to, body, key, client=client)
            if reply.status_code in (200, 201):
                return reply.json()
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{body} never stored")


async def test_messages_sent_while_the_writer_is_killed_reach_each_device_once(hosted):
    front, daemon = hosted
    cy, dee = user_in(0, "cy"), user_in(1, "dee")
    cys = [(await connect(daemon, cy))[0] for _ in range(2)]
    dees = [(await connect(daemon, dee))[0] for _ in range(2)]
    count = 60
    stored: list[dict] = []

    async def sending() -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            for n in range(count):
                stored.append(await post_until_stored(front, cy, dee, f"m{n}", client))

    task = asyncio.create_task(sending())
    async with asyncio.timeout(30):
        while len(stored) < 10:
            await asyncio.sleep(0.005)
    front.stop("writer", signal.SIGKILL)  # mid-stream: some stored, the next ones on their way
    assert len(stored) < count
    await asyncio.sleep(0.3)
    front.start("writer")
    await asyncio.wait_for(task, 60)
    assert len({m["id"] for m in stored}) == count  # one message per body, whatever the retries
    for ws in cys + dees:
        frames = await receive(ws, count, timeout=30)
        assert sorted(f["body"] for f in frames) == sorted(f"m{n}" for n in range(count))
        assert len({f["id"] for f in frames}) == count
        assert await nothing_more(ws, 1.5)
        await ws.close()
    assert len(rows_of(front, 1, cy)) == count and echoes_owed_to(front, 1) == []
