"""A slot move seen by a running daemon, on real MariaDB/FerretDB and daemon processes.

At its gap check the daemon reads the map's epoch; a new one closes every
WebSocket with 1012 and ends the process with status 0 (supervisord starts it
again, on the new map). Back on the new map, a user whose slot moved is told
``recovered: false`` for its old cursor, and a user whose slot stayed resumes
from its cursor with what was sent meanwhile.
"""

import asyncio

import httpx
import pytest
import websockets

from chat.partitions import SlotMap, slot_of
from tests.e2e.helpers import connect, receive
from tests.e2e.partitioned import PartitionedStore
from tests.e2e.test_partitioned_delivery import user_in
from tests.system import databases, running_system

TWO = SlotMap.even(2)


async def until_released(system, position: str, timeout: float = 10) -> None:
    """Until the daemon has released partition 0's messages up to ``position``."""
    async with asyncio.timeout(timeout):
        while httpx.get(f"http://127.0.0.1:{system.daemon_port}/healthz", timeout=5).json()["position"] != position:
            await asyncio.sleep(0.05)


@pytest.fixture
def two_partitions(tmp_path):
    with databases(tmp_path) as dbs:
        store = PartitionedStore(dbs, TWO)
        store.lay_out()
        try:
            yield dbs, store
        finally:
            store.close()


async def test_a_new_epoch_closes_with_1012_exits_0_and_only_moved_users_lose_their_cursor(two_partitions):
    dbs, store = two_partitions
    with running_system(dbs, daemons=1, apis=0, CHAT_GAP_CHECK_SECONDS="0.3") as system:
        mover = user_in(0, "mover")
        stayer, friend = user_in(0, "stayer"), user_in(0, "friend")
        while slot_of(mover) in (slot_of(stayer), slot_of(friend)):  # they must stay where they are
            stayer, friend = user_in(0, "stayer"), user_in(0, "friend")
        store.send(friend, mover, "to mover")
        store.send(friend, stayer, "to stayer")
        await until_released(system, "2")
        ws_mover, hello_mover = await connect(system, mover)
        ws_stayer, hello_stayer = await connect(system, stayer)
        assert hello_mover["cursor"] == hello_stayer["cursor"] == "2"  # partition 0, epoch 0: a bare id

        store.move([slot_of(mover)], to=1)  # the writers are stopped; chatctl raises the epoch
        for ws in (ws_mover, ws_stayer):
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            assert ws.close_code == 1012
        daemon = system.procs.pop("daemon_0")
        assert await asyncio.to_thread(daemon.wait, 10) == 0

        stored = store.send(friend, stayer, "while away")  # friend and stayer stayed in partition 0
        system.start("daemon_1")  # supervisord's restart, on the new map
        ws, hello = await connect(system, mover, hello_mover["cursor"])
        assert hello["recovered"] is False and hello["cursor"] == "1.1.0"  # now in partition 1, at epoch 1
        await ws.close()
        ws, hello = await connect(system, stayer, hello_stayer["cursor"])
        assert hello["recovered"] is True and hello["cursor"] == f"0.1.{stored.home_id}"
        [frame] = await receive(ws, 1)
        assert (frame["body"], frame["cursor"]) == ("while away", f"0.1.{stored.home_id}")
        await ws.close()
