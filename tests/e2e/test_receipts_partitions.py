"""Events between users of two partitions (docs/receipts.md): each device is told
the ids of its own stream, and unread counts stay exact across partitions."""

import random
import uuid

import httpx
import pytest
from sqlalchemy import create_engine, text

from chat.partitions import SlotMap, suffix
from harness.system import databases, running_system
from tests.e2e.helpers import connect, post, receive
from tests.timing import PATIENCE, eventually

TWO = SlotMap.even(2)


def user_in(partition: int, name: str) -> str:
    tag = uuid.uuid4().hex[:6]
    return next(u for i in range(10_000) if TWO.partition_of(u := f"{name}{i}-{tag}") == partition)


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    with databases(tmp_path_factory.mktemp("receipts-parts"), partitions=2) as dbs, \
            running_system(dbs, daemons=1, apis=1, writer=True, CHAT_RATE_LIMIT_PER_SECOND="0") as system:
        yield system


async def call(system, user: str, method: str, path: str, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        return await client.request(method, f"{system.api_url}{path}",
                                    headers={"Authorization": f"Bearer {system.token(user)}"}, **kwargs)


def copy_of(system, partition: int, origin_part: int, origin_id: str) -> str | None:
    """The id in ``partition`` of the copy of message ``origin_id`` of ``origin_part``, read from MySQL."""
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.connect() as conn:
            found = conn.execute(text(f"SELECT id FROM messages{suffix(partition)} WHERE origin_part = :p "
                                      "AND origin_id = :i"), {"p": origin_part, "i": int(origin_id)}).scalar()
            return None if found is None else str(found)
    finally:
        engine.dispose()


async def copy_id(system, partition: int, origin_part: int, origin_id: str) -> str:
    """Once it is made: a copy is committed just after its original's answer."""
    await eventually(lambda: copy_of(system, partition, origin_part, origin_id) is not None,
                     f"the copy of {origin_part}/{origin_id}")
    return copy_of(system, partition, origin_part, origin_id) or ""


async def test_every_event_reaches_the_other_partition_with_that_partition_s_ids(two):
    alice, bob = user_in(0, "alice"), user_in(1, "bob")
    alice_ws, _ = await connect(two, alice)
    bob_ws, _ = await connect(two, bob)
    mine = []
    for i in range(3):
        r = await post(two, alice, bob, f"m{i}")
        assert r.status_code == 201
        mine.append(r.json()["id"])
    theirs = [f["id"] for f in await receive(bob_ws, 3)]
    assert theirs == [await copy_id(two, 1, 0, m) for m in mine]  # bob's stream numbers them its own way
    await receive(alice_ws, 3)

    ack = await call(two, bob, "POST", "/v1/acks", json={"upto": theirs[-1]})
    assert ack.json() == {"device": "default", "upto": theirs[-1]}
    [delivered] = await receive(alice_ws, 1)
    assert (delivered["type"], delivered["from"], delivered["upto"]) == ("delivered", bob, mine[-1])
    assert (await receive(bob_ws, 1))[0]["upto"] == theirs[-1]  # bob's own stream has it in bob's ids

    read = await call(two, bob, "POST", "/v1/read", json={"peer": alice, "upto": theirs[1]})
    assert read.json() == {"peer": alice, "upto": theirs[1], "unread": 1}
    assert [(f["type"], f["upto"]) for f in await receive(bob_ws, 1)] == [("read", theirs[1])]
    assert [(f["type"], f["upto"]) for f in await receive(alice_ws, 1)] == [("read", mine[1])]

    r = await call(two, alice, "PATCH", f"/v1/messages/{mine[0]}", json={"body": "m0, better"})
    assert r.status_code == 201
    assert [(f["type"], f["ref"], f["body"]) for f in await receive(bob_ws, 1)] == [("edit", theirs[0], "m0, better")]
    r = await call(two, alice, "DELETE", f"/v1/messages/{mine[2]}")
    assert r.status_code == 201
    assert [(f["type"], f["ref"]) for f in await receive(bob_ws, 1)] == [("delete", theirs[2])]
    await receive(alice_ws, 2)

    history = (await call(two, bob, "GET", "/v1/messages", params={"with": alice})).json()["messages"]
    assert [(m["id"], m["body"], m.get("deleted", False)) for m in reversed(history)] == [
        (theirs[0], "m0, better", False), (theirs[1], "m1", False), (theirs[2], "", True)]
    conversation = (await call(two, bob, "GET", "/v1/conversations")).json()["conversations"][0]
    assert conversation["unread"] == 0  # the one unread message was deleted
    await alice_ws.close()
    await bob_ws.close()


async def test_unread_counts_match_a_model_after_a_random_mix_of_sends_reads_edits_and_deletes(two):
    rng = random.Random(7)
    people = [user_in(0, "p0a"), user_in(0, "p0b"), user_in(1, "p1a"), user_in(1, "p1b")]
    sent: dict[tuple[str, str], list[list]] = {}  # (from, to) -> [[sender's id, deleted]] in order
    marker: dict[tuple[str, str], int] = {}  # (reader, peer) -> how many of peer's messages are read
    for _ in range(300):
        sender, to = rng.sample(people, 2)
        mine = sent.setdefault((sender, to), [])
        roll = rng.random()
        if roll < 0.55 or not mine:
            r = await post(two, sender, to, "x")
            assert r.status_code == 201
            mine.append([r.json()["id"], False])
        elif roll < 0.7:
            live = [m for m in mine if not m[1]]
            if live:
                target = rng.choice(live)
                assert (await call(two, sender, "DELETE", f"/v1/messages/{target[0]}")).status_code == 201
                target[1] = True
        elif roll < 0.8:
            target = rng.choice(mine)
            r = await call(two, sender, "PATCH", f"/v1/messages/{target[0]}", json={"body": "y"})
            assert r.status_code == (409 if target[1] else 201)
        else:  # `to` reads up to one of sender's messages that is not deleted
            live = [i for i, m in enumerate(mine) if not m[1]]
            if live:
                upto = rng.choice(live)
                to_part, from_part = TWO.partition_of(to), TWO.partition_of(sender)
                seen = mine[upto][0] if to_part == from_part else await copy_id(two, to_part, from_part, mine[upto][0])
                r = await call(two, to, "POST", "/v1/read", json={"peer": sender, "upto": seen})
                assert r.status_code == 200
                marker[(to, sender)] = max(marker.get((to, sender), 0), upto + 1)
    for reader in people:
        listed = (await call(two, reader, "GET", "/v1/conversations")).json()["conversations"]
        got = {c["with"]: c["unread"] for c in listed}
        want = {peer: sum(1 for m in sent.get((peer, reader), [])[marker.get((reader, peer), 0):] if not m[1])
                for peer in people if peer != reader and (sent.get((peer, reader)) or sent.get((reader, peer)))}
        assert got == want, reader
