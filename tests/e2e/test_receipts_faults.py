"""Events under faults, with two partitions: a writer killed between an event's
home commit and its copy, a daemon killed, and a device that was offline
through both. Every device of both users ends with exactly the rows of its
partition's stream that are theirs, in order, once each, as MySQL holds them.
"""

import asyncio
import signal

import httpx
import orjson
import pytest
import websockets
from sqlalchemy import create_engine, text

from chat.partitions import lock_name, suffix
from harness.system import System, databases
from tests.e2e.helpers import post
from tests.e2e.test_partitioned_delivery import daemon_serving, user_in, writing_system
from tests.frame_contract import violations
from tests.timing import PATIENCE, eventually

TYPES = {0: "message", 1: "edit", 2: "delete", 3: "read", 4: "delivered"}


def stream_of(system: System, partition: int, user: str) -> list[tuple[str, str]]:
    """(id, type) of every row of ``user``'s in ``partition``'s table, by id: what their devices must get."""
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(f"SELECT id, kind FROM messages{suffix(partition)} "
                                     "WHERE sender = :u OR recipient = :u ORDER BY id"), {"u": user}).all()
    finally:
        engine.dispose()
    return [(str(r.id), TYPES[r.kind]) for r in rows]


class Device:
    """One device of a user: its socket, and every frame it got, across reconnects."""

    def __init__(self, daemon: System, user: str, name: str):
        self.daemon, self.user, self.name = daemon, user, name
        self.frames: list[dict] = []
        self.ws = None

    async def open(self) -> None:
        since = f"&since={self.frames[-1]['cursor']}" if self.frames else ""
        headers = {"Authorization": f"Bearer {self.daemon.token(self.user)}"}
        self.ws = await websockets.connect(f"{self.daemon.ws_url}/v1/ws?device={self.name}{since}",
                                           additional_headers=headers)
        hello = orjson.loads(await self.ws.recv())
        assert hello["type"] == "hello" and (hello["recovered"] or not self.frames), hello

    async def until(self, last_id: str) -> None:
        """Takes frames until the one with ``last_id``."""
        async with asyncio.timeout(PATIENCE):
            while not self.frames or self.frames[-1]["id"] != last_id:
                frame = orjson.loads(await self.ws.recv())
                assert violations(frame) == []
                self.frames.append(frame)

    def got(self) -> list[tuple[str, str]]:
        return [(f["id"], f["type"]) for f in self.frames]


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("receipts-faults"), partitions=2) as dbs, writing_system(dbs) as front, \
            daemon_serving(dbs, "", CHAT_OPLOG_RELAY_SOCKET=front.env["CHAT_OPLOG_RELAY_SOCKET"],
                           CHAT_WRITER_SOCKET=front.env["CHAT_WRITER_SOCKET"]) as daemon:
        yield front, daemon


async def call(system: System, user: str, method: str, path: str, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        return await client.request(method, f"{system.api_url}{path}",
                                    headers={"Authorization": f"Bearer {system.token(user)}"}, **kwargs)


async def test_events_reach_every_device_once_in_order_across_a_writer_kill_a_daemon_kill_and_an_offline_device(
        hosted):
    front, daemon = hosted
    ann, ben = user_in(0, "ann"), user_in(1, "ben")
    devices = [Device(daemon, ann, "a1"), Device(daemon, ann, "a2"), Device(daemon, ben, "b1"),
               Device(daemon, ben, "b2")]
    a1, a2, b1, b2 = devices
    for d in devices:
        await d.open()

    async def settle(*which: Device) -> None:
        for d in which:
            partition = 0 if d.user == ann else 1
            await eventually(lambda d=d, p=partition: stream_of(front, p, d.user)[-1:] != [],
                             f"{d.user}'s stream in MySQL")
            await d.until(stream_of(front, partition, d.user)[-1][0])

    mine = []
    for n in range(4):
        r = await post(front, ann, ben, f"m{n}")
        assert r.status_code == 201
        mine.append(r.json()["id"])
    await eventually(lambda: len(stream_of(front, 1, ben)) == 4, "four copies in partition 1")
    await settle(*devices)

    # The writer killed between an edit's and a delete's home commits and their copies.
    engine = create_engine(front.dbs.mariadb.url())
    holder = engine.connect()
    try:
        # Waited for: partition 1's writer takes its lock for a moment each second while idle
        # (a turn that drains leftover copies); asked with no wait, one such turn refused it.
        assert holder.execute(text("SELECT GET_LOCK(:n, :t)"), {"n": lock_name(1), "t": PATIENCE}).scalar() == 1
        assert (await call(front, ann, "PATCH", f"/v1/messages/{mine[0]}", json={"body": "m0!"})).status_code == 201
        assert (await call(front, ann, "DELETE", f"/v1/messages/{mine[1]}")).status_code == 201
        front.stop("writer", signal.SIGKILL)
    finally:
        holder.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": lock_name(1)})
        holder.close()
        engine.dispose()
    front.start("writer")
    await eventually(lambda: [t for _i, t in stream_of(front, 1, ben)][-2:] == ["edit", "delete"],
                     "the copies made by the restarted writer")
    await settle(*devices)

    await b2.ws.close()  # offline from here to the end
    theirs = [i for i, t in stream_of(front, 1, ben) if t == "message"]
    await b1.ws.send(orjson.dumps({"type": "ack", "upto": b1.frames[-1]["id"]}).decode())
    await b1.ws.send(orjson.dumps({"type": "read", "peer": ann, "upto": theirs[2]}).decode())
    await eventually(lambda: [t for _i, t in stream_of(front, 0, ann)][-2:] == ["delivered", "read"],
                     "the delivered and read copies in partition 0")
    await settle(a1, a2, b1)

    daemon.stop("daemon_0", signal.SIGKILL)
    assert (await call(front, ann, "PATCH", f"/v1/messages/{mine[2]}", json={"body": "m2!"})).status_code == 201
    read = await call(front, ben, "POST", "/v1/read", json={"peer": ann, "upto": theirs[3]})
    assert read.json()["upto"] == theirs[3]
    daemon.start("daemon_0")
    await eventually(lambda: [t for _i, t in stream_of(front, 0, ann)][-1:] == ["read"]
                     and len([t for _i, t in stream_of(front, 0, ann) if t == "read"]) == 2, "the second read copy")
    for d in devices:
        await d.open()  # resumes from its last frame's cursor; b2 from before it went offline
    await settle(*devices)

    for d in devices:
        assert d.got() == stream_of(front, 0 if d.user == ann else 1, d.user), d.name
    # and nothing more was on its way: the next message is the next frame of every device
    r = await post(front, ann, ben, "last")
    assert r.status_code == 201
    await eventually(lambda: stream_of(front, 1, ben)[-1:] != [] and stream_of(front, 1, ben)[-1][1] == "message"
                     and len([t for _i, t in stream_of(front, 1, ben) if t == "message"]) == 5, "the last copy")
    await settle(*devices)
    for d in devices:
        assert d.got() == stream_of(front, 0 if d.user == ann else 1, d.user), d.name
        await d.ws.close()
