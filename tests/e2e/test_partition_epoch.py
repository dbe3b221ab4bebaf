"""A slot move done the documented way (docs/operations.md), end to end: the
writer and the API stopped, `chatctl partitions grow 3`, every process
restarted, messages through POST /v1/messages, the writer process, MariaDB,
FerretDB, the relay and a daemon.

At its gap check the daemon reads the map's epoch. It serves every partition
(``CHAT_DAEMON_PARTITIONS`` empty), so the grown map gives it one it has no
stream for: after the hand-over of the moved users (tests/e2e/test_slot_map_handover.py
has a move the daemon follows in place), it closes every other WebSocket with
1012 and ends the process with status 0 (supervisord starts it again, on the
new map). Back on the new map, a user whose slot moved is told
``recovered: false`` for its old cursor, and a user whose slot stayed resumes
from its cursor with what was sent meanwhile.
"""

import asyncio
import subprocess
import sys

import httpx
import pytest
import websockets

from chat.partitions import SlotMap
from tests.e2e.helpers import connect, nothing_more, post, receive
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


async def test_a_grow_closes_with_1012_exits_0_and_only_moved_users_lose_their_cursor(two_partitions):
    with running_system(two_partitions, daemons=1, apis=1, writer=True, relay=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                        CHAT_GAP_CHECK_SECONDS="0.3") as system:
        mover, stayer, friend = moving(0, 1, "mover"), staying_in(0, "stayer"), staying_in(0, "friend")
        for to in (mover, stayer):
            assert (await post(system, friend, to, f"to {to}")).status_code == 201
        await until_released(system, "2")
        ws_mover, hello_mover = await connect(system, mover)
        ws_stayer, hello_stayer = await connect(system, stayer)
        assert hello_mover["cursor"] == hello_stayer["cursor"] == "2"  # partition 0, epoch 0: a bare id

        system.stop("api_0")  # the documented move: writers (and what writes) stopped first
        system.stop("writer")
        grown = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "chatctl.cli", "partitions", "grow", "3"], env=system.env,
            cwd=ROOT, capture_output=True, text=True, timeout=PATIENCE)
        assert grown.returncode == 0, grown.stderr
        assert grown.stdout.splitlines()[0] == "epoch 1, 3 partitions"
        for ws in (ws_mover, ws_stayer):
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10 * S)
            assert ws.close_code == 1012
        daemon = system.procs.pop("daemon_0")
        assert await asyncio.to_thread(daemon.wait, 10 * S) == 0
        log = (system.logdir / "daemon_0.log").read_text()
        assert ("event=slot_map_moved epoch=0 new_epoch=1 moved_users_closed=1 sockets=1 polls=0 "
                "action=restart new_partitions=2") in log

        # Every process restarted on the new map (supervisord's restart for the daemon).
        system.stop("relay")
        system.start("relay")
        system.start("writer")
        system.start("api_0")
        meanwhile = await post(system, friend, stayer, "while away")  # friend and stayer stayed in partition 0
        assert meanwhile.status_code == 201
        system.start("daemon_1")
        ws_mover, hello = await connect(system, mover, hello_mover["cursor"])
        assert hello["recovered"] is False and hello["cursor"] == "1.1.0"  # now in partition 1, at epoch 1
        ws_stayer, hello = await connect(system, stayer, hello_stayer["cursor"])
        position = meanwhile.json()["id"]
        assert hello["recovered"] is True and hello["cursor"] == f"0.1.{position}"
        [frame] = await receive(ws_stayer, 1)
        assert (frame["body"], frame["id"], frame["cursor"]) == ("while away", position, f"0.1.{position}")

        after = await post(system, friend, mover, "after the move")  # written in 0, copied into 1
        assert after.status_code == 201
        [frame] = await receive(ws_mover, 1)
        assert (frame["body"], frame["cursor"]) == ("after the move", "1.1.1")
        # Nothing more for either: stayer's marker travels partition 0 (where "after the move" was
        # written) and, once it is in, mover's own travels partition 1 (where its copy was): a repeat
        # or a stray from either stream was on mover's socket before mover's marker.
        assert await nothing_more(system, ws_stayer, stayer, peer=friend) == []
        assert await nothing_more(system, ws_mover, mover, peer=user_in(1, "peer", THREE)) == []
        for ws in (ws_mover, ws_stayer):
            await ws.close()
