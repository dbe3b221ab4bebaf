"""Offline push (docs/push.md), end to end: the API's device registrations, the
pusher process, MySQL, and a push gateway of our own in its own process
(harness/push_gateway.py), which answers as the Matrix Push Gateway API says or
fails, stalls and rejects when told.

No test waits for the delay to pass by sleeping. A push that must come is
waited for at the gateway; a push that must not come is ruled out by a
barrier: the pusher decides a partition's rows in id order, so once a later
message's push has arrived, every decision before it is made. And to be sure a
device's ack or a read lands before the pusher decides, the pusher is paused
(SIGSTOP) while it does.
"""

import contextlib
import os
from datetime import UTC, datetime, timedelta
import signal
import uuid

import httpx
import orjson
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from harness.push_gateway import PushGateway
from pusher.process import SEND_BATCH
from pusher.store import lease_name
from harness.system import System, running_system
from tests.e2e.helpers import post
from harness.waiting import eventually_sync
from tests.timing import PATIENCE, eventually

DELAY = "0.5"  # CHAT_PUSH_DELAY_SECONDS here: short, as nothing waits for it but the pusher


@pytest.fixture(scope="module")
def gateway():
    g = PushGateway()
    yield g
    g.close()


@pytest.fixture(scope="module")
def pushing(dbs, gateway):
    with running_system(dbs, daemons=1, apis=1, writer=True, relay=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                        CHAT_PUSH_GATEWAY_URL=gateway.url, CHAT_PUSH_DELAY_SECONDS=DELAY) as system:
        system.start("pusher")
        wait_for_lease(system)
        yield system


def sql(system: System, statement: str, **params) -> list:
    engine = create_engine(system.dbs.mariadb.url())
    try:
        with engine.begin() as conn:
            result = conn.execute(text(statement), params)
            return result.all() if result.returns_rows else []
    finally:
        engine.dispose()


def wait_for_lease(system: System) -> None:
    """Until the pusher holds partition 0's lease and has its position (push_state): from then on, every message is
    decided."""
    eventually_sync(lambda: sql(system, "SELECT upto FROM push_state WHERE id = 0"), "the pusher's lease")


def due(created_at: str) -> bool:
    """Whether a message created then is past the pusher's delay now (the pusher reads the same clock)."""
    created = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    return datetime.now(UTC) >= created + timedelta(seconds=float(DELAY))


async def call(system: System, user: str, method: str, path: str, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        return await client.request(method, f"{system.api_url}{path}",
                                    headers={"Authorization": f"Bearer {system.token(user)}"}, **kwargs)


async def register(system: System, user: str, device: str) -> str:
    pushkey = f"pk-{uuid.uuid4().hex}"
    r = await call(system, user, "POST", "/v1/devices",
                   json={"device": device, "platform": "android", "app_id": "chat.example", "pushkey": pushkey,
                         "data": {"url": "https://push.example/notify"}})
    assert r.status_code == 201, r.text
    return pushkey


async def send(system: System, sender: str, to: str, body: str) -> str:
    return (await sent(system, sender, to, body))["id"]


async def sent(system: System, sender: str, to: str, body: str) -> dict:
    r = await post(system, sender, to, body)
    assert r.status_code == 201, r.text
    return r.json()


async def barrier(system: System, gateway: PushGateway) -> None:
    """Every message sent before now is decided: a marker message to an offline
    user of the same partition is pushed only after them."""
    tag = uuid.uuid4().hex[:8]
    sender, marker = f"barrier-from-{tag}", f"barrier-{tag}"
    pushkey = await register(system, marker, "phone")
    await send(system, sender, marker, "marker")
    await eventually(lambda: gateway.to(pushkey) != [], "the marker's push")


@contextlib.contextmanager
def paused(system: System):
    """The pusher stopped (SIGSTOP) for the block: what happens in it happens before its next decision."""
    pid = system.procs["pusher"].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_an_offline_device_gets_exactly_one_notification_per_window(pushing, gateway, users):
    alice, bob = users("alice"), users("bob")
    phone = await register(pushing, bob, "phone")
    with paused(pushing):  # both messages are due at its next decision: one window
        messages = [await sent(pushing, alice, bob, f"m{i}") for i in range(2)]
        await eventually(lambda: due(messages[-1]["created_at"]), "both messages past the delay")
    ids = [m["id"] for m in messages]
    await eventually(lambda: gateway.to(phone) != [], "bob's push")
    await barrier(pushing, gateway)
    [got] = gateway.to(phone)
    note = got["notification"]
    assert (note["event_id"], note["room_id"], note["counts"]["unread"]) == (ids[-1], alice, 2)
    assert "content" not in note and "sender" not in note  # CHAT_PUSH_CONTENT=none: ids and counts only
    assert note["devices"] == [{"app_id": "chat.example", "pushkey": phone,
                                "data": {"url": "https://push.example/notify"}}]
    assert got["key"] == f"0:{ids[-1]}:{bob}:phone"
    assert sql(pushing, "SELECT COUNT(*) FROM push_outbox WHERE user = :u", u=bob) == [(0,)]


async def test_a_device_that_acked_the_message_gets_no_push_and_a_dropped_one_only_what_it_missed(
        pushing, gateway, users):
    alice, bob = users("alice"), users("bob")
    phone = await register(pushing, bob, "phone")
    headers = {"Authorization": f"Bearer {pushing.token(bob)}"}
    ws = await websockets.connect(f"{pushing.ws_url}/v1/ws?device=phone", additional_headers=headers)
    assert orjson.loads(await ws.recv())["type"] == "hello"
    with paused(pushing):
        first = await send(pushing, alice, bob, "while online")
        frame = orjson.loads(await ws.recv())
        assert frame["id"] == first
        await ws.send(orjson.dumps({"type": "ack", "upto": first}).decode())
        await eventually(lambda: sql(pushing, "SELECT upto FROM device_acks WHERE user = :u", u=bob) == [
            (int(first),)], "the ack stored")
    await ws.close()  # dropped mid-conversation
    missed = await send(pushing, alice, bob, "while away")
    await eventually(lambda: gateway.to(phone) != [], "the push of what it missed")
    await barrier(pushing, gateway)
    assert [r["notification"]["event_id"] for r in gateway.to(phone)] == [missed]


async def test_a_read_on_the_laptop_before_the_delay_cancels_the_phone_s_push(pushing, gateway, users):
    alice, bob = users("alice"), users("bob")
    phone = await register(pushing, bob, "phone")
    with paused(pushing):
        msg = await send(pushing, alice, bob, "read it on the laptop")
        r = await call(pushing, bob, "POST", "/v1/read", json={"peer": alice, "upto": msg})
        assert r.json()["upto"] == msg
    await barrier(pushing, gateway)
    assert gateway.to(phone) == []


async def test_a_rejected_pushkey_is_removed(pushing, gateway, users):
    alice, bob = users("alice"), users("bob")
    phone = await register(pushing, bob, "phone")
    gateway.mode("ok", reject=[phone])
    try:
        await send(pushing, alice, bob, "to a phone that is gone")
        await eventually(lambda: gateway.to(phone) != [], "the push the gateway rejects")
        await eventually(lambda: sql(pushing, "SELECT device FROM devices WHERE user = :u", u=bob) == [],
                         "the registration removed")
    finally:
        gateway.mode("ok")
    assert (await call(pushing, bob, "GET", "/v1/devices")).json() == {"devices": []}


async def test_a_gateway_that_fails_loses_nothing_and_pushes_nothing_twice(pushing, gateway, users):
    alice = users("alice")
    people = [users(f"bob{i}") for i in range(3)]
    phones = [await register(pushing, bob, "phone") for bob in people]
    refused_before = gateway.state()["refused"]
    gateway.mode("fail")
    try:
        for bob in people:
            await send(pushing, alice, bob, "while the gateway is down")
        await eventually(lambda: gateway.state()["refused"] >= refused_before + 2 * len(people), "retries refused")
    finally:
        gateway.mode("ok")
    await eventually(lambda: all(gateway.to(p) for p in phones), "every push once the gateway is back")
    await barrier(pushing, gateway)
    assert [len(gateway.to(p)) for p in phones] == [1, 1, 1]
    keys = [r["key"] for r in gateway.received()]
    assert len(keys) == len(set(keys))


async def test_a_killed_pusher_pushes_what_it_had_not_after_its_restart(pushing, gateway, users):
    alice = users("alice")
    tag = alice.split("-", 1)[1]
    people = [users(f"bob{i}") for i in range(20)]
    phones = [await register(pushing, bob, "phone") for bob in people]

    def outbox(attempted: bool) -> int:
        return sql(pushing, "SELECT COUNT(*) FROM push_outbox WHERE user LIKE :u AND attempts >= :a",
                   u=f"bob%-{tag}", a=1 if attempted else 0)[0][0]

    gateway.mode("fail")  # decided and tried, none taken
    try:
        for bob in people:
            await send(pushing, alice, bob, "before the kill")
        await eventually(lambda: outbox(attempted=True) == len(people), "every push decided and tried")
        stalled = gateway.state()["stalled"]
        gateway.mode("stall")  # the next tries hang: the pusher dies with requests in flight
        await eventually(lambda: gateway.state()["stalled"] > stalled, "a request in flight")
        pushing.stop("pusher", signal.SIGKILL)
    finally:
        gateway.mode("ok")  # the held requests are taken now, and their pusher is gone
    pushing.start("pusher")
    await eventually(lambda: all(gateway.to(p) for p in phones), "every push after the restart")
    await eventually(lambda: outbox(attempted=False) == 0, "the outbox emptied")
    keys = {p: {r["key"] for r in gateway.to(p)} for p in phones}
    assert [len(k) for k in keys.values()] == [1] * len(people)  # one notification each, by its key
    # Sent twice, under the same key, at most the batch in hand at the kill: a gateway that honours
    # Idempotency-Key shows them once.
    assert sum(len(gateway.to(p)) for p in phones) - len(people) <= SEND_BATCH


def outbox_size(system: System) -> int:
    return sql(system, "SELECT COUNT(*) FROM push_outbox WHERE `partition` = 0")[0][0]


def held_steps(system: System) -> float:
    """chat_pusher_decisions_held_total of partition 0, from the pusher's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{system.pusher_metrics_ports['pusher']}/metrics", timeout=PATIENCE).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "chat_pusher_decisions_held_total" and sample.labels == {"partition": "0"}:
                return sample.value
    return 0.0


async def test_past_its_outbox_bound_the_pusher_decides_nothing_until_the_gateway_takes_some(pushing, gateway, users):
    bound = 3  # CHAT_PUSH_OUTBOX_MAX here, for a pusher of its own: 10,000 as deployed
    await eventually(lambda: outbox_size(pushing) == 0, "the outbox of the tests before emptied")
    pushing.stop("pusher")
    pushing.start("pusher", CHAT_PUSH_OUTBOX_MAX=str(bound))
    try:
        alice = users("alice")
        people = [users(f"bob{i}") for i in range(bound + 1)]
        phones = [await register(pushing, bob, "phone") for bob in people]
        gateway.mode("fail")  # nothing leaves the outbox
        for bob in people[:bound]:
            await send(pushing, alice, bob, "while the gateway is down")
        await eventually(lambda: outbox_size(pushing) == bound, "the outbox at its bound")
        last = await sent(pushing, alice, people[-1], "past the bound")
        await eventually(lambda: due(last["created_at"]), "the last message past the delay")
        held = held_steps(pushing)
        # a step that looked after the last message was due, and decided nothing
        await eventually(lambda: held_steps(pushing) > held, "a step held back by the full outbox")
        assert sql(pushing, "SELECT upto FROM push_state WHERE id = 0")[0][0] < int(last["id"])
        assert outbox_size(pushing) == bound
        gateway.mode("ok")
        # the outbox drains as retries come due, and the last message is decided once it has room
        await eventually(lambda: all(gateway.to(p) for p in phones), "every push, the last one's too")
        assert [r["notification"]["event_id"] for r in gateway.to(phones[-1])] == [last["id"]]
        assert [len(gateway.to(p)) for p in phones] == [1] * len(phones)
        await eventually(lambda: outbox_size(pushing) == 0, "the outbox emptied")
    finally:
        gateway.mode("ok")
        pushing.stop("pusher")
        pushing.start("pusher")  # the module's, with the deployed bound
        eventually_sync(lambda: sql(pushing, "SELECT IS_USED_LOCK(:n)", n=lease_name(0))[0][0] is not None,
                        "the lease taken again")


async def test_device_registrations_have_their_limits_and_documented_refusals(pushing, users):
    bob = users("bob")
    r = await call(pushing, bob, "POST", "/v1/devices",
                   json={"device": "phone", "platform": "ios", "app_id": "a", "pushkey": "k1"})
    assert r.status_code == 201
    again = await call(pushing, bob, "POST", "/v1/devices",
                       json={"device": "phone", "platform": "ios", "app_id": "a", "pushkey": "k2"})
    assert (again.status_code, again.json()["pushkey"]) == (200, "k2")  # the same device, its new token
    for i in range(9):
        assert (await call(pushing, bob, "POST", "/v1/devices",
                           json={"device": f"d{i}", "platform": "ios", "app_id": "a", "pushkey": f"k{i}"})
                ).status_code == 201
    eleventh = await call(pushing, bob, "POST", "/v1/devices",
                          json={"device": "d10", "platform": "ios", "app_id": "a", "pushkey": "x"})
    assert (eleventh.status_code, eleventh.json()["error"]) == (409, "too_many_devices")
    assert len((await call(pushing, bob, "GET", "/v1/devices")).json()["devices"]) == 10
    for bad in ({"device": "a b", "platform": "ios", "app_id": "a", "pushkey": "k"},
                {"device": "d", "platform": "IOS", "app_id": "a", "pushkey": "k"},
                {"device": "d", "platform": "ios", "app_id": "a", "pushkey": "k" * 513},
                {"device": "d", "platform": "ios", "app_id": "a", "pushkey": "k", "data": [1]},
                {"device": "d", "platform": "ios", "app_id": "a", "pushkey": "k", "data": {"x": "y" * 2000}},
                {"device": "d", "platform": "ios", "app_id": "a"}):
        r = await call(pushing, bob, "POST", "/v1/devices", json=bad)
        assert (r.status_code, r.json()["error"]) == (422, "invalid_field"), bad
    assert (await call(pushing, bob, "DELETE", "/v1/devices/phone")).status_code == 204
    gone = await call(pushing, bob, "DELETE", "/v1/devices/phone")
    assert (gone.status_code, gone.json()["error"]) == (404, "device_not_found")
    assert (await call(pushing, users("carol"), "GET", "/v1/devices")).json() == {"devices": []}


@pytest.fixture(scope="module")
def two_pushers(tmp_path_factory, gateway):
    """Two partitions, and two pusher processes (as on two hosts) for them."""
    from harness.system import databases
    with databases(tmp_path_factory.mktemp("push-parts"), partitions=2) as dbs, \
            running_system(dbs, daemons=0, apis=1, writer=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                           CHAT_PUSH_GATEWAY_URL=gateway.url, CHAT_PUSH_DELAY_SECONDS=DELAY) as system:
        system.start("pusher_a")  # takes both leases; the second waits for them
        eventually_sync(lambda: len(sql(system, "SELECT id FROM push_state")) == 2, "both partitions leased")
        system.start("pusher_b")
        yield system


def lease_holders(system: System) -> dict[int, int | None]:
    """partition -> the MySQL connection id that holds its pusher lock."""
    return {k: sql(system, "SELECT IS_USED_LOCK(:n)", n=lease_name(k))[0][0] for k in (0, 1)}


async def test_one_pusher_per_partition_and_another_takes_over_when_it_dies(two_pushers, gateway):
    from chat.partitions import SlotMap
    two = SlotMap.even(2)
    holders = lease_holders(two_pushers)
    assert all(holders.values())
    tag = uuid.uuid4().hex[:6]
    bobs = {k: next(u for i in range(1000) if two.partition_of(u := f"bob{i}-{tag}") == k) for k in (0, 1)}
    phones = {k: await register(two_pushers, bob, "phone") for k, bob in bobs.items()}
    for k, bob in bobs.items():  # each partition's user, a message from the other partition's
        await send(two_pushers, bobs[1 - k], bob, f"to partition {k}")
    await eventually(lambda: all(gateway.to(p) for p in phones.values()), "a push in each partition")
    assert [len(gateway.to(p)) for p in phones.values()] == [1, 1]  # a copy is pushed in its partition alone

    two_pushers.stop("pusher_a", signal.SIGKILL)  # its leases die with its MySQL sessions
    await eventually(lambda: all(lease_holders(two_pushers).values()) and lease_holders(two_pushers) != holders,
                     "the leases held again")
    for k, bob in bobs.items():
        await send(two_pushers, bobs[1 - k], bob, f"again to partition {k}")
    await eventually(lambda: all(len(gateway.to(p)) == 2 for p in phones.values()), "pushes after the takeover")
