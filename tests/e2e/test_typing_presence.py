"""Typing and presence (docs/presence.md), end to end: the frames each socket
gets, what `/v1/presence` says, what MySQL stores (last_seen, hidden and
never a message) and every answer to bad input."""

import asyncio
import contextlib
import signal

import httpx
import orjson
import pytest
import redis.asyncio as aioredis
from websockets.exceptions import ConnectionClosed

from chat.signal_store import HIDDEN_LOADED, presence_channel
from harness.system import private_system, running_system
from tests.e2e.helpers import connect, mongo_docs, mongo_docs_soon, mysql_rows, post, receive
from tests.timing import PATIENCE, eventually


@pytest.fixture(scope="module")
def prompt(dbs):
    """A system whose users go offline as soon as their last connection ends (no grace), and
    whose dead daemons are found at the shortest timeout."""
    with running_system(dbs, daemons=2, apis=1, writer=True, relay=True, CHAT_RATE_LIMIT_PER_SECOND="0",
                        CHAT_PRESENCE_GRACE_SECONDS="0", CHAT_PRESENCE_DAEMON_TIMEOUT_SECONDS="4",
                        CHAT_TYPING_TTL_SECONDS="2") as s:
        yield s


async def call(system, user: str, method: str, path: str, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(timeout=PATIENCE) as client:
        return await client.request(method, f"{system.api_url}{path}",
                                    headers={"Authorization": f"Bearer {system.token(user)}"}, **kwargs)


async def send(ws, **frame) -> None:
    await ws.send(orjson.dumps(frame).decode())


async def next_of(ws, kind: str) -> dict:
    """The next frame of ``kind`` (messages and receipts of other tests' users never reach these sockets)."""
    while (frame := (await receive(ws, 1))[0])["type"] != kind:
        pass
    return frame


async def presence_of(system, asker: str, *users: str) -> list[dict]:
    r = await call(system, asker, "GET", "/v1/presence", params={"users": ",".join(users)})
    assert r.status_code == 200, r.text
    return r.json()["users"]


async def closed_with(ws) -> int:
    with contextlib.suppress(ConnectionClosed):
        async with asyncio.timeout(PATIENCE):
            while True:
                await ws.recv()
    return ws.close_code


async def test_typing_reaches_the_peer_and_the_typists_other_devices_but_not_itself(system, users):
    alice, bob = users("alice"), users("bob")
    typist, _ = await connect(system, alice)
    other, _ = await connect(system, alice)
    peer, _ = await connect(system, bob)
    await send(typist, type="typing", to=bob)  # `state` left out: start
    await send(typist, type="typing", to=bob, state="stop")
    started = {"type": "typing", "from": alice, "to": bob, "state": "start", "ttl": 5}
    stopped = started | {"state": "stop"}
    assert await receive(peer, 2) == [started, stopped]
    assert await receive(other, 2) == [started, stopped]
    # A barrier for the typist: bob types back after alice's two went through Redis, so anything
    # of alice's own that reached her socket would come first.
    await send(peer, type="typing", to=alice)
    assert await receive(typist, 1) == [{"type": "typing", "from": bob, "to": alice, "state": "start", "ttl": 5}]


async def test_a_resume_replays_no_typing_and_no_signal_is_ever_a_message(system, users):
    alice, bob = users("alice"), users("bob")
    r = await post(system, alice, bob, "first")
    assert r.status_code == 201
    first = r.json()["id"]
    typist, _ = await connect(system, alice)
    peer, _ = await connect(system, bob, since=str(int(first) - 1))
    assert [f["id"] for f in await receive(peer, 1)] == [first]
    await send(typist, type="typing", to=bob)
    assert (await next_of(peer, "typing"))["from"] == alice
    await peer.close()
    await send(typist, type="typing", to=bob, state="stop")
    r = await post(system, alice, bob, "second")
    second = r.json()["id"]
    again, hello = await connect(system, bob, since=str(int(first) - 1))
    assert hello["recovered"] is True
    frames = await receive(again, 2)
    assert [(f["type"], f["id"]) for f in frames] == [("message", first), ("message", second)]
    rows = mysql_rows(system, "(sender = :a AND recipient = :b) OR (sender = :b AND recipient = :a)", a=alice, b=bob)
    assert [r.body for r in rows] == ["first", "second"]  # no typing row
    await mongo_docs_soon(system, {"from": alice}, 2)
    assert sorted(d["body"] for d in mongo_docs(system, {"$or": [{"from": alice}, {"to": alice}]})) == [
        "first", "second"]


async def test_a_waiting_poll_gets_typing_in_its_signals_and_counts_as_online(prompt, users):
    alice, bob = users("alice"), users("bob")
    typist, _ = await connect(prompt, alice)
    await send(typist, type="watch", users=[bob])
    assert (await next_of(typist, "presence"))["users"] == [{"user": bob, "online": False, "last_seen": None}]
    async with httpx.AsyncClient(timeout=PATIENCE + 30) as client:
        polling = asyncio.create_task(client.get(
            prompt.poll_url, params={"timeout": "25"}, headers={"Authorization": f"Bearer {prompt.token(bob)}"}))
        # The poll waiting is bob online; then he is typed to, and the poll answers with it.
        assert await next_of(typist, "presence") == {"type": "presence", "user": bob, "online": True,
                                                     "last_seen": None}
        await send(typist, type="typing", to=bob)
        answer = (await polling).json()
    assert answer["messages"] == []
    assert answer["signals"] == [{"type": "typing", "from": alice, "to": bob, "state": "start", "ttl": 2}]
    offline = await next_of(typist, "presence")
    assert (offline["user"], offline["online"]) == (bob, False) and offline["last_seen"]


async def test_presence_goes_to_watchers_as_it_changes_and_last_seen_is_stored(prompt, users):
    alice, bob, nobody = users("alice"), users("bob"), users("nobody")
    watcher, _ = await connect(prompt, bob)
    await send(watcher, type="watch", users=[alice, nobody, alice])  # a duplicate is watched once
    snapshot = await next_of(watcher, "presence")
    assert snapshot["users"] == [{"user": alice, "online": False, "last_seen": None},
                                 {"user": nobody, "online": False, "last_seen": None}]
    first, _ = await connect(prompt, alice)
    assert await next_of(watcher, "presence") == {"type": "presence", "user": alice, "online": True,
                                                  "last_seen": None}
    second, _ = await connect(prompt, alice)  # a second device: no second "online"
    assert [u["online"] for u in await presence_of(prompt, bob, alice, nobody)] == [True, False]
    await first.close()
    await second.close()
    offline = await next_of(watcher, "presence")
    assert (offline["user"], offline["online"]) == (alice, False)
    last_seen = offline["last_seen"]
    # Stored in MySQL, once, as the watcher was told; and /v1/presence says the same.
    await eventually(lambda: mysql_presence(prompt, alice), "alice's last_seen in MySQL")
    [row] = mysql_presence(prompt, alice)
    assert row.last_seen.isoformat(timespec="milliseconds") + "Z" == last_seen and not row.hidden
    assert await presence_of(prompt, bob, alice) == [{"user": alice, "online": False, "last_seen": last_seen}]
    # A new list replaces the old: alice's changes no longer come.
    await send(watcher, type="watch", users=[nobody])
    assert (await next_of(watcher, "presence"))["users"] == [{"user": nobody, "online": False, "last_seen": None}]
    back, _ = await connect(prompt, alice)
    await connect(prompt, nobody)
    assert (await next_of(watcher, "presence"))["user"] == nobody  # and not alice, who came first
    await back.close()


async def test_a_users_presence_channel_is_held_only_while_one_of_its_watchers_is_connected(prompt, users):
    # Redis sends a change only to the daemons subscribed to the user's channel: a million
    # connects with nobody watching are read by no daemon at all.
    alice, bob, carol = users("alice"), users("bob"), users("carol")
    redis = aioredis.from_url(prompt.dbs.redis.url)

    async def daemons_listening(user: str) -> int:
        [(_, count)] = await redis.pubsub_numsub(presence_channel(user))
        return count

    async def let_go() -> bool:
        return await daemons_listening(alice) == 0

    try:
        assert await daemons_listening(alice) == 0
        first, _ = await connect(prompt, bob)
        await send(first, type="watch", users=[alice])
        await next_of(first, "presence")
        assert await daemons_listening(alice) == 1  # confirmed before the snapshot was read
        second, _ = await connect(prompt, carol)
        await send(second, type="watch", users=[alice])
        await next_of(second, "presence")
        assert await daemons_listening(alice) in (1, 2)  # the same daemon or the other one
        await first.close()
        await second.close()
        await eventually(let_go, "alice's channel let go by every daemon")
    finally:
        await redis.aclose()


def mysql_presence(system, user: str) -> list:
    from tests.e2e.test_receipts import sql
    return sql(system, "SELECT user, last_seen, hidden FROM presence WHERE user = :u AND last_seen IS NOT NULL",
               u=user)


async def test_a_hidden_user_reads_as_offline_and_never_seen(prompt, users):
    alice, bob = users("alice"), users("bob")
    watcher, _ = await connect(prompt, bob)
    await send(watcher, type="watch", users=[alice])
    await next_of(watcher, "presence")
    ws, _ = await connect(prompt, alice)
    assert (await next_of(watcher, "presence"))["online"] is True
    r = await call(prompt, alice, "PUT", "/v1/presence/settings", json={"hidden": True})
    assert (r.status_code, r.json()) == (200, {"hidden": True})
    assert await next_of(watcher, "presence") == {"type": "presence", "user": alice, "online": False,
                                                  "last_seen": None}
    assert await presence_of(prompt, bob, alice) == [{"user": alice, "online": False, "last_seen": None}]
    assert (await call(prompt, alice, "GET", "/v1/presence/settings")).json() == {"hidden": True}
    # Hidden, a user's comings and goings are sent to no one: a second watch shows offline.
    await ws.close()
    again, _ = await connect(prompt, alice)
    await send(watcher, type="watch", users=[alice])
    assert (await next_of(watcher, "presence"))["users"] == [{"user": alice, "online": False, "last_seen": None}]
    r = await call(prompt, alice, "PUT", "/v1/presence/settings", json={"hidden": False})
    assert r.status_code == 200
    assert await next_of(watcher, "presence") == {"type": "presence", "user": alice, "online": True,
                                                  "last_seen": None}
    await again.close()


async def test_bad_frames_get_their_documented_answers(system, users):
    alice = users("alice")
    ws, _ = await connect(system, alice)
    await send(ws, type="shout", to="x")
    assert (await next_of(ws, "error"))["code"] == "unknown_type"
    await send(ws, type="watch", users=[f"u{i}" for i in range(201)])
    error = await next_of(ws, "error")
    assert (error["code"], error["frame"]) == ("watch_too_many", "watch")
    await send(ws, type="watch", users=[])  # the socket is still open and served
    assert (await next_of(ws, "presence"))["users"] == []
    await send(ws, type="typing", to="not a user")
    assert await closed_with(ws) == 1007
    for bad in ({"type": "typing", "to": alice, "state": "maybe"}, {"type": "typing"},
                {"type": "watch", "users": "a,b"}, {"type": "watch", "users": ["ok", "not ok"]}):
        ws, _ = await connect(system, alice)
        await ws.send(orjson.dumps(bad).decode())
        assert await closed_with(ws) == 1007, bad
    ws, _ = await connect(system, alice)
    await send(ws, type="typing", to=alice, pad="x" * 5000)
    assert await closed_with(ws) == 1009
    ws, _ = await connect(system, alice)
    for _ in range(11):  # past CHAT_WS_MAX_FRAMES_PER_SECOND (10): the 11th within the second
        await send(ws, type="typing", to=alice, state="stop")
    assert await closed_with(ws) == 1008


async def test_bad_requests_get_their_documented_answers(system, users):
    alice = users("alice")
    cases = [("POST", "/v1/typing", {"json": {"to": "not a user"}}, 422, "to"),
             ("POST", "/v1/typing", {"json": {"to": alice, "state": "typing"}}, 422, "state"),
             ("POST", "/v1/typing", {"json": {"to": alice, "extra": 1}}, 422, "extra"),
             ("GET", "/v1/presence", {}, 422, "users"),
             ("GET", "/v1/presence", {"params": {"users": ",".join(f"u{i}" for i in range(201))}}, 422, "users"),
             ("GET", "/v1/presence", {"params": {"users": "ok,not ok"}}, 422, "users"),
             ("PUT", "/v1/presence/settings", {"json": {"hidden": "yes"}}, 422, "hidden")]
    for method, path, kwargs, status, field in cases:
        r = await call(system, alice, method, path, **kwargs)
        assert (r.status_code, r.json().get("field")) == (status, field), (method, path, kwargs, r.text)
    async with httpx.AsyncClient() as client:
        r = await client.get(f"{system.api_url}/v1/presence", params={"users": alice})
        assert r.status_code == 401
        headers = {"Authorization": f"Bearer {system.token(alice)}", "Content-Type": "application/json"}
        r = await client.post(f"{system.api_url}/v1/typing", content=b'{"to": ', headers=headers)
        assert (r.status_code, r.json()["error"]) == (400, "malformed_json")
        r = await client.put(f"{system.api_url}/v1/presence/settings", content=b'{"hidden": true' + b" " * 20_000
                             + b"}", headers=headers)
        assert (r.status_code, r.json()["error"]) == (413, "body_too_large")
    r = await call(system, alice, "POST", "/v1/typing", json={"to": users("bob")})
    assert (r.status_code, r.json()) == (202, {"sent": True})


async def test_typing_over_http_reaches_the_peers_socket(system, users):
    alice, bob = users("alice"), users("bob")
    peer, _ = await connect(system, bob)
    r = await call(system, alice, "POST", "/v1/typing", json={"to": bob, "state": "start"})
    assert r.status_code == 202 and r.json()["sent"] is True
    assert await next_of(peer, "typing") == {"type": "typing", "from": alice, "to": bob, "state": "start",
                                             "ttl": 5}


async def test_a_killed_daemons_users_turn_offline_and_delivery_goes_on(dbs, users):
    alice, bob = users("alice"), users("bob")
    with running_system(dbs, daemons=1, apis=1, writer=True, relay=True, CHAT_PRESENCE_GRACE_SECONDS="0",
                        CHAT_PRESENCE_DAEMON_TIMEOUT_SECONDS="4") as s:
        gone, _ = await connect(s, alice)
        s.start("daemon_1")
        s.stop("daemon_0", signal.SIGKILL)  # its sockets die with it; no withdrawal is ever sent
        watcher, _ = await connect(s, bob)  # on the daemon that is left
        await send(watcher, type="watch", users=[alice])
        snapshot = await next_of(watcher, "presence")
        if snapshot["users"][0]["online"]:  # not swept yet: the change is on its way
            change = await next_of(watcher, "presence")
            assert (change["user"], change["online"]) == (alice, False) and change["last_seen"]

        async def offline_and_seen() -> bool:
            [state] = await presence_of(s, bob, alice)
            return state["online"] is False and state["last_seen"] is not None
        await eventually(offline_and_seen, "alice offline, her last_seen stored by the daemon that swept")
        r = await post(s, alice, bob, "still delivered")
        assert r.status_code == 201
        assert (await next_of(watcher, "message"))["body"] == "still delivered"
        with contextlib.suppress(ConnectionClosed):
            await gone.close()


@pytest.fixture
def redis_of_its_own(tmp_path):
    """A system on databases and a Redis of its own, which the test kills (started outside the
    test's event loop: laying out a new store runs one of its own)."""
    with private_system(tmp_path, daemons=1, writer=True, relay=True) as s:
        yield s


async def test_with_redis_away_messages_flow_and_signals_say_unavailable(redis_of_its_own, users):
    alice, bob, carol = users("alice"), users("bob"), users("carol")
    s = redis_of_its_own
    peer, _ = await connect(s, bob)
    await send(peer, type="watch", users=[carol])
    await next_of(peer, "presence")
    typist, _ = await connect(s, alice)
    await send(typist, type="typing", to=bob)
    assert (await next_of(peer, "typing"))["from"] == alice  # Redis is up: it is carried
    assert s.dbs.redis is not None
    s.dbs.redis.stop(signal.SIGKILL)
    log = s.logdir / "daemon_0.log"
    await eventually(lambda: "event=redis_unreachable" in log.read_text(), "the daemon sees Redis gone")
    await send(typist, type="typing", to=bob, state="stop")
    error = await next_of(typist, "error")
    assert (error["code"], error["frame"]) == ("signals_unavailable", "typing")
    r = await post(s, alice, bob, "no Redis needed")
    assert r.status_code == 201
    assert (await next_of(peer, "message"))["body"] == "no Redis needed"
    r = await call(s, alice, "GET", "/v1/presence", params={"users": bob})
    assert (r.status_code, r.json()["error"]) == (503, "signals_unavailable")

    # Redis back (empty): the daemon subscribes again to what its connections still watch,
    # and the watch list bob sent before it went is served without being sent again.
    s.dbs.redis.start()
    await eventually(lambda: log.read_text().count("event=typing_listening") == 2, "the daemon listening again")
    redis = aioredis.from_url(s.dbs.redis.url)
    try:
        # No change is published until the hidden users are loaded again: wait for it, not for a time.
        await eventually(lambda: redis.exists(HIDDEN_LOADED), "the hidden users loaded into the new Redis")
        assert (await redis.pubsub_numsub(presence_channel(carol)))[0][1] == 1
    finally:
        await redis.aclose()
    await connect(s, carol)
    assert await next_of(peer, "presence") == {"type": "presence", "user": carol, "online": True, "last_seen": None}


async def test_typing_over_http_to_ever_new_peers_meets_the_senders_rate_limit(dbs, users):
    alice = users("alice")
    with running_system(dbs, daemons=0, apis=1, CHAT_RATE_LIMIT_PER_SECOND="0.01", CHAT_RATE_LIMIT_BURST="2") as s:
        answers = [await call(s, alice, "POST", "/v1/typing", json={"to": users(f"peer{i}")}) for i in range(3)]
        assert [r.status_code for r in answers] == [202, 202, 429]  # each a new peer: the gate passes them all
        assert answers[2].json()["error"] == "rate_limited" and int(answers[2].headers["Retry-After"]) >= 1
