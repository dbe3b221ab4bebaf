"""A grow done the documented way (docs/operations.md), end to end: the
writer and the API stopped, `chatctl partitions grow 3`, the writer and the
API restarted, messages through POST /v1/messages, the writer process,
MariaDB, FerretDB, the relay and a daemon serving every partition.

At its gap check the daemon reads the map's epoch, and keeps running: it
closes with 1012 the sockets of the users whose slot moved only, builds the
stream of the partition it now serves too (partition 2), and serves it,
typing included, in the same process. A moved user's old cursor gets
``recovered: false``; the others' sockets stay open and keep receiving.
"""

import asyncio
import subprocess
import sys

import httpx
import orjson
import pytest

from chat.partitions import SlotMap
from tests.e2e.helpers import connect, nothing_more, post, receive, until_closed
from tests.e2e.test_partitioned_delivery import user_in
from harness.servers import ROOT
from harness.system import System, databases, running_system
from tests.timing import PATIENCE, S, eventually

TWO, THREE = SlotMap.even(2), SlotMap.even(3)


async def until_released(system: System, position: str) -> None:
    """Until the daemon has released partition 0's messages up to ``position``."""
    async with httpx.AsyncClient(timeout=10 * S) as client:
        async def released() -> bool:
            health = await client.get(f"http://127.0.0.1:{system.daemon_port}/healthz")
            return health.json()["position"] == position

        await eventually(released, f"the daemon released partition 0 up to {position}")


def staying_in(partition: int, name: str) -> str:
    """A fresh user of ``partition`` whose slot growing to three partitions leaves there."""
    while THREE.partition_of(user := user_in(partition, name)) != partition:
        pass
    return user


def moving(from_part: int, to: int, name: str) -> str:
    """A fresh user of ``from_part`` whose slot growing to three partitions gives to ``to``."""
    while THREE.partition_of(user := user_in(from_part, name)) != to:
        pass
    return user


@pytest.fixture
def two_partitions(tmp_path):
    with databases(tmp_path, partitions=2) as dbs:
        yield dbs


def log_of(system: System) -> str:
    return (system.logdir / "daemon_0.log").read_text()


async def next_of(ws, kind: str) -> dict:
    while (frame := (await receive(ws, 1))[0])["type"] != kind:
        pass
    return frame


async def test_a_grow_hands_the_moved_users_over_and_the_same_daemon_serves_the_new_partition(two_partitions):
    with running_system(two_partitions, daemons=1, apis=1, writer=True, relay=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                        CHAT_GAP_CHECK_SECONDS="0.3") as system:
        mover, newcomer = moving(0, 1, "mover"), moving(1, 2, "newcomer")
        stayer, friend = staying_in(0, "stayer"), staying_in(0, "friend")
        daemon_pid = system.procs["daemon_0"].pid
        for to in (mover, stayer):
            assert (await post(system, friend, to, f"to {to}")).status_code == 201
        await until_released(system, "2")
        ws_mover, hello_mover = await connect(system, mover)
        ws_stayer, hello_stayer = await connect(system, stayer)
        ws_newcomer, hello_newcomer = await connect(system, newcomer)
        assert hello_mover["cursor"] == hello_stayer["cursor"] == "2"  # partition 0, epoch 0: a bare id
        assert hello_newcomer["cursor"] == "1.0.0"

        system.stop("api_0")  # the documented grow: writers (and what writes) stopped first
        system.stop("writer")
        grown = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "chatctl.cli", "partitions", "grow", "3"], env=system.env,
            cwd=ROOT, capture_output=True, text=True, timeout=PATIENCE)
        assert grown.returncode == 0, grown.stderr
        assert "epoch 1, 3 partitions" in grown.stdout.splitlines()
        for ws in (ws_mover, ws_newcomer):  # whose slots moved: nothing more for them here, and 1012
            assert await until_closed(ws) == []
            assert ws.close_code == 1012
        await eventually(lambda: "event=slot_map_moved epoch=0 new_epoch=1 moved_users_closed=2 sockets=2 polls=0 "
                                 "action=handed_over new_partitions=2" in log_of(system), "the hand-over's line")
        await eventually(lambda: "event=typing_listening partitions=0,1,2" in log_of(system),
                         "the daemon listens to partition 2's typing")

        system.start("writer")  # the writer and the API on the new map; the relay tails every partition
        system.start("api_0")
        meanwhile = await post(system, friend, stayer, "while the others moved")  # both stayed in partition 0
        assert meanwhile.status_code == 201
        [frame] = await receive(ws_stayer, 1)  # on the socket it never had to leave
        position = meanwhile.json()["id"]
        assert (frame["body"], frame["id"], frame["cursor"]) == ("while the others moved", position, f"0.1.{position}")

        # The moved users back with their old cursors, at the same daemon: each in its new partition,
        # partition 2 on the stream the daemon built when it saw the grown map.
        ws_mover, hello = await connect(system, mover, hello_mover["cursor"])
        assert hello["recovered"] is False and hello["cursor"] == "1.1.1"  # its history moved: 1 message
        ws_newcomer, hello = await connect(system, newcomer, hello_newcomer["cursor"])
        assert hello["recovered"] is False and hello["cursor"] == "2.1.0"
        for user, ws, cursor in ((newcomer, ws_newcomer, "2.1.1"), (mover, ws_mover, "1.1.2")):
            sent = await post(system, friend, user, f"after the move, to {user}")  # written in 0, copied
            assert sent.status_code == 201
            [frame] = await receive(ws, 1)
            assert (frame["body"], frame["cursor"]) == (f"after the move, to {user}", cursor)
        ws_friend, _ = await connect(system, friend)
        await ws_friend.send(orjson.dumps({"type": "typing", "to": newcomer}).decode())
        assert (await next_of(ws_newcomer, "typing"))["from"] == friend

        assert system.procs["daemon_0"].poll() is None
        health = httpx.get(f"http://127.0.0.1:{system.daemon_port}/healthz", timeout=10 * S).json()
        assert health["pid"] == daemon_pid and health["status"] == "ok"
        assert sorted(health["partitions"]) == ["0", "1", "2"]
        # Nothing more for any of them: each user's marker travels the stream a repeat or a stray
        # to it would (its own partition's, and partition 0's, where the originals were written).
        assert await nothing_more(system, ws_stayer, stayer, peer=friend) == []
        assert await nothing_more(system, ws_mover, mover, peer=user_in(1, "peer", THREE)) == []
        assert await nothing_more(system, ws_newcomer, newcomer, peer=user_in(2, "peer", THREE)) == []
        for ws in (ws_mover, ws_stayer, ws_newcomer, ws_friend):
            await ws.close()
