"""A daemon whose slot map changes keeps running and hands over only the
moved users, end to end: POST /v1/messages, the writer process, MariaDB,
FerretDB, the relay, and one daemon serving partitions 0 and 1.

The test writes the moved map into MySQL itself (``db.partition_map``), as a
mover's cutover does: once it is written, the old partition commits nothing
more for the moved users, and the test posts nothing more to them. The relay
is stopped first, so that what was committed just before the map reaches the
daemon only from MySQL (its gap check, or the hand-over's own read): a
daemon that closed the moved users' sockets on seeing the map would close
them before it.
"""

import asyncio

import httpx
import pytest
from sqlalchemy import create_engine, text

from chat.partitions import SlotMap, slot_of
from db.partition_map import read_slot_map, write_slot_map
from harness.system import System, databases, running_system
from tests.e2e.helpers import connect, post, receive, until_closed
from tests.e2e.test_partitioned_delivery import user_in
from tests.timing import PATIENCE, S, eventually

TWO = SlotMap.even(2)


@pytest.fixture
def two_partitions(tmp_path):
    with databases(tmp_path, partitions=2) as dbs:
        yield dbs


def users_of_partition_0(count: int) -> list[str]:
    """``count`` fresh users of partition 0, each in a slot of its own."""
    users: list[str] = []
    while len(users) < count:
        user = user_in(0, f"u{len(users)}")
        if slot_of(user) not in {slot_of(u) for u in users}:
            users.append(user)
    return users


def write_map(system: System, change) -> SlotMap:
    """``change`` of the map MySQL holds, written in one transaction, as a cutover writes it."""
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.begin() as conn:
            current = read_slot_map(conn)
            assert current is not None
            new = change(current)
            write_slot_map(conn, new)
        return new
    finally:
        engine.dispose()


def ids_to(system: System, user: str) -> list[str]:
    """The ids of the messages to ``user`` in partition 0's MySQL table."""
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id FROM messages WHERE recipient = :u ORDER BY id"), {"u": user}).all()
        return [str(row.id) for row in rows]
    finally:
        engine.dispose()


async def polls_waiting(system: System) -> float:
    async with httpx.AsyncClient(timeout=10 * S) as client:
        metrics = (await client.get(f"http://127.0.0.1:{system.daemon_port}/metrics")).text
    for line in metrics.splitlines():
        if line.startswith('chat_daemon_connections{kind="poll"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_moved_user_gets_what_was_committed_then_1012_and_the_daemon_keeps_serving_the_rest(two_partitions):
    with running_system(two_partitions, daemons=1, apis=1, writer=True, relay=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                        CHAT_GAP_CHECK_SECONDS="0.3", CHAT_DRAIN_SECONDS=str(PATIENCE)) as system:
        mover, poller, stayer, friend = users_of_partition_0(4)
        daemon_pid = system.procs["daemon_0"].pid
        ws_mover, hello_mover = await connect(system, mover)
        ws_stayer, _ = await connect(system, stayer)
        assert hello_mover["cursor"] == "0"  # partition 0 at epoch 0: a bare id
        async with httpx.AsyncClient(timeout=2 * PATIENCE) as client:
            # A long-poll of another moved user, waiting for as long as a poll may.
            poll = asyncio.create_task(client.get(f"{system.poll_url}?timeout=30&token={system.token(poller)}"))
            await eventually(lambda: polls_waiting(system), "the poll waits at the daemon")

            system.stop("relay")  # from here on, the daemon learns of new rows from MySQL only
            for n in range(3):
                assert (await post(system, friend, mover, f"to the mover {n}")).status_code == 201
            assert (await post(system, friend, stayer, "to the stayer")).status_code == 201
            moved = write_map(system, lambda current: current.move([slot_of(mover), slot_of(poller)], 1))
            assert moved.epoch == 1

            # The mover: every row committed for it before the map, in order, then 1012.
            frames = await until_closed(ws_mover)
            assert [f["id"] for f in frames] == ids_to(system, mover) and len(frames) == 3
            assert [f["cursor"] for f in frames] == [f["id"] for f in frames]
            assert ws_mover.close_code == 1012
            # The poller's wait is answered, and what it answered no longer resumes.
            answer = await poll
            assert answer.status_code == 200 and answer.json()["messages"] == []
            again = await client.get(f"{system.poll_url}?timeout=0&token={system.token(poller)}"
                                     f"&since={answer.json()['cursor']}")
            assert again.json()["recovered"] is False and again.json()["cursor"].startswith("1.1.")

        # The stayer's socket stays open: what was sent before, and after, reaches it.
        [before] = await receive(ws_stayer, 1)
        assert before["body"] == "to the stayer"
        system.start("relay")
        after = await post(system, friend, stayer, "after the move")
        [frame] = await receive(ws_stayer, 1)
        assert (frame["body"], frame["cursor"]) == ("after the move", f"0.1.{after.json()['id']}")

        # The same process all along, and the mover back with its old cursor: partition 1 serves
        # it, and the cursor, made in partition 0 before its slot moved, does not resume.
        assert system.procs["daemon_0"].poll() is None
        health = httpx.get(f"http://127.0.0.1:{system.daemon_port}/healthz", timeout=10 * S).json()
        assert health["pid"] == daemon_pid and health["status"] == "ok"
        ws_mover, hello = await connect(system, mover, frames[-1]["cursor"])
        assert hello["recovered"] is False and hello["cursor"].startswith("1.1.")
        log = (system.logdir / "daemon_0.log").read_text()
        assert ("event=slot_map_moved epoch=0 new_epoch=1 moved_users_closed=2 sockets=1 polls=1 "
                "action=handed_over") in log
        for ws in (ws_mover, ws_stayer):
            await ws.close()
