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
from harness.system import System, databases
from tests.timing import PATIENCE, eventually


def echoes_owed_to(system: System, partition: int) -> list:
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            return conn.execute(text("SELECT from_part, from_id FROM echoes WHERE to_part = :p ORDER BY from_id"),
                                {"p": partition}).all()
    finally:
        engine.dispose()


async def nothing_more_on_each(system: System, sockets: list, user: str, partition: int) -> None:
    """No frame more on any of ``user``'s ``sockets`` before a marker from ``user``
    to a peer of the same partition (``nothing_more`` on the first socket; the
    others get that same marker, and nothing before it)."""
    first, *others = sockets
    assert await nothing_more(system, first, user, user_in(partition, "peer")) == []
    for ws in others:
        assert [f["body"] for f in await receive(ws, 1)] == ["marker"]


@pytest.fixture(scope="module")
def two_partitions(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("writer-kill"), partitions=2) as dbs:
        yield dbs


@pytest.fixture(scope="module")
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
        # Waited for: partition 1's writer takes its lock for a moment each second while idle
        # (a turn that drains leftover copies); asked with no wait, one such turn refused it.
        assert holder.execute(text("SELECT GET_LOCK(:n, :t)"), {"n": lock_name(1), "t": PATIENCE}).scalar() == 1
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
    # later turns of partition 1's writer, each draining what echoes are left: still once
    await nothing_more_on_each(front, anns, ann, 0)
    await nothing_more_on_each(front, bens, ben, 1)
    for ws in anns + bens:
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
        await asyncio.sleep(0.05)  # pacing: a client's retries
    raise AssertionError(f"{body} never stored")


async def test_messages_sent_while_the_writer_is_killed_reach_each_device_once(hosted):
    front, daemon = hosted
    cy, dee = user_in(0, "cy"), user_in(1, "dee")
    cys = [(await connect(daemon, cy))[0] for _ in range(2)]
    dees = [(await connect(daemon, dee))[0] for _ in range(2)]
    count = 60
    stored: list[dict] = []

    async def sending() -> None:
        async with httpx.AsyncClient(timeout=PATIENCE) as client:
            for n in range(count):
                stored.append(await post_until_stored(front, cy, dee, f"m{n}", client))

    task = asyncio.create_task(sending())
    await eventually(lambda: len(stored) >= 10, "ten messages stored")
    # mid-stream: some stored, the next one on its way (the sender waits for each answer);
    # in threads, so that the sender goes on (and retries) while the writer is away
    await asyncio.to_thread(front.stop, "writer", signal.SIGKILL)
    assert len(stored) < count
    await asyncio.to_thread(front.start, "writer")
    await asyncio.wait_for(task, 2 * PATIENCE)
    assert len({m["id"] for m in stored}) == count  # one message per body, whatever the retries
    for ws in cys + dees:
        frames = await receive(ws, count)
        assert sorted(f["body"] for f in frames) == sorted(f"m{n}" for n in range(count))
        assert len({f["id"] for f in frames}) == count
    await nothing_more_on_each(front, cys, cy, 0)
    await nothing_more_on_each(front, dees, dee, 1)
    for ws in cys + dees:
        await ws.close()
    assert len(rows_of(front, 1, cy)) == count and echoes_owed_to(front, 1) == []
