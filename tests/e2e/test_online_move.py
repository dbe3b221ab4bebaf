"""Growing from 2 to 4 partitions online, on one host with its writer process and API:
`chatctl partitions grow 4` killed mid-copy, then resumed, while users keep posting.

Slots 256-511 move 0 -> 1, 512-767 move 1 -> 2 and 768-1023 move 1 -> 3, so
partition 1 is a source and a target at once. What is checked is what users
see: each user's rows in their partition of the new map (MySQL), once each;
their history and unread counts through the API; the copies in the fast store;
no POST of anyone refused while the mover runs."""

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter

import httpx
import pymongo
import pytest
from sqlalchemy import create_engine, text

from chat.partitions import SlotMap, collection_name, suffix
from harness.servers import ROOT
from harness.system import databases, running_system
from tests.e2e.helpers import post
from tests.timing import PATIENCE, eventually

TWO, FOUR = SlotMap.even(2), SlotMap.even(2).grown(4)


def users_moving(before: int, after: int, n: int, tag: str) -> list[str]:
    found = (u for i in range(100_000)
             if TWO.partition_of(u := f"u{before}{after}-{i}-{tag}") == before and FOUR.partition_of(u) == after)
    return [next(found) for _ in range(n)]


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("move"), partitions=2) as dbs, \
            running_system(dbs, daemons=0, apis=1, writer=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                           CHAT_GAP_CHECK_SECONDS="0.2") as system:
        yield system


def chatctl(system, *args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAT_")} | system.env
    return subprocess.Popen([sys.executable, "-m", "chatctl.cli", "partitions", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def query(system, sql: str, **params) -> list:
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql), params).all()
    finally:
        engine.dispose()


def rows_of(system, user: str, partition: int) -> Counter:
    """(sender, recipient, body) of the messages in ``user``'s rows of ``partition``, counted."""
    found = query(system, f"SELECT sender, recipient, body FROM messages{suffix(partition)} "
                          "WHERE kind = 0 AND (sender = :u OR recipient = :u)", u=user)
    return Counter(tuple(r) for r in found)


async def api(system, user: str, method: str, path: str, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        return await client.request(method, f"{system.api_url}{path}",
                                    headers={"Authorization": f"Bearer {system.token(user)}"}, **kwargs)


async def test_grow_killed_mid_copy_then_resumed_moves_every_user_with_their_whole_history(system):
    tag = uuid.uuid4().hex[:6]
    stay0 = users_moving(0, 0, 4, tag)  # every slot of partition 1 moves
    to1, to2, to3 = users_moving(0, 1, 2, tag), users_moving(1, 2, 2, tag), users_moving(1, 3, 2, tag)
    everyone = stay0 + to1 + to2 + to3
    sent: list[tuple[str, str, str]] = []

    async def send(a: str, b: str, body: str) -> str:
        r = await post(system, a, b, body)
        assert r.status_code == 201, r.text  # nobody's POST is refused, before, during or after the move
        sent.append((a, b, body))
        return r.json()["id"]

    for i, a in enumerate(everyone):  # every pair talks, both ways: copies between all four partitions
        for b in everyone[i + 1:]:
            await send(a, b, f"{a}>{b}")
            await send(b, a, f"{b}>{a}")
    reader, peer = to2[0], stay0[0]  # a moving reader, with 1 unread of 2 from the peer
    await send(peer, reader, "second")
    first = query(system, "SELECT id FROM messages_p1 WHERE sender = :p AND recipient = :r AND kind = 0 "
                          "ORDER BY id LIMIT 1", p=peer, r=reader)[0][0]
    read = await api(system, reader, "POST", "/v1/read", json={"peer": peer, "upto": str(first)})
    assert read.status_code == 200 and read.json()["unread"] == 1, read.text

    mover = chatctl(system, "grow", "4", "--page", "7")
    assert mover.stdout is not None
    lines = []
    while not (line := mover.stdout.readline()).startswith("copied partition"):  # mid-copy: kill it
        assert line, mover.stderr.read() if mover.stderr else ""
        lines.append(line)
    mover.send_signal(signal.SIGKILL)
    mover.wait()
    shown = chatctl(system, "show")
    out, _ = shown.communicate()
    assert "move in progress to epoch 1" in out and "epoch 0, 2 partitions" in out
    assert query(system, "SELECT slot_map FROM partition_map WHERE id = 1")[0][0] == TWO.encode()

    for a, b in zip(to1 + to2 + to3, stay0 + stay0[:2], strict=True):  # posts between the two runs
        await send(a, b, f"{a}>{b} between")

    resumed = chatctl(system, "resume", "--page", "7")
    during = [asyncio.create_task(send(a, b, f"{a}>{b} during")) for a in everyone[:4] for b in everyone[-4:]]
    out, err = await asyncio.to_thread(resumed.communicate)
    await asyncio.gather(*during)
    assert resumed.returncode == 0, err
    assert "resuming after ids" in out and "cut over to epoch 1" in out, out
    assert out.splitlines()[-5] == "epoch 1, 4 partitions"
    stored = SlotMap.decode(query(system, "SELECT slot_map FROM partition_map WHERE id = 1")[0][0])
    assert stored == FOUR and query(system, "SELECT * FROM partition_map WHERE id = 2") == []

    for a in everyone:  # after the cutover: each message lands in its sender's partition of the new map
        await send(a, everyone[0] if a != everyone[0] else everyone[1], f"{a} after")

    def complete() -> bool:
        return all(rows_of(system, u, FOUR.partition_of(u)) == Counter(m for m in sent if u in m[:2])
                   for u in everyone)

    await eventually(complete, "every user's partition holds each of their messages once (copies are async)")
    assert query(system, "SELECT * FROM echoes") == []

    async def history_complete() -> bool:  # the API reads by the new map once it has read it
        r = await api(system, to3[0], "GET", "/v1/messages", params={"with": stay0[1], "limit": 100})
        return {m["body"] for m in r.json()["messages"]} == {m[2] for m in sent if set(m[:2]) == {to3[0], stay0[1]}}

    await eventually(history_complete, "a moved user's history through the API")
    conversations = (await api(system, reader, "GET", "/v1/conversations")).json()["conversations"]
    assert {c["with"]: c["unread"] for c in conversations}[peer] == 1 + sum(
        1 for m in sent if m[:2] == (peer, reader) and ("between" in m[2] or "during" in m[2] or "after" in m[2]))

    client = pymongo.MongoClient(system.dbs.ferretdb.url)

    def mirrored(user: str) -> bool:  # the fast store of the new partition holds the copied history too
        ids = [r[0] for r in query(system, "SELECT id FROM messages_p2 WHERE sender = :u OR recipient = :u", u=user)]
        found = client["chat"][collection_name(2)].find({"_id": {"$in": ids}}, {"_id": 1})
        return {d["_id"] for d in found} == set(ids)

    try:
        for u in to2:
            await eventually(lambda u=u: mirrored(u), f"{u}'s rows in {collection_name(2)}")
    finally:
        client.close()

    again = chatctl(system, "grow", "4")
    _, err = again.communicate()
    assert again.returncode == 1 and "never shrink" in err
