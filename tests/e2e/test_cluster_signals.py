"""Typing and presence across hosts (docs/presence.md), on the cluster of cluster/ (docs/cluster.md):
3 hosts in network namespaces, one daemon each, 2 partitions, and every host's processes reaching
Redis through a Toxiproxy proxy of their own, as they reach MySQL and Mongo.

One cluster serves both tests (its start is most of the file's time); the second kills a host,
so it comes last. Each client connects straight to one host's daemon, past nginx, so that which
host serves whom is the test's choice. Needs root and `ip netns` (skipped otherwise, saying which).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import httpx
import orjson
import pytest
import websockets

from chat import auth
from chat.settings import Settings
from cluster.partitions import partition_of
from cluster.plan import API_PORT, Member, make_plan
from tests.frame_contract import FRAME_SCHEMA, violations
from tests.timing import PATIENCE, S, eventually

PARTITIONS = 2
# Its least: a daemon killed is found dead this long after its last heartbeat (plus up to one
# heartbeat period), so the test's host kill is noticed soon.
DAEMON_TIMEOUT_SECONDS = 4


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the cluster needs root (network namespaces, veths, a bridge): run the tests as root"
    if shutil.which("ip") is None:
        return "the cluster needs iproute2's `ip` (ip netns), which is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"`ip netns` is not available here: {probe.stderr.strip()}"
    return None


_SKIP = _why_not()
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from cluster.up import Cluster

    plan = make_plan(3, daemons_per_host=1)
    env = {"CHAT_PRESENCE_DAEMON_TIMEOUT_SECONDS": str(DAEMON_TIMEOUT_SECONDS)}
    # Leaving the block, also on a failure here or in a test, stops every process it started and
    # removes the namespaces, veths and the bridge (cluster.netns.teardown).
    with Cluster(plan, state=tmp_path_factory.mktemp("cluster"), extra_env=env) as c:
        c.start_hosts(PARTITIONS, wait=90 * S)
        yield c
        c.stop_hosts()  # kill -9: nothing of theirs is left to drain, and the cluster goes at once


@dataclass
class Client:
    """One WebSocket of ``user``, straight to a host's daemon; every frame it gets, in ``frames``."""

    user: str
    host: Member
    ws: websockets.ClientConnection
    frames: list[dict] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)  # time.monotonic() of each frame
    unlike_the_document: list[str] = field(default_factory=list)  # how frames differ from the AsyncAPI document
    reader: asyncio.Task | None = None

    async def _read(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for data in self.ws:
                frame = orjson.loads(data)
                # The frames the AsyncAPI document describes. It has no typing or presence frame:
                # the tests below assert those whole.
                if frame.get("type") in FRAME_SCHEMA:
                    self.unlike_the_document += violations(frame)
                self.frames.append(frame)
                self.arrived.append(time.monotonic())

    async def send(self, frame: dict) -> None:
        await self.ws.send(orjson.dumps(frame).decode())

    async def first(self, match: Callable[[dict], bool], what: str, after: int = 0) -> tuple[dict, float]:
        """The first frame from index ``after`` on that ``match`` holds for, and when it came."""
        def found() -> int | None:
            assert self.unlike_the_document == [], self.frames
            return next((i + 1 for i in range(after, len(self.frames)) if match(self.frames[i])), None)

        i = await eventually(found, f"{self.user} on {self.host.namespace} gets {what}") - 1
        return self.frames[i], self.arrived[i]


@contextlib.asynccontextmanager
async def connected(cluster, user: str, host: Member) -> AsyncIterator[Client]:
    """``user``'s socket to ``host``'s daemon, once its hello came."""
    url = f"ws://{host.address}:{cluster.daemons[0].port}/v1/ws"
    assert all(d.port == cluster.daemons[0].port for d in cluster.daemons)  # one daemon per host, one port
    headers = {"Authorization": f"Bearer {auth.mint(cluster.secret, user, 3600)}"}
    ws = await websockets.connect(url, additional_headers=headers, open_timeout=PATIENCE)
    client = Client(user, host, ws)
    client.reader = asyncio.create_task(client._read())
    try:
        await client.first(lambda f: f["type"] == "hello", "its hello")
        yield client
    finally:
        await ws.close()
        await client.reader
    assert client.unlike_the_document == [], client.frames


def api(cluster, host: Member, user: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=f"http://{host.address}:{API_PORT}", timeout=PATIENCE,
                             headers={"Authorization": f"Bearer {auth.mint(cluster.secret, user, 3600)}"})


async def presence(http: httpx.AsyncClient, *users: str) -> dict[str, dict]:
    r = await http.get("/v1/presence", params={"users": ",".join(users)})
    assert r.status_code == 200, r.text
    return {u["user"]: u for u in r.json()["users"]}


async def online(http: httpx.AsyncClient, *users: str) -> None:
    """Once the API reads every one of ``users`` online from Redis: their daemons announced them."""
    async def all_online() -> bool:
        return all(u["online"] for u in (await presence(http, *users)).values())

    await eventually(all_online, f"{', '.join(users)} online in GET /v1/presence")


def names(tag: str) -> tuple[str, str, str]:
    """A typist, a peer in the other partition, and a user the peer watches."""
    typist = f"typist-{tag}"
    for i in range(100):
        if partition_of(peer := f"peer{i}-{tag}", PARTITIONS) != partition_of(typist, PARTITIONS):
            return typist, peer, f"watched-{tag}"
    raise AssertionError("no user of the other partition in 100 names")


async def test_typing_reaches_a_peer_on_another_host_in_another_partition(cluster):
    h1, _, h3 = cluster.plan.hosts
    typist, peer, _ = names(uuid.uuid4().hex[:8])
    async with connected(cluster, typist, h1) as a, connected(cluster, peer, h3) as b, api(cluster, h1, typist) as http:
        # Barriers, not waits for time: both daemons have announced their user to Redis, and
        # the peer's socket is live (a message posted after its hello came to it).
        await online(http, typist, peer)
        r = await http.post("/v1/messages", json={"to": peer, "body": "are you there?"})
        assert r.status_code == 201, r.text
        await b.first(lambda f: f["type"] == "message" and f.get("body") == "are you there?", "the message")

        seen = len(b.frames)
        await a.send({"type": "typing", "to": peer, "state": "start"})
        frame, _ = await b.first(lambda f: f["type"] == "typing", "the typing event", after=seen)
        ttl = Settings.field("signals.typing_ttl_seconds").default
        assert frame == {"type": "typing", "from": typist, "to": peer, "state": "start", "ttl": ttl}
        # the typist's own socket was told nothing wrong
        assert [f for f in a.frames if f["type"] == "error"] == []


async def test_a_watched_user_turns_offline_once_the_host_it_was_on_is_killed(cluster):
    h1, h2, h3 = cluster.plan.hosts
    _, peer, watched = names(uuid.uuid4().hex[:8])
    async with connected(cluster, peer, h3) as b, connected(cluster, watched, h2) as w, \
            api(cluster, h1, peer) as http1, api(cluster, h3, peer) as http3:
        await online(http1, watched)
        await b.send({"type": "watch", "users": [watched]})
        snapshot, _ = await b.first(lambda f: f["type"] == "presence" and "users" in f, "the presence snapshot")
        assert snapshot == {"type": "presence", "users": [{"user": watched, "online": True, "last_seen": None}]}

        seen = len(b.frames)
        killing_at = time.monotonic()
        assert cluster.kill_host(h2.namespace) > 0  # supervisord and all it runs: the daemon cannot say goodbye
        killed_wall = datetime.now().astimezone()  # every process of the host is gone by now
        change, came_at = await b.first(lambda f: f["type"] == "presence" and f.get("user") == watched,
                                        f"{watched} offline", after=seen)
        print(f"\n{watched} turned offline for its watcher {came_at - killing_at:.2f} s after the kill of "
              f"{h2.namespace} began (CHAT_PRESENCE_DAEMON_TIMEOUT_SECONDS={DAEMON_TIMEOUT_SECONDS})")
        assert change["online"] is False, change
        # The dead daemon's last heartbeat: before the kill, and within the timeout of it (an older
        # one would have had the daemon found dead before it was killed).
        last_seen = datetime.fromisoformat(change["last_seen"])
        assert killed_wall - timedelta(seconds=DAEMON_TIMEOUT_SECONDS) <= last_seen <= killed_wall, change
        await w.reader  # its socket was cut with its host

        # Any living host's API says the same: offline, and since when (last_seen is stored in
        # MySQL as the change is published; the API reads it from there).
        for http in (http1, http3):
            async def stored(http: httpx.AsyncClient = http) -> dict | None:
                answer = (await presence(http, watched))[watched]
                return answer if answer["last_seen"] is not None else None

            answer = await eventually(stored, f"{watched}'s last_seen in GET /v1/presence")
            assert answer == {"user": watched, "online": False, "last_seen": change["last_seen"]}
