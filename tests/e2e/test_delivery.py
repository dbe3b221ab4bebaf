"""Delivery guarantees seen by real WebSocket and long-poll clients:
exactly once, in order, on every device, with catch-up and resume points."""

import asyncio

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.helpers import connect, nothing_more, post, receive
from harness.system import running_system
from tests.timing import PATIENCE, eventually

LONGEST_POLL = 30  # the longest wait a poll may ask for (CHAT_POLL_MAX_TIMEOUT_SECONDS): it answers on a message


async def test_concurrent_senders_every_device_gets_each_message_once_in_order(system, users):
    bob = users("bob")
    senders = [users(f"s{i}") for i in range(5)]
    per_sender = 20
    bob_phone, _ = await connect(system, bob)
    bob_laptop, _ = await connect(system, bob)
    s0_other_device, _ = await connect(system, senders[0])
    try:
        async def send_all(sender):
            async with httpx.AsyncClient(timeout=PATIENCE) as c:
                for i in range(per_sender):  # each sender waits for its 201: that is send order
                    r = await post(system, sender, bob, f"{sender}:{i}", client=c)
                    assert r.status_code == 201

        await asyncio.gather(*(send_all(s) for s in senders))
        total = len(senders) * per_sender
        for earlier_markers, device in enumerate((bob_phone, bob_laptop)):
            frames = await receive(device, total)
            assert len({f["id"] for f in frames}) == total  # no duplicate
            ids = [int(f["id"]) for f in frames]
            assert ids == sorted(ids)
            for s in senders:  # per-conversation send order
                assert [f["body"] for f in frames if f["from"] == s] == [f"{s}:{i}" for i in range(per_sender)]
            # nothing more but the marker bob's other device posted before
            assert [f["body"] for f in await nothing_more(system, device, bob)] == ["marker"] * earlier_markers
        mine = await receive(s0_other_device, per_sender)
        assert [f["body"] for f in mine] == [f"{senders[0]}:{i}" for i in range(per_sender)]
    finally:
        for ws in (bob_phone, bob_laptop, s0_other_device):
            await ws.close()


async def test_reconnect_with_since_gets_exactly_what_was_missed_then_live(system, users):
    alice, bob = users("alice"), users("bob")
    ws, _ = await connect(system, bob)
    for i in range(3):
        await post(system, alice, bob, f"a{i}")
    got = await receive(ws, 3)
    await ws.close()
    for i in range(3, 8):  # sent while bob is away
        await post(system, alice, bob, f"a{i}")
    ws, hello = await connect(system, bob, since=got[-1]["id"])
    try:
        assert hello["recovered"] is True
        missed = await receive(ws, 5)
        assert [f["body"] for f in missed] == [f"a{i}" for i in range(3, 8)]
        await post(system, alice, bob, "live")
        [live] = await receive(ws, 1)
        assert live["body"] == "live"
        assert await nothing_more(system, ws, bob) == []
    finally:
        await ws.close()


async def test_client_that_never_received_anything_resumes_from_the_hello_cursor(system, users):
    alice, bob = users("alice"), users("bob")
    ws, hello = await connect(system, bob)
    assert hello["recovered"] is False  # no since given
    await ws.close()
    for i in range(4):
        await post(system, alice, bob, f"b{i}")
    ws, hello2 = await connect(system, bob, since=hello["cursor"])
    try:
        assert hello2["recovered"] is True
        assert [f["body"] for f in await receive(ws, 4)] == [f"b{i}" for i in range(4)]
        assert await nothing_more(system, ws, bob) == []
    finally:
        await ws.close()


async def test_messages_that_commit_while_catch_up_runs_are_not_lost(system, users):
    alice, bob = users("alice"), users("bob")
    first = (await post(system, alice, bob, "c0")).json()["id"]
    stored = [0]

    async def keep_sending():
        async with httpx.AsyncClient(timeout=PATIENCE) as c:
            for i in range(1, 40):
                assert (await post(system, alice, bob, f"c{i}", client=c)).status_code == 201
                stored[0] = i

    sender = asyncio.create_task(keep_sending())
    sockets = []
    try:
        for after in (1, 8, 16, 24, 32):  # reconnect repeatedly while messages commit: each after the n-th 201
            await eventually(lambda after=after: stored[0] >= after, f"message c{after} stored")
            ws, _ = await connect(system, bob, since=first)
            sockets.append(ws)
        await sender
        for earlier_markers, ws in enumerate(sockets):
            frames = await receive(ws, 39)
            assert [f["body"] for f in frames] == [f"c{i}" for i in range(1, 40)]
            # nothing more but the markers of bob's sockets checked before this one
            assert [f["body"] for f in await nothing_more(system, ws, bob)] == ["marker"] * earlier_markers
    finally:
        for ws in sockets:
            await ws.close()


async def test_unknown_since_says_recovered_false_and_serves_from_the_cursor(system, users):
    alice = users("alice")
    for since in ("not-an-id", "99999999999"):  # garbage, and an id no message has
        bob = users(f"bob{len(since)}")  # nothing earlier addressed to this one
        ws, hello = await connect(system, bob, since=since)
        assert hello["recovered"] is False
        sent = (await post(system, alice, bob, f"after {since}")).json()
        assert [f["id"] for f in await receive(ws, 1)] == [sent["id"]]
        await ws.close()


def polls_waiting(system) -> float:
    """The polls held by whichever daemon answers (the port is shared: a new connection each time)."""
    text = httpx.get(f"http://127.0.0.1:{system.daemon_port}/metrics", timeout=PATIENCE).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "chat_daemon_connections" and s.labels.get("kind") == "poll")


async def test_long_poll_answers_at_once_waits_for_new_and_times_out_empty(system, users):
    alice, bob = users("alice"), users("bob")
    headers = {"Authorization": f"Bearer {system.token(bob)}"}
    async with httpx.AsyncClient(timeout=PATIENCE + LONGEST_POLL) as c:
        start = (await c.get(system.poll_url, params={"timeout": 0}, headers=headers)).json()
        assert start["messages"] == [] and start["recovered"] is False
        await post(system, alice, bob, "p0")
        got = (await c.get(system.poll_url, params={"since": start["cursor"], "timeout": LONGEST_POLL},
                           headers=headers)).json()
        assert [m["body"] for m in got["messages"]] == ["p0"] and got["recovered"] is True

        waiting = asyncio.create_task(c.get(system.poll_url, params={"since": got["cursor"],
                                                                     "timeout": LONGEST_POLL}, headers=headers))
        await eventually(lambda: polls_waiting(system) >= 1, "a daemon holds the poll")  # no other test polls now
        assert not waiting.done()
        await post(system, alice, bob, "p1")
        woke = (await waiting).json()
        assert [m["body"] for m in woke["messages"]] == ["p1"]

        empty = await c.get(system.poll_url, params={"since": woke["cursor"], "timeout": 0.5}, headers=headers)
        assert empty.status_code == 200 and empty.json()["messages"] == []
        bad = await c.get(system.poll_url, params={"timeout": 31}, headers=headers)
        assert bad.status_code == 422
        assert (await c.get(system.poll_url)).status_code == 401


async def test_poll_and_websocket_see_the_same_stream(system, users):
    alice, bob = users("alice"), users("bob")
    ws, hello = await connect(system, bob)
    try:
        ids = [(await post(system, alice, bob, f"x{i}")).json()["id"] for i in range(3)]
        assert [f["id"] for f in await receive(ws, 3)] == ids
        # A poll may reach the other daemon, a few ms behind this one: like any
        # client, follow the cursor until the stream has caught up.
        got, cursor = [], hello["cursor"]
        async with asyncio.timeout(PATIENCE):
            while len(got) < len(ids):
                r = httpx.get(system.poll_url, params={"since": cursor, "timeout": 2}, timeout=PATIENCE,
                              headers={"Authorization": f"Bearer {system.token(bob)}"})
                page = orjson.loads(r.content)
                got += [m["id"] for m in page["messages"]]
                cursor = page["cursor"]
        assert got == ids
    finally:
        await ws.close()


async def daemon_at(system, position: int) -> None:
    def there() -> bool:
        return int(httpx.get(f"http://127.0.0.1:{system.daemon_port}/healthz", timeout=PATIENCE)
                   .json()["position"]) >= position
    await eventually(there, f"the daemon's stream at {position}")


async def test_poll_answers_are_capped_and_the_cursor_pages_through_the_rest(dbs, users):
    with running_system(dbs, daemons=1, apis=1, CHAT_POLL_MAX_MESSAGES=5, CHAT_RATE_LIMIT_PER_SECOND=0) as s:
        alice, bob = users("alice"), users("bob")
        headers = {"Authorization": f"Bearer {s.token(bob)}"}
        cursor = start = httpx.get(s.poll_url, params={"timeout": 0}, headers=headers).json()["cursor"]
        ids = [(await post(s, alice, bob, f"n{i}")).json()["id"] for i in range(12)]
        await daemon_at(s, int(ids[-1]))  # the daemon holds all 12 before the first poll
        pages = []
        async with asyncio.timeout(PATIENCE):
            while sum(pages, []) != ids:
                page = httpx.get(s.poll_url, params={"since": cursor, "timeout": 2}, headers=headers,
                                 timeout=PATIENCE).json()
                assert len(page["messages"]) <= 5
                pages.append([m["id"] for m in page["messages"]])
                cursor = page["cursor"]
        assert [len(p) for p in pages] == [5, 5, 2]

        # A client may ask for smaller pages (`limit`, up to the cap). The last
        # page holds exactly `limit`: its cursor is the position, and nothing follows.
        cursor, pages = start, []
        for _ in range(5):
            page = httpx.get(s.poll_url, params={"since": cursor, "timeout": 0, "limit": 4}, headers=headers).json()
            pages.append([m["id"] for m in page["messages"]])
            cursor = page["cursor"]
        assert pages == [ids[0:4], ids[4:8], ids[8:12], [], []]
        for bad in ("0", "6", "x", "²", "1" * 5000):
            r = httpx.get(s.poll_url, params={"since": start, "timeout": 0, "limit": bad}, headers=headers)
            assert r.status_code == 422 and "`limit`" in r.json()["message"] and r.json()["field"] == "limit", bad
        # A `since` that is no number is an unknown since, not a server error.
        for unknown in ("²", "9" * 19):  # 19 digits, past BSON's widest integer: no lookup can hold it
            r = httpx.get(s.poll_url, params={"since": unknown, "timeout": 0}, headers=headers)
            assert r.status_code == 200 and r.json()["recovered"] is False, unknown


async def test_a_poll_answer_is_capped_in_bytes_and_the_cursor_pages_through_the_rest(system, users):
    """An answer holds about CHAT_SEND_BUFFER_MAX_BYTES (256 KiB) of messages at
    most, one message at least: 30 messages of 12 KB come in two answers, each
    once, in order, and the first answer's cursor is its own last message."""
    alice, bob = users("alice"), users("bob")
    headers = {"Authorization": f"Bearer {system.token(bob)}"}
    start = httpx.get(system.poll_url, params={"timeout": 0}, headers=headers).json()["cursor"]
    ids = [(await post(system, alice, bob, f"{i:02d}" + "€" * 3998)).json()["id"] for i in range(30)]
    positions: dict[int, int] = {}

    def both_daemons_hold_them() -> bool:  # a new connection each time: either daemon may answer
        health = httpx.get(f"http://127.0.0.1:{system.daemon_port}/healthz", timeout=PATIENCE).json()
        positions[health["pid"]] = int(health["position"])
        return len(positions) == 2 and min(positions.values()) >= int(ids[-1])

    await eventually(both_daemons_hold_them, "both daemons hold all 30 before the first poll")
    answers, cursor = [], start
    while sum((a["messages"] for a in answers), []) == [] or answers[-1]["messages"]:
        r = httpx.get(system.poll_url, params={"since": cursor, "timeout": 0}, headers=headers)
        answers.append(r.json())
        cursor = answers[-1]["cursor"]
        assert len(r.content) < 256 * 1024 + 13_000 and len(answers) < 5
    got = [m["id"] for a in answers for m in a["messages"]]
    assert got == ids
    first = answers[0]["messages"]
    assert 0 < len(first) < 30 and answers[0]["cursor"] == first[-1]["id"]
